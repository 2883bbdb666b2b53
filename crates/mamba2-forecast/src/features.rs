//! What the forecaster's Mamba reads at each row, computed from the past alone, the same way in
//! training windows, in `predict` over a whole history and in `stream` row by row.
//!
//! Each predicted series is a sequence of its own (channel independence). At row `t` its input
//! is the value normalised by the mean and standard deviation of the last `norm_window` rows
//! seen so far (fewer at the start of a history), the phases of the calendar cycles as sines and
//! cosines, and the other input columns normalised the same way. The forecast is made relative
//! to the last value, in units of that standard deviation, so that a zero head is the Repeat
//! forecast. Nothing here looks ahead, so a value, once computed for a row, never changes.

use std::collections::VecDeque;
use std::mem::MaybeUninit;

use burn::tensor::Element;
use rayon::prelude::*;

use mamba2_data::calendar::Calendar;
use mamba2_model::ModelError;

/// Added to the rolling variance before the square root, as RevIN does.
pub const STD_EPS: f64 = 1e-5;

/// Mean and standard deviation of the last `window` values pushed.
///
/// The running sums are recomputed exactly from the kept values every `window` pushes, so that
/// their rounding does not grow over a long stream.
#[derive(Debug, Clone)]
pub struct RollingStats {
    window: usize,
    kept: VecDeque<f64>,
    sum: f64,
    sum_sq: f64,
    since_exact: usize,
}

impl RollingStats {
    /// Empty statistics over the last `window` values (`window >= 1`).
    pub fn new(window: usize) -> Self {
        Self { window: window.max(1), kept: VecDeque::with_capacity(window.max(1)), sum: 0.0, sum_sq: 0.0, since_exact: 0 }
    }

    /// Adds `x`; returns the mean and the standard deviation (population, plus [`STD_EPS`]
    /// under the root) of the values kept after it.
    pub fn push(&mut self, x: f64) -> (f64, f64) {
        if self.kept.len() == self.window {
            let old = self.kept.pop_front().expect("window >= 1");
            self.sum -= old;
            self.sum_sq -= old * old;
        }
        self.kept.push_back(x);
        self.since_exact += 1;
        if self.since_exact >= self.window {
            self.sum = self.kept.iter().sum();
            self.sum_sq = self.kept.iter().map(|v| v * v).sum();
            self.since_exact = 0;
        } else {
            self.sum += x;
            self.sum_sq += x * x;
        }
        let n = self.kept.len() as f64;
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        (mean, (var + STD_EPS).sqrt())
    }
}

impl RollingStats {
    /// Appends the kept values and the running sums to `out`, bit for bit.
    pub(crate) fn save(&self, out: &mut Vec<u8>) {
        crate::codec::put_f64s(out, self.kept.iter().copied());
        crate::codec::put_f64(out, self.sum);
        crate::codec::put_f64(out, self.sum_sq);
        crate::codec::put_u64(out, self.since_exact as u64);
    }

    /// Reads what [`save`](Self::save) wrote for statistics of the same window.
    pub(crate) fn restore(&mut self, r: &mut crate::codec::Reader) -> Result<(), String> {
        let kept = r.f64s_up_to(self.window, "a rolling window")?;
        let (sum, sum_sq) = (r.f64("a rolling sum")?, r.f64("a rolling sum")?);
        let since = r.u64("a rolling window")?;
        if since >= self.window as u64 {
            return Err(format!("a rolling window was summed {since} rows ago, its window is {}", self.window));
        }
        self.kept = kept.into();
        (self.sum, self.sum_sq, self.since_exact) = (sum, sum_sq, since as usize);
        Ok(())
    }

    /// Bytes this holds on the heap.
    fn heap_bytes(&self) -> usize {
        self.kept.capacity() * 8
    }
}

/// How the per-row inputs are made: which columns, which normalisation, which calendar.
#[derive(Debug, Clone)]
pub struct FeatureMap {
    /// Column of each predicted series among the input columns.
    pub targets: Vec<usize>,
    /// The other input columns, read as covariates by every series.
    pub covariates: Vec<usize>,
    /// Covariates whose values are known ahead (future covariates), among `covariates`: at each
    /// row the series also read their next `horizon` values, normalised by the column's rolling
    /// statistics at the row, so that the direct map and the head see the inputs of the rows
    /// they forecast. A row's inputs then need the `horizon` rows after it.
    pub future: Vec<usize>,
    /// Each target's own covariates (a panel's series each read their own id's columns), read
    /// like `covariates` after them, and ahead where they are in `future`; every target has as
    /// many, in the same order. Empty: none.
    pub own: Vec<Vec<usize>>,
    /// Each target's static inputs (its sector, its market: [`mamba2_data::statics`]), read
    /// as they are by every row of it, after its own covariates; every target has as many.
    /// Empty: none.
    pub statics: Vec<Vec<f64>>,
    /// Rows the rolling statistics cover.
    pub norm_window: usize,
    /// Values of the series' own past each row's input holds (itself and the `patch - 1` rows
    /// before it, repeating the oldest row seen where the history is shorter).
    pub patch: usize,
    /// Divide by the rolling standard deviation (else only the rolling mean is removed, and the
    /// forecast is in the data's scaled units).
    pub scale: bool,
    /// The calendar, whose cycles' phases become inputs.
    pub calendar: Option<Calendar>,
    /// Length of the learned cycle of each series (0: none).
    pub cycle_period: usize,
    /// Forecast steps.
    pub horizon: usize,
    /// End each row's input with the series' one-hot code, so that the input projection learns a
    /// vector per series (an embedding, without a broadcast over the rows).
    pub series_code: bool,
    /// The series each target is, among the model's `n_series`: its place in the one-hot code
    /// and its rows of the learned cycle. `0..targets.len()` for a model's own map; a map of
    /// some of its series ([`FeatureMap::only`]) keeps theirs.
    pub series: Vec<usize>,
    /// Series the model knows (the one-hot code's length).
    pub n_series: usize,
}

/// Inputs and forecast references of a set of sequences, flattened row-major, ready to become
/// tensors. Sequence `w * T + c` is series `c` of history `w`. The inputs are in the element
/// type of the backend they are for (written once, not converted after); the references stay in
/// f64.
#[derive(Debug, Clone, Default)]
pub struct HostBatch<E> {
    /// Sequences.
    pub n_seq: usize,
    /// Rows per sequence.
    pub len: usize,
    /// Inputs per row.
    pub n_feat: usize,
    /// `[n_seq, len, n_feat]`.
    pub inputs: Vec<E>,
    /// Forecast positions per sequence: the last row and, going back `every` rows at a time,
    /// `n_pos - 1` more.
    pub n_pos: usize,
    /// See `n_pos`.
    pub every: usize,
    /// The last value at each forecast position, `[n_seq, n_pos]`.
    pub level: Vec<f64>,
    /// The rolling standard deviation there (1 without scaling), `[n_seq, n_pos]`.
    pub scale: Vec<f64>,
    /// `series * period + phase` of each forecast position, `[n_seq, n_pos]`, for the learned
    /// cycle (the steps ahead follow from the phase).
    pub cycle_now: Vec<i64>,
    /// The values that followed each forecast position, `[n_seq, n_pos, H]`, where known and
    /// built with [`Truth::Values`].
    pub truth: Vec<f64>,
    /// Each sequence's values after its first row, `[n_seq, len + H - 1]`, where known and built
    /// with [`Truth::Relative`]: the `H` values that followed the forecast position at row `t`
    /// are those from `t` on.
    pub ahead: Vec<f64>,
}

/// How [`FeatureMap::build`] keeps the values that followed each forecast position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    /// As they are, in f64 ([`HostBatch::truth`]): what evaluation compares forecasts with.
    Values,
    /// Once per sequence ([`HostBatch::ahead`]), since the forecast positions' values overlap:
    /// what training fits, each position's values minus its level. At the default shape that is
    /// 0.3 MB written, where the positions' values, each `H` of them, would be 8 MB.
    Relative,
}

/// What one row gives each series besides its inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowRef {
    /// The series' value at the row: the forecast's reference.
    pub level: f64,
    /// The rolling standard deviation (1 without scaling): the forecast's unit.
    pub scale: f64,
    /// `series * period + phase`, for the learned cycle (0 without one).
    pub cycle_row: i64,
}

/// The normalisers of one history, advanced a row at a time: the single place where a row's
/// inputs are computed, for training windows, whole histories and streams alike.
#[derive(Debug, Clone)]
pub struct RowEncoder {
    map: FeatureMap,
    targets: Vec<RollingStats>,
    covariates: Vec<RollingStats>,
    /// Each target's own covariates' statistics ([`FeatureMap::own`]).
    own: Vec<Vec<RollingStats>>,
    /// The last `patch` values of each series, newest first: the patch's own order, so that it
    /// is written by forward loops over the deque's two slices.
    recent: Vec<VecDeque<f64>>,
    /// The row's inputs that every series shares (calendar, covariates), kept to be reused.
    shared: Vec<f64>,
    /// One series' own covariates' inputs at the row, kept to be reused.
    own_inputs: Vec<f64>,
    /// Whether each shared covariate, and each of each target's own, is known ahead: looked up
    /// once here, not in [`FeatureMap::future`] for every row.
    future_shared: Vec<bool>,
    future_own: Vec<Vec<bool>>,
    /// [`FeatureMap::n_feat`], counted once.
    n_feat: usize,
    /// The sine and cosine of every phase of each calendar period (empty for a period too long
    /// to tabulate): a training batch reads them for every row of every history, and a table
    /// lookup gives the same values as computing them each time.
    phases: std::sync::Arc<[Vec<(f64, f64)>]>,
}

/// Calendar periods up to this many rows have their phases' sines and cosines tabulated.
const PHASE_TABLE_MAX: usize = 1 << 14;

/// The sine and cosine of the angle of `phase` in a cycle of `period` rows.
fn phase_angle(phase: usize, period: usize) -> (f64, f64) {
    (std::f64::consts::TAU * phase as f64 / period as f64).sin_cos()
}

impl RowEncoder {
    /// A history with no rows yet.
    pub fn new(map: &FeatureMap) -> Self {
        Self {
            targets: map.targets.iter().map(|_| RollingStats::new(map.norm_window)).collect(),
            covariates: map.covariates.iter().map(|_| RollingStats::new(map.norm_window)).collect(),
            own: map.own.iter().map(|cols| cols.iter().map(|_| RollingStats::new(map.norm_window)).collect()).collect(),
            recent: map.targets.iter().map(|_| VecDeque::with_capacity(map.patch)).collect(),
            shared: Vec::with_capacity(map.n_feat()),
            own_inputs: Vec::new(),
            future_shared: map.covariates.iter().map(|j| map.future.contains(j)).collect(),
            future_own: map.own.iter().map(|cols| cols.iter().map(|j| map.future.contains(j)).collect()).collect(),
            n_feat: map.n_feat(),
            phases: map
                .calendar
                .iter()
                .flat_map(|c| &c.periods)
                .map(
                    |&period| {
                        if period <= PHASE_TABLE_MAX {
                            (0..period).map(|phase| phase_angle(phase, period)).collect()
                        } else {
                            Vec::new()
                        }
                    },
                )
                .collect(),
            map: map.clone(),
        }
    }

    /// The map this encoder follows.
    pub fn map(&self) -> &FeatureMap {
        &self.map
    }

    /// Appends what the encoder has seen (its rolling statistics and patches) to `out`.
    pub(crate) fn save(&self, out: &mut Vec<u8>) {
        for st in self.targets.iter().chain(&self.covariates).chain(self.own.iter().flatten()) {
            st.save(out);
        }
        for recent in &self.recent {
            crate::codec::put_f64s(out, recent.iter().copied());
        }
    }

    /// Reads what [`save`](Self::save) wrote for an encoder of the same map.
    pub(crate) fn restore(&mut self, r: &mut crate::codec::Reader) -> Result<(), String> {
        for st in self.targets.iter_mut().chain(&mut self.covariates).chain(self.own.iter_mut().flatten()) {
            st.restore(r)?;
        }
        for recent in &mut self.recent {
            *recent = r.f64s_up_to(self.map.patch, "a patch")?.into();
        }
        Ok(())
    }

    /// Bytes this holds on the heap (the map's few indices aside).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.targets.iter().chain(&self.covariates).chain(self.own.iter().flatten()).map(RollingStats::heap_bytes).sum::<usize>()
            + self.recent.iter().map(|r| r.capacity() * 8).sum::<usize>()
            + (self.shared.capacity() + self.own_inputs.capacity()) * 8
            + self.future_shared.capacity()
            + self.future_own.iter().map(Vec::capacity).sum::<usize>()
    }

    /// Adds one row (all input columns, scaled) at calendar clock `clock`. Writes each series'
    /// inputs (`n_feat` values per series, series after series) into `inputs`, and its
    /// references into `refs`.
    ///
    /// `ahead` holds the `horizon` rows after this one when the map reads future covariates
    /// (only their future columns are read), and may be empty otherwise.
    ///
    /// # Panics
    /// When the map reads future covariates and `ahead` holds fewer than `horizon` rows.
    pub fn push(&mut self, row: &[f64], ahead: &[Vec<f64>], clock: i64, inputs: &mut [f64], refs: &mut [RowRef]) {
        let f_n = self.n_feat;
        // SAFETY: `MaybeUninit<f64>` has the layout of `f64`, and `push_strided` writes only
        // initialised values through the view.
        let view = unsafe { &mut *(inputs as *mut [f64] as *mut [MaybeUninit<f64>]) };
        self.push_strided(row, ahead, clock, view, f_n, refs);
    }

    /// [`push`](Self::push) with series `c`'s inputs written at `inputs[c * stride..]` in the
    /// element type `E`: training windows write each row straight into its place in the batch,
    /// which needs no zero fill first, since all `n_feat` values of each series are written.
    pub(crate) fn push_strided<E: Element>(
        &mut self,
        row: &[f64],
        ahead: &[Vec<f64>],
        clock: i64,
        inputs: &mut [MaybeUninit<E>],
        stride: usize,
        refs: &mut [RowRef],
    ) {
        let m = &self.map;
        let f_n = self.n_feat;
        let t_n = m.targets.len();
        let shared = &mut self.shared;
        shared.clear();
        if let Some(cal) = &m.calendar {
            for (k, table) in self.phases.iter().enumerate() {
                let phase = cal.phase(clock, k);
                let (sin, cos) = table.get(phase).copied().unwrap_or_else(|| phase_angle(phase, cal.periods[k]));
                shared.push(sin);
                shared.push(cos);
            }
        }
        for ((&j, st), &future) in m.covariates.iter().zip(self.covariates.iter_mut()).zip(&self.future_shared) {
            push_covariate(st, j, future, row, ahead, m, shared);
        }
        for (c, (&j, st)) in m.targets.iter().zip(self.targets.iter_mut()).enumerate() {
            let x = row[j];
            let (mean, sd) = st.push(x);
            let sd = if m.scale { sd } else { 1.0 };
            let recent = &mut self.recent[c];
            if recent.len() == m.patch {
                recent.pop_back();
            }
            recent.push_front(x);
            let out = &mut inputs[c * stride..c * stride + f_n];
            // Newest first; before the history's first row, its first row again.
            let (newer, older) = recent.as_slices();
            // One division per row, not one per value.
            let inv = 1.0 / sd;
            let (patch, rest) = out[..m.patch].split_at_mut(newer.len());
            centered(patch, newer, mean, inv);
            let (patch, rest) = rest.split_at_mut(older.len());
            centered(patch, older, mean, inv);
            let oldest = recent.back().copied().unwrap_or(x);
            rest.fill(MaybeUninit::new(E::from_elem((oldest - mean) * inv)));
            let own = &mut self.own_inputs;
            own.clear();
            if let (Some(cols), Some(stats), Some(future)) = (m.own.get(c), self.own.get_mut(c), self.future_own.get(c)) {
                for ((&j, st), &future) in cols.iter().zip(stats.iter_mut()).zip(future) {
                    push_covariate(st, j, future, row, ahead, m, own);
                }
            }
            let statics = m.statics.get(c).map_or(&[][..], Vec::as_slice);
            let at = m.patch + shared.len() + own.len() + statics.len();
            for (o, &v) in out[m.patch..at].iter_mut().zip(shared.iter()) {
                *o = MaybeUninit::new(E::from_elem(v));
            }
            for (o, &v) in out[m.patch + shared.len()..at].iter_mut().zip(own.iter().chain(statics)) {
                *o = MaybeUninit::new(E::from_elem(v));
            }
            // The code, when there is one, fills the row to its end; without one the patch and
            // the shared and own inputs already do: every value of `out` is written.
            let code = &mut out[at..];
            assert!(m.series_code || code.is_empty(), "push: {} of a row's {f_n} inputs not written", code.len());
            let series = m.series[c];
            if m.series_code {
                code.fill(MaybeUninit::new(E::from_elem(0.0)));
                code[series] = MaybeUninit::new(E::from_elem(1.0));
            }
            let cycle_row = if m.cycle_period > 0 { (series * m.cycle_period) as i64 + clock.rem_euclid(m.cycle_period as i64) } else { 0 };
            refs[c] = RowRef { level: x, scale: sd, cycle_row };
        }
        debug_assert_eq!(refs.len(), t_n);
    }
}

/// Appends covariate `j`'s value at `row`, normalised by its rolling statistics `st`, and when
/// it is `future` (known ahead) its values at the map's `horizon` rows `ahead`, normalised at
/// this row the same way: a shared covariate and a series' own are encoded alike.
///
/// # Panics
/// When the covariate is known ahead and `ahead` holds fewer than `horizon` rows.
fn push_covariate(st: &mut RollingStats, j: usize, future: bool, row: &[f64], ahead: &[Vec<f64>], m: &FeatureMap, out: &mut Vec<f64>) {
    let (mean, sd) = st.push(row[j]);
    let sd = if m.scale { sd } else { 1.0 };
    out.push((row[j] - mean) / sd);
    if future {
        assert!(ahead.len() >= m.horizon, "push: a future covariate needs the {} rows ahead, got {}", m.horizon, ahead.len());
        out.extend(ahead[..m.horizon].iter().map(|r| (r[j] - mean) / sd));
    }
}

/// `out[i] = (src[i] - mean) * inv` in the element type: a row's patch, most of what a batch
/// writes. It is also compiled for AVX2 and AVX-512 and chosen at run time, since the default
/// target's SSE2 converts two values per instruction.
fn centered<E: Element>(out: &mut [MaybeUninit<E>], src: &[f64], mean: f64, inv: f64) {
    #[inline(always)]
    fn body<E: Element>(out: &mut [MaybeUninit<E>], src: &[f64], mean: f64, inv: f64) {
        for (o, &v) in out.iter_mut().zip(src) {
            *o = MaybeUninit::new(E::from_elem((v - mean) * inv));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn avx512<E: Element>(out: &mut [MaybeUninit<E>], src: &[f64], mean: f64, inv: f64) {
            body(out, src, mean, inv)
        }
        #[target_feature(enable = "avx2")]
        fn avx2<E: Element>(out: &mut [MaybeUninit<E>], src: &[f64], mean: f64, inv: f64) {
            body(out, src, mean, inv)
        }
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has just been found to support the enabled feature.
            return unsafe { avx512(out, src, mean, inv) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { avx2(out, src, mean, inv) };
        }
    }
    body(out, src, mean, inv)
}

impl FeatureMap {
    /// Inputs per row.
    pub fn n_feat(&self) -> usize {
        let code = if self.series_code { self.n_series } else { 0 };
        let width = |j: &usize| if self.future.contains(j) { 1 + self.horizon } else { 1 };
        self.patch
            + 2 * self.calendar.as_ref().map_or(0, |c| c.periods.len())
            + self.covariates.iter().map(width).sum::<usize>()
            + self.own.first().map_or(0, |cols| cols.iter().map(width).sum())
            + self.statics.first().map_or(0, Vec::len)
            + code
    }

    /// Values a row holds: every column this map reads, by position.
    pub fn row_width(&self) -> usize {
        self.targets.iter().chain(&self.covariates).chain(self.own.iter().flatten()).max().map_or(0, |&m| m + 1)
    }

    /// This map for the targets at positions `keep` alone, each still the series it is.
    pub fn only(&self, keep: &[usize]) -> FeatureMap {
        FeatureMap {
            targets: keep.iter().map(|&t| self.targets[t]).collect(),
            series: keep.iter().map(|&t| self.series[t]).collect(),
            own: if self.own.is_empty() { Vec::new() } else { keep.iter().map(|&t| self.own[t].clone()).collect() },
            statics: if self.statics.is_empty() { Vec::new() } else { keep.iter().map(|&t| self.statics[t].clone()).collect() },
            ..self.clone()
        }
    }

    /// This map for the target at position `t` alone, read from rows that hold just its value
    /// (column 0) and then its own covariates (columns 1, 2 ...): a panel's series as its own
    /// stream or history.
    ///
    /// # Errors
    /// [`ModelError::State`] when there is no target `t`, or the map reads shared covariates,
    /// which such rows lack.
    pub fn alone(&self, t: usize) -> Result<FeatureMap, ModelError> {
        if t >= self.targets.len() {
            return Err(ModelError::State { why: format!("series {t} of a model of {} series", self.targets.len()) });
        }
        if !self.covariates.is_empty() {
            return Err(ModelError::State {
                why: "a series alone: the model reads covariates, which rows of one series do not hold".into(),
            });
        }
        let own = self.own.get(t).cloned().unwrap_or_default();
        Ok(FeatureMap {
            targets: vec![0],
            series: vec![self.series[t]],
            future: own.iter().enumerate().filter(|(_, j)| self.future.contains(j)).map(|(i, _)| i + 1).collect(),
            own: if self.own.is_empty() { Vec::new() } else { vec![(1..=own.len()).collect()] },
            statics: self.statics.get(t).map_or(Vec::new(), |v| vec![v.clone()]),
            ..self.clone()
        })
    }

    /// The sequences of the histories `rows[s .. s + len]` for each start `s` (each history
    /// from a fresh [`RowEncoder`]), with `n_pos` forecast positions: the last row and one every
    /// `every` rows before it; and the values that followed them where `rows` has them all.
    ///
    /// `clock` holds each row's calendar clock (used only with a calendar); `truth_as` says how
    /// the values that followed are kept.
    #[allow(clippy::too_many_arguments)]
    pub fn build<E: Element>(
        &self,
        rows: &[Vec<f64>],
        clock: &[i64],
        starts: &[usize],
        len: usize,
        n_pos: usize,
        every: usize,
        truth_as: Truth,
    ) -> HostBatch<E> {
        self.build_present(rows, clock, starts, None, len, n_pos, every, truth_as)
    }

    /// [`build`](Self::build) where history `i` holds only the targets at positions
    /// `present[i]` (in order), as a panel's windows do: a series missing some of a window's
    /// values has no sequence there. `None`: every target of every history.
    #[allow(clippy::too_many_arguments)]
    pub fn build_present<E: Element>(
        &self,
        rows: &[Vec<f64>],
        clock: &[i64],
        starts: &[usize],
        present: Option<&[Vec<usize>]>,
        len: usize,
        n_pos: usize,
        every: usize,
        truth_as: Truth,
    ) -> HostBatch<E> {
        let (f_n, h) = (self.n_feat(), self.horizon);
        let every = every.max(1);
        let n_pos = n_pos.min((len - 1) / every + 1);
        // Each history's map: this one, or the part of it for the targets it holds.
        let maps: Vec<Option<FeatureMap>> = match present {
            Some(p) => {
                assert_eq!(p.len(), starts.len(), "build: one set of targets per history");
                p.iter().map(|keep| (keep.len() != self.targets.len()).then(|| self.only(keep))).collect()
            }
            None => vec![None; starts.len()],
        };
        let t_of = |m: &Option<FeatureMap>| m.as_ref().map_or(self.targets.len(), |m| m.targets.len());
        let n_seq: usize = maps.iter().map(t_of).sum();
        let with_truth = starts.iter().all(|&s| s + len - 1 + h < rows.len());
        // With future covariates, each row's inputs read the `H` rows after it: the rows after
        // a history must be there (they are a window's truth, or `predict`'s rows ahead).
        assert!(self.future.is_empty() || with_truth, "build: future covariates need the {h} rows after each history");
        let cycled = self.cycle_period > 0;
        let (absolute, relative) = (with_truth && truth_as == Truth::Values, with_truth && truth_as == Truth::Relative);
        let n_inputs = n_seq * len * f_n;
        let mut b = HostBatch {
            n_seq,
            len,
            n_feat: f_n,
            n_pos,
            every,
            // The large buffer (9 MB at the default shape) is written piece by piece below, each
            // value once, with no zero fill first (a quarter of the build's time).
            inputs: Vec::with_capacity(n_inputs),
            level: vec![0.0; n_seq * n_pos],
            scale: vec![0.0; n_seq * n_pos],
            // Filled in pieces below whether or not they are wanted, and emptied after when not.
            cycle_now: vec![0; n_seq * n_pos],
            truth: vec![0.0; if absolute { n_seq * n_pos * h } else { n_seq }],
            ahead: vec![0.0; if relative { n_seq * (len + h - 1) } else { n_seq }],
        };
        let written = std::sync::atomic::AtomicUsize::new(0);
        let prototype = RowEncoder::new(self);
        // Each history's sequences are disjoint pieces of every buffer, cut here in order and
        // filled in parallel.
        let mut pieces = Vec::with_capacity(starts.len());
        {
            let mut inputs = &mut b.inputs.spare_capacity_mut()[..n_inputs];
            let (mut level, mut scale, mut cycle_now) = (&mut b.level[..], &mut b.scale[..], &mut b.cycle_now[..]);
            let (mut truth, mut ahead) = (&mut b.truth[..], &mut b.ahead[..]);
            for (&s, map) in starts.iter().zip(&maps) {
                let t_n = t_of(map);
                let i;
                (i, inputs) = std::mem::take(&mut inputs).split_at_mut(t_n * len * f_n);
                let (l, sc, cy);
                (l, level) = std::mem::take(&mut level).split_at_mut(t_n * n_pos);
                (sc, scale) = std::mem::take(&mut scale).split_at_mut(t_n * n_pos);
                (cy, cycle_now) = std::mem::take(&mut cycle_now).split_at_mut(t_n * n_pos);
                let (tr, ah);
                (tr, truth) = std::mem::take(&mut truth).split_at_mut(if absolute { t_n * n_pos * h } else { t_n });
                (ah, ahead) = std::mem::take(&mut ahead).split_at_mut(if relative { t_n * (len + h - 1) } else { t_n });
                pieces.push((i, l, sc, cy, tr, ah, s, map.as_ref()));
            }
        }
        pieces.into_par_iter().for_each(|(inputs, level, scale, cycle_now, truth, piece_ahead, s, map)| {
            let map = map.unwrap_or(self);
            let t_n = map.targets.len();
            // Inputs written into this piece, checked against its length.
            let mut count = 0;
            let mut refs = vec![RowRef { level: 0.0, scale: 1.0, cycle_row: 0 }; t_n];
            let mut enc = if t_n == self.targets.len() { prototype.clone() } else { RowEncoder::new(map) };
            // Each target's values after the history, in one slice: the truth of every forecast
            // position is then a copy, not `H` lookups through the rows.
            let ahead: Vec<Vec<f64>> = if with_truth {
                map.targets.iter().map(|&j| rows[s + 1..s + len + h].iter().map(|row| row[j]).collect()).collect()
            } else {
                Vec::new()
            };
            if relative {
                for (o, a) in piece_ahead.chunks_mut(len + h - 1).zip(&ahead) {
                    o.copy_from_slice(a);
                }
            }
            for p in 0..len {
                let r = s + p;
                let next_rows = if self.future.is_empty() { &[][..] } else { &rows[r + 1..r + 1 + h] };
                enc.push_strided(&rows[r], next_rows, clock[r], &mut inputs[p * f_n..], len * f_n, &mut refs);
                count += t_n * f_n;
                for c in 0..t_n {
                    let back = len - 1 - p;
                    if !back.is_multiple_of(every) || back / every >= n_pos {
                        continue;
                    }
                    let q = c * n_pos + (n_pos - 1 - back / every);
                    level[q] = refs[c].level;
                    scale[q] = refs[c].scale;
                    cycle_now[q] = refs[c].cycle_row;
                    if absolute {
                        truth[q * h..(q + 1) * h].copy_from_slice(&ahead[c][p..p + h]);
                    }
                }
            }
            // A piece is written at distinct places (rows, series), so a count equal to its
            // length means every value of it was written.
            assert_eq!(count, inputs.len(), "build: a piece of the inputs was not written");
            written.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        });
        // Every piece was written in full by exactly one task.
        assert_eq!(written.into_inner(), n_inputs, "build: a piece of the inputs was not written");
        // SAFETY: the pieces above cover the first `n_inputs` elements of the buffer's capacity,
        // and each piece was found written in full.
        unsafe {
            b.inputs.set_len(n_inputs);
        }
        if !cycled {
            b.cycle_now.clear();
        }
        if !absolute {
            b.truth.clear();
        }
        if !relative {
            b.ahead.clear();
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rolling statistics equal a direct computation over the last `window` values, far into
    /// a long stream (where the running sums have been refreshed many times).
    #[test]
    fn rolling_stats_equal_a_direct_computation() {
        let mut rng = mamba2_tensor::rng::SplitMix64::new(5);
        let xs: Vec<f64> = (0..5000).map(|i| 1e3 * (i as f64 * 0.01).sin() + rng.normal()).collect();
        let mut st = RollingStats::new(96);
        for (i, &x) in xs.iter().enumerate() {
            let (m, sd) = st.push(x);
            let w = &xs[i.saturating_sub(95)..=i];
            let em = w.iter().sum::<f64>() / w.len() as f64;
            let ev = w.iter().map(|v| (v - em).powi(2)).sum::<f64>() / w.len() as f64;
            assert!((m - em).abs() <= 1e-9 * em.abs().max(1.0), "row {i}: mean {m} vs {em}");
            assert!((sd - (ev + STD_EPS).sqrt()).abs() <= 1e-6 * sd, "row {i}: std {sd} vs {}", (ev + STD_EPS).sqrt());
        }
    }

    /// A history's inputs at its last row do not depend on how far back it starts beyond the
    /// normaliser's window, and forecast references are the last value and the window's std.
    #[test]
    fn inputs_depend_only_on_the_window_of_the_past() {
        let rows: Vec<Vec<f64>> = (0..60).map(|t| vec![(t as f64 * 0.3).sin() * 2.0 + t as f64 * 0.1, (t % 5) as f64]).collect();
        let clock: Vec<i64> = (0..60).collect();
        let cal = Calendar { interval: 3600, periods: vec![24, 168] };
        let map = FeatureMap {
            targets: vec![0],
            covariates: vec![1],
            future: vec![],
            own: vec![],
            statics: vec![],
            norm_window: 8,
            patch: 1,
            scale: true,
            calendar: Some(cal),
            cycle_period: 24,
            horizon: 3,
            series_code: false,
            series: vec![0],
            n_series: 1,
        };
        let a = map.build::<f64>(&rows, &clock, &[10], 40, 1, 1, Truth::Values);
        let b = map.build::<f64>(&rows, &clock, &[30], 20, 1, 1, Truth::Values);
        assert_eq!(a.n_feat, 6);
        let last = |hb: &HostBatch<f64>| hb.inputs[(hb.len - 1) * hb.n_feat..hb.len * hb.n_feat].to_vec();
        for (x, y) in last(&a).iter().zip(last(&b)) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
        assert_eq!(a.level, [rows[49][0]]);
        assert_eq!(a.truth, [rows[50][0], rows[51][0], rows[52][0]]);
        assert_eq!(a.cycle_now, [49 % 24]);
        let (_, sd) = (42..49)
            .fold(RollingStats::new(8), |mut s, r| {
                s.push(rows[r][0]);
                s
            })
            .push(rows[49][0]);
        assert!((a.scale[0] - sd).abs() < 1e-12);
        // A history that ends at the data's last row has no truth.
        assert!(map.build::<f64>(&rows, &clock, &[40], 20, 1, 1, Truth::Values).truth.is_empty());
        // Several histories at once give what each gives alone, in order.
        let both = map.build::<f64>(&rows, &clock, &[10, 30], 20, 2, 1, Truth::Values);
        let (x, y) = (
            map.build::<f64>(&rows, &clock, &[10], 20, 2, 1, Truth::Values),
            map.build::<f64>(&rows, &clock, &[30], 20, 2, 1, Truth::Values),
        );
        assert_eq!(both.inputs, [x.inputs, y.inputs].concat());
        assert_eq!(both.truth, [x.truth, y.truth].concat());
        assert_eq!(both.cycle_now, [x.cycle_now, y.cycle_now].concat());
        // Built for training, the same batch holds each sequence's values after its first row
        // once, where every forecast position's values are found from its row on, and the same
        // inputs (here with positions 2 rows apart).
        let vals = map.build::<f64>(&rows, &clock, &[10, 30], 20, 3, 2, Truth::Values);
        let rel = map.build::<f64>(&rows, &clock, &[10, 30], 20, 3, 2, Truth::Relative);
        assert!(rel.truth.is_empty() && vals.ahead.is_empty());
        assert_eq!(rel.ahead.len(), 2 * (20 + 3 - 1));
        for (q, want) in vals.truth.chunks(3).enumerate() {
            let (seq, row) = (q / 3, 19 - (2 - q % 3) * 2);
            assert_eq!(&rel.ahead[seq * 22 + row..][..3], want, "position {q}");
        }
        assert_eq!((rel.inputs, rel.level, rel.scale, rel.cycle_now), (vals.inputs, vals.level, vals.scale, vals.cycle_now));
        assert!(map.build::<f64>(&rows, &clock, &[40], 20, 1, 1, Truth::Relative).ahead.is_empty());
    }

    /// A future covariate adds its next `H` values to each row's inputs, normalised by the
    /// column's rolling statistics at the row (right after its own value), and nothing else
    /// changes: the same rows with the future values changed give the same inputs but those.
    #[test]
    fn a_future_covariate_adds_its_next_values_normalised_at_the_row() {
        let rows: Vec<Vec<f64>> = (0..40).map(|t| vec![(t as f64 * 0.3).sin(), (t as f64 * 0.7).cos() * 3.0 + 1.0]).collect();
        let clock: Vec<i64> = (0..40).collect();
        let past = FeatureMap {
            targets: vec![0],
            covariates: vec![1],
            future: vec![],
            own: vec![],
            statics: vec![],
            norm_window: 6,
            patch: 2,
            scale: true,
            calendar: None,
            cycle_period: 0,
            horizon: 3,
            series_code: false,
            series: vec![0],
            n_series: 1,
        };
        let ahead = FeatureMap { future: vec![1], ..past.clone() };
        assert_eq!((past.n_feat(), ahead.n_feat()), (3, 6));
        let (a, b) = (
            past.build::<f64>(&rows, &clock, &[4], 20, 1, 1, Truth::Values),
            ahead.build::<f64>(&rows, &clock, &[4], 20, 1, 1, Truth::Values),
        );
        let mut st = RollingStats::new(6);
        for p in 0..20 {
            let r = 4 + p;
            let (mean, sd) = st.push(rows[r][1]);
            let (x, y) = (&a.inputs[p * 3..p * 3 + 3], &b.inputs[p * 6..p * 6 + 6]);
            assert_eq!(x, &y[..3], "row {p}: the inputs without the values ahead");
            for k in 0..3 {
                let want = (rows[r + 1 + k][1] - mean) / sd;
                assert!((y[3 + k] - want).abs() < 1e-12, "row {p}, step {k}: {} vs {want}", y[3 + k]);
            }
        }
        assert_eq!(a.truth, b.truth);
    }

    /// Histories holding some of the targets (a panel's windows) give, each, what the map of
    /// those targets alone gives, every series keeping its own static inputs, code and cycle
    /// rows; and a series read alone from rows of its value equals it read from the whole rows.
    #[test]
    fn histories_of_some_series_keep_each_series_code_and_cycle() {
        let rows: Vec<Vec<f64>> = (0..80).map(|t| (0..3).map(|c| ((t + 7 * c) as f64 * 0.4).sin() + c as f64).collect()).collect();
        let clock: Vec<i64> = (0..80).collect();
        let map = FeatureMap {
            targets: vec![0, 1, 2],
            covariates: vec![],
            future: vec![],
            own: vec![],
            statics: vec![vec![1.5, -1.0], vec![0.0, 2.0], vec![-0.5, 0.25]],
            norm_window: 8,
            patch: 4,
            scale: true,
            calendar: Some(Calendar { interval: 3600, periods: vec![24, 168] }),
            cycle_period: 24,
            horizon: 3,
            series_code: true,
            series: vec![0, 1, 2],
            n_series: 3,
        };
        let present = vec![vec![0, 1, 2], vec![2], vec![0, 2]];
        let starts = [5, 20, 40];
        let both = map.build_present::<f64>(&rows, &clock, &starts, Some(&present), 16, 2, 3, Truth::Values);
        assert_eq!(both.n_seq, 6);
        let each: Vec<HostBatch<f64>> = starts
            .iter()
            .zip(&present)
            .map(|(&s, keep)| map.only(keep).build::<f64>(&rows, &clock, &[s], 16, 2, 3, Truth::Values))
            .collect();
        assert_eq!(both.inputs, each.iter().flat_map(|b| b.inputs.clone()).collect::<Vec<_>>());
        assert_eq!(both.truth, each.iter().flat_map(|b| b.truth.clone()).collect::<Vec<_>>());
        assert_eq!(both.cycle_now, each.iter().flat_map(|b| b.cycle_now.clone()).collect::<Vec<_>>());
        // The second history's one sequence is series 2: every row ends with its static inputs
        // and its code with the third entry set, and its cycle rows are the third block of 24.
        let f = both.n_feat;
        assert_eq!(f, 4 + 4 + 2 + 3);
        let seq3 = &both.inputs[3 * 16 * f..4 * 16 * f];
        for row in seq3.chunks(f) {
            assert_eq!(&row[f - 5..f], [-0.5, 0.25, 0.0, 0.0, 1.0]);
        }
        assert!(both.cycle_now[3 * 2..4 * 2].iter().all(|&r| (48..72).contains(&r)));
        let alone = map.alone(2).unwrap();
        let own: Vec<Vec<f64>> = rows.iter().map(|r| vec![r[2]]).collect();
        let a = alone.build::<f64>(&own, &clock, &[20], 16, 2, 3, Truth::Values);
        assert_eq!((a.inputs, a.truth, a.cycle_now), (each[1].inputs.clone(), each[1].truth.clone(), each[1].cycle_now.clone()));
    }
}
