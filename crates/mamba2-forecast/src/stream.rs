//! Tick-by-tick forecasting: one forecast per incoming row from the recurrent state, with work
//! per row that does not depend on how long the history is.

use burn::prelude::*;
use mamba2_model::{HostFloat, ModelError, StreamingStack, StreamingState};

use mamba2_data::quantile::Intervals;

use std::collections::HashMap;
use std::sync::Arc;

use num_traits::ToPrimitive;

use crate::codec::{fnv1a64, put_f64s, put_u64, Reader, FNV_START};
use crate::features::{FeatureMap, RowEncoder, RowRef};
use crate::forecaster::Forecaster;

/// What every stream of one model reads and none changes: the stack's and the heads' weights
/// on the host, and the calibrated intervals. Streams of the same model share one copy.
#[derive(Debug, Clone)]
struct Weights<T: HostFloat> {
    stack: StreamingStack<T>,
    /// `[n_feat, d_model]` and its bias.
    input_w: Vec<f64>,
    input_b: Option<Vec<f64>>,
    /// `[d_model, H]`.
    head_w: Vec<f64>,
    /// `[n_feat, H]`, for the direct map.
    direct_w: Option<Vec<f64>>,
    /// `[T * period, H]`, the learned cycle's steps ahead.
    cycle: Option<Vec<f64>>,
    n_feat: usize,
    d_model: usize,
    horizon: usize,
    /// The calibrated intervals, which read each target's recent values for their local scale.
    intervals: Option<Intervals>,
    /// A hash of the model and the intervals, which a saved state must carry to be restored.
    fingerprint: u64,
    /// The model's map of all its targets, and each target's place by name: a panel's series
    /// streams alone ([`ForecastStream::of_series`]).
    map: FeatureMap,
    names: HashMap<String, usize>,
    panel: bool,
    /// The future covariates' names, for errors.
    future: Vec<String>,
}

/// A trained [`Forecaster`] on the host, advanced one row at a time: the rolling statistics,
/// the stack's recurrent state (in `T`) and the heads. After the rows of a history it gives what
/// [`Forecaster::forecast_history`] gives for them.
///
/// The weights are shared: a [`clone`](Clone::clone) or a [`fresh`](Self::fresh) stream copies
/// only the state of a series (see [`StreamBank`](crate::StreamBank) for many series).
#[derive(Debug, Clone)]
pub struct ForecastStream<T: HostFloat> {
    weights: Arc<Weights<T>>,
    encoder: RowEncoder,
    state: StreamingState<T>,
    inputs: Vec<f64>,
    refs: Vec<RowRef>,
    u: Vec<T>,
    hidden: Vec<T>,
    /// Each target's recent values, for the intervals' local scale.
    recent: Vec<Vec<f64>>,
    /// The model's place of each target this stream forecasts (all of them, or one series).
    positions: Vec<usize>,
    /// Rows pushed, and the clock of the last.
    rows: u64,
    last_clock: Option<i64>,
    /// Rows announced ahead ([`ForecastStream::announce`]) by clock, in order: the values of
    /// the future covariates for rows after the last pushed.
    announced: std::collections::VecDeque<(i64, Vec<f64>)>,
}

/// Rows a stream keeps announced ahead, beyond its horizon: a feed that announces without
/// pushing is stopped before it holds unbounded memory.
const ANNOUNCED_SLACK: usize = 4096;

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    mamba2_tensor::compare::to_f64_vec(t)
}

/// Hashes every float parameter of a module, bit for bit, in visiting order.
struct WeightHash(u64);

impl<B: Backend> burn::module::ModuleVisitor<B> for WeightHash {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
        let t = param.val();
        self.0 = fnv1a64(self.0, format!("{:?}", t.dims()).as_bytes());
        for v in host(t) {
            self.0 = fnv1a64(self.0, &v.to_bits().to_le_bytes());
        }
    }
}

/// A hash of what a stream's forecasts depend on: the spec, every weight bit for bit, and the
/// host type its state is kept in.
fn fingerprint<B: Backend, T: HostFloat>(model: &Forecaster<B>) -> u64 {
    let spec = serde_json::to_vec(model.spec()).expect("a spec serialises");
    let mut h = WeightHash(fnv1a64(FNV_START, &spec));
    h.0 = fnv1a64(h.0, &(std::mem::size_of::<T>() as u64).to_le_bytes());
    burn::module::Module::visit(model, &mut h);
    h.0
}

impl<T: HostFloat> ForecastStream<T> {
    /// A stream at the start of a history.
    pub fn new<B: Backend>(model: &Forecaster<B>) -> Self {
        let map = model.feature_map();
        let stack = StreamingStack::new(&model.mamba.backbone);
        let weights = Weights {
            n_feat: map.n_feat(),
            d_model: model.mamba.config().d_model,
            horizon: model.spec().horizon,
            stack,
            input_w: host(model.mamba.input_proj.weight.val()),
            input_b: model.mamba.input_proj.bias.as_ref().map(|b| host(b.val())),
            head_w: host(model.mamba.output_proj.weight.val()),
            direct_w: model.direct.as_ref().map(|d| host(d.weight.val())),
            cycle: model.cycle_table().map(host),
            intervals: None,
            fingerprint: fingerprint::<B, T>(model),
            names: model.spec().targets.iter().enumerate().map(|(t, n)| (n.clone(), t)).collect(),
            panel: model.spec().panel.is_some(),
            // A panel's series streams alone, its rows holding its own covariates by name.
            future: model.spec().series_future(),
            map: map.clone(),
        };
        let positions = (0..map.targets.len()).collect();
        Self::start(Arc::new(weights), RowEncoder::new(&map), positions, true)
    }

    /// A stream of the same model for its target at position `t` alone, at the start of a
    /// history: each row holds just that series' value. The stream of one series of a model
    /// trained on a panel ([`ForecastSpec::panel`](crate::ForecastSpec::panel)), equal to
    /// [`Forecaster::forecast_series`] over the same rows.
    ///
    /// # Errors
    /// [`ModelError::State`] when the model reads covariates (such rows lack them) or has no
    /// target `t`.
    pub fn of_series(&self, t: usize) -> Result<Self, ModelError> {
        let map = self.weights.map.alone(t)?;
        Ok(Self::start(self.weights.clone(), RowEncoder::new(&map), vec![t], self.state.has_helper()))
    }

    /// The place among the model's targets of the series named `name`, for a model trained on a
    /// panel (where the targets are its ids); `None` for an unknown name or another model.
    pub fn series_index(&self, name: &str) -> Option<usize> {
        self.weights.panel.then(|| self.weights.names.get(name).copied()).flatten()
    }

    /// Whether the model was trained on a panel: its targets are the panel's ids.
    pub fn is_panel(&self) -> bool {
        self.weights.panel
    }

    /// The model's targets (a panel's series).
    pub fn n_series(&self) -> usize {
        self.weights.map.targets.len()
    }

    fn start(weights: Arc<Weights<T>>, encoder: RowEncoder, positions: Vec<usize>, helper: bool) -> Self {
        let t_n = encoder.map().targets.len();
        let d = weights.d_model;
        let state = weights.stack.zero_state(t_n);
        let state = if helper { state } else { state.with_helper(false) };
        Self {
            inputs: vec![0.0; t_n * weights.n_feat],
            refs: vec![RowRef { level: 0.0, scale: 1.0, cycle_row: 0 }; t_n],
            u: vec![T::zero(); t_n * d],
            hidden: vec![T::zero(); t_n * d],
            encoder,
            state,
            recent: vec![Vec::new(); t_n],
            positions,
            rows: 0,
            last_clock: None,
            announced: std::collections::VecDeque::new(),
            weights,
        }
    }

    /// A stream of the same model (sharing its weights and intervals) at the start of a
    /// history. `helper`: whether its state may start a helper thread for large stacks
    /// ([`StreamingState::with_helper`]); a bank of many series keeps one thread.
    pub fn fresh(&self, helper: bool) -> Self {
        Self::start(self.weights.clone(), RowEncoder::new(self.encoder.map()), self.positions.clone(), helper)
    }

    /// Rows pushed since the start of the history.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The clock of the last row pushed.
    pub fn last_clock(&self) -> Option<i64> {
        self.last_clock
    }

    /// A hash of the model, its intervals and the host type: states saved by a stream restore
    /// only into a stream of the same fingerprint.
    pub fn fingerprint(&self) -> u64 {
        self.weights.fingerprint
    }

    /// Bytes of this series' own state on the heap (the shared weights not counted).
    pub fn state_bytes(&self) -> usize {
        let t = std::mem::size_of::<T>();
        self.state.heap_bytes()
            + self.encoder.heap_bytes()
            + self.inputs.capacity() * 8
            + self.refs.capacity() * std::mem::size_of::<RowRef>()
            + (self.u.capacity() + self.hidden.capacity()) * t
            + self.recent.iter().map(|r| r.capacity() * 8).sum::<usize>()
            + self.announced.iter().map(|(_, r)| r.capacity() * 8 + 16).sum::<usize>()
    }

    /// Appends this series' state to `out`: every value the next forecasts depend on, bit for
    /// bit (the scratch space aside).
    pub fn save_state(&self, out: &mut Vec<u8>) {
        put_u64(out, self.rows);
        put_u64(out, self.last_clock.is_some() as u64);
        put_u64(out, self.last_clock.unwrap_or(0) as u64);
        self.encoder.save(out);
        for layer in 0..self.state.n_layer() {
            for values in [self.state.conv(layer), self.state.ssm(layer)] {
                put_f64s(out, values.iter().map(|v| ToPrimitive::to_f64(v).expect("a float converts")));
            }
        }
        for recent in &self.recent {
            put_f64s(out, recent.iter().copied());
        }
        // Only a model with future covariates keeps rows ahead: other states keep their format.
        if !self.encoder.map().future.is_empty() {
            put_u64(out, self.announced.len() as u64);
            for (clock, row) in &self.announced {
                put_u64(out, *clock as u64);
                put_f64s(out, row.iter().copied());
            }
        }
    }

    /// This stream, after a stream of the same model saved `bytes` with
    /// [`save_state`](Self::save_state), continues exactly as that one would.
    ///
    /// # Errors
    /// A sentence saying what does not fit, when `bytes` is cut short or was saved by another
    /// model.
    pub fn restore_state(&mut self, bytes: &[u8]) -> Result<(), String> {
        let mut r = Reader::new(bytes);
        self.restore_from(&mut r)?;
        if !r.at_end() {
            return Err("bytes left after the state".into());
        }
        Ok(())
    }

    pub(crate) fn restore_from(&mut self, r: &mut Reader) -> Result<(), String> {
        let mut next = self.fresh(self.state.has_helper());
        next.rows = r.u64("the row count")?;
        let has_clock = r.u64("the last clock")?;
        let clock = r.u64("the last clock")? as i64;
        next.last_clock = match has_clock {
            0 => None,
            1 => Some(clock),
            other => return Err(format!("the last clock's flag is {other}, not 0 or 1")),
        };
        next.encoder.restore(r)?;
        for layer in 0..next.state.n_layer() {
            let conv = r.f64s_exact(next.state.conv(layer).len(), "a convolution state")?;
            let ssm = r.f64s_exact(next.state.ssm(layer).len(), "a scan state")?;
            let cast = |dst: &mut [T], src: Vec<f64>| -> Result<(), String> {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = <T as num_traits::NumCast>::from(s).ok_or("a state value does not fit the host type")?;
                }
                Ok(())
            };
            cast(next.state.conv_mut(layer), conv)?;
            cast(next.state.ssm_mut(layer), ssm)?;
        }
        let keep = self.weights.intervals.as_ref().map_or(0, |iv| 2 * iv.memory().max(1) + 64);
        for recent in &mut next.recent {
            *recent = r.f64s_up_to(keep, "the recent values")?;
        }
        if !next.encoder.map().future.is_empty() {
            let n = r.u64("the rows ahead")?;
            if n > (next.weights.horizon + ANNOUNCED_SLACK) as u64 {
                return Err(format!("{n} rows ahead, at most {}", next.weights.horizon + ANNOUNCED_SLACK));
            }
            let width = self.row_width();
            for _ in 0..n {
                let clock = r.u64("a row ahead's clock")? as i64;
                let row = r.f64s_exact(width, "a row ahead")?;
                if next.announced.back().is_some_and(|(c, _)| *c >= clock) {
                    return Err("the rows ahead are not in the order of their clocks".into());
                }
                next.announced.push_back((clock, row));
            }
        }
        *self = next;
        Ok(())
    }

    /// The same stream, also keeping what [`ForecastStream::quantiles`] needs (each target's
    /// last `intervals.memory()` values: 8 bytes each per target).
    ///
    /// # Errors
    /// [`ModelError::State`] when the intervals were made for another number of targets or
    /// steps.
    pub fn with_intervals(mut self, intervals: Intervals) -> Result<Self, ModelError> {
        intervals.check(self.weights.map.targets.len(), self.weights.horizon).map_err(|why| ModelError::State { why })?;
        let json = serde_json::to_vec(&intervals).expect("intervals serialise");
        let w = Arc::make_mut(&mut self.weights);
        w.fingerprint = fnv1a64(w.fingerprint, &json);
        w.intervals = Some(intervals);
        Ok(self)
    }

    /// The quantiles, `[H, n_targets, levels]` row-major in the scaled units, of the point
    /// forecast `point` that the last [`ForecastStream::push`] returned; `None` without
    /// intervals.
    pub fn quantiles(&self, point: &[f64]) -> Option<Vec<f64>> {
        let iv = self.weights.intervals.as_ref()?;
        Some(iv.quantiles_at(&self.positions, point, |c| &self.recent[c]))
    }

    /// Adds one row (every input column, scaled as in training) at calendar clock `clock` and
    /// returns the forecast of the next `H` rows after it, `[H, n_targets]` row-major, in the
    /// scaled units of the data.
    ///
    /// # Errors
    /// [`ModelError::State`] when `row` does not hold every input column;
    /// [`ModelError::Input`] when the model reads future covariates and fewer than `H` rows
    /// were [announced](Self::announce) after `clock`.
    pub fn push(&mut self, row: &[f64], clock: i64) -> Result<Vec<f64>, ModelError> {
        if self.encoder.map().future.is_empty() {
            return self.push_ahead(row, &[], clock);
        }
        // The rows ahead of this one are those announced after its clock.
        while self.announced.front().is_some_and(|(c, _)| *c <= clock) {
            self.announced.pop_front();
        }
        let h = self.weights.horizon;
        if self.announced.len() < h {
            return Err(ModelError::Input {
                why: format!(
                    "the model reads the future covariates ({}) at the {h} rows after this one; {} rows ahead of it were announced \
                     (send each row's known values, its targets empty, before the row it follows)",
                    self.weights.future.join(", "),
                    self.announced.len()
                ),
            });
        }
        let ahead: Vec<Vec<f64>> = self.announced.iter().take(h).map(|(_, r)| r.clone()).collect();
        self.push_ahead(row, &ahead, clock)
    }

    /// Values a row holds: every input column of the model, by position.
    fn row_width(&self) -> usize {
        self.encoder.map().row_width()
    }

    /// Announces a row ahead at clock `clock`, for a model that reads future covariates: its
    /// future columns hold the values known in advance (the others are not read, and may be
    /// NaN). [`push`](Self::push) of a row reads the `H` rows announced after its clock, as
    /// [`push_ahead`](Self::push_ahead) reads them given. A row announced again at the same
    /// clock replaces the earlier one (a revised forecast of a load, say). Returns `false`, with
    /// nothing changed, for a row dated at or before the last pushed row (a feed replayed from
    /// before a saved state).
    ///
    /// # Errors
    /// [`ModelError::Input`] when the model reads no future covariates, `row` lacks a future
    /// value, or more than `H + 4096` rows are announced ahead; [`ModelError::State`] when
    /// `row` does not hold every input column.
    pub fn announce(&mut self, row: &[f64], clock: i64) -> Result<bool, ModelError> {
        let map = self.encoder.map();
        if map.future.is_empty() {
            return Err(ModelError::Input { why: "a row ahead: the model reads no future covariates".into() });
        }
        let want = self.row_width();
        if row.len() < want {
            return Err(ModelError::State { why: format!("a row needs {want} values, got {}", row.len()) });
        }
        for (&j, name) in map.future.iter().zip(&self.weights.future) {
            if !row[j].is_finite() {
                return Err(ModelError::Input { why: format!("a row ahead without a value of the future covariate `{name}`") });
            }
        }
        if self.last_clock.is_some_and(|last| clock <= last) {
            return Ok(false);
        }
        let at = self.announced.partition_point(|(c, _)| *c < clock);
        match self.announced.get_mut(at) {
            Some((c, r)) if *c == clock => *r = row[..want].to_vec(),
            _ => {
                let most = self.weights.horizon + ANNOUNCED_SLACK;
                if self.announced.len() >= most {
                    return Err(ModelError::Input { why: format!(
                            "{most} rows already announced ahead of the last row, the most a stream holds (H {} + {ANNOUNCED_SLACK}); push rows before announcing more",
                            self.weights.horizon
                        ) });
                }
                self.announced.insert(at, (clock, row[..want].to_vec()));
            }
        }
        Ok(true)
    }

    /// [`push`](Self::push) for a model that reads future covariates
    /// ([`ForecastSpec::future`](crate::ForecastSpec::future)): `ahead` holds the `H` rows after
    /// this one, of which only the future columns are read. What
    /// [`Forecaster::forecast_history_ahead`] gives after the same rows.
    ///
    /// # Errors
    /// As [`push`](Self::push), and [`ModelError::Input`] when `ahead` lacks a future value
    /// the model reads.
    pub fn push_ahead(&mut self, row: &[f64], ahead: &[Vec<f64>], clock: i64) -> Result<Vec<f64>, ModelError> {
        let map = self.encoder.map();
        let want = map.row_width();
        if row.len() < want || ahead.iter().take(map.horizon).any(|r| r.len() < want) {
            return Err(ModelError::State { why: format!("a row needs {want} values, got {}", row.len()) });
        }
        crate::forecaster::check_ahead(map, &self.weights.future, ahead)?;
        self.encoder.push(row, ahead, clock, &mut self.inputs, &mut self.refs);
        self.rows += 1;
        self.last_clock = Some(clock);
        let w = &*self.weights;
        if let Some(iv) = &w.intervals {
            // Trimmed in bulk, so that keeping the last values costs O(1) per row.
            let keep = iv.memory().max(1);
            for (recent, &j) in self.recent.iter_mut().zip(&self.encoder.map().targets) {
                recent.push(row[j]);
                if recent.len() >= 2 * keep + 64 {
                    recent.drain(..recent.len() - keep);
                }
            }
        }
        let (f, d, h) = (w.n_feat, w.d_model, w.horizon);
        let t_n = self.refs.len();
        for c in 0..t_n {
            let x = &self.inputs[c * f..(c + 1) * f];
            for o in 0..d {
                let mut acc = w.input_b.as_ref().map_or(0.0, |b| b[o]);
                for (i, &v) in x.iter().enumerate() {
                    acc += v * w.input_w[i * d + o];
                }
                self.u[c * d + o] = <T as num_traits::NumCast>::from(acc).expect("finite");
            }
        }
        w.stack.step(&mut self.state, &self.u, &mut self.hidden)?;
        let mut y = vec![0.0; h * t_n];
        let mut out = vec![0.0; h];
        for c in 0..t_n {
            out.fill(0.0);
            for i in 0..d {
                let v: f64 = num_traits::ToPrimitive::to_f64(&self.hidden[c * d + i]).expect("finite");
                for (o, w) in out.iter_mut().zip(&w.head_w[i * h..(i + 1) * h]) {
                    *o += v * w;
                }
            }
            if let Some(dw) = &w.direct_w {
                for (i, &v) in self.inputs[c * f..(c + 1) * f].iter().enumerate() {
                    for (o, w) in out.iter_mut().zip(&dw[i * h..(i + 1) * h]) {
                        *o += v * w;
                    }
                }
            }
            let r = self.refs[c];
            for k in 0..h {
                // As Forecaster::forward: (heads * scale + cycle) + level.
                let cycle = w.cycle.as_ref().map_or(0.0, |q| q[r.cycle_row as usize * h + k]);
                y[k * t_n + c] = (out[k] * r.scale + cycle) + r.level;
            }
        }
        Ok(y)
    }
}
