//! Forecast quantiles from calibrated errors (split conformal prediction), and the figures that
//! judge them: coverage of each central interval, its width, and the pinball loss.
//!
//! A forecast's quantile at level `q`, `h` steps ahead, is `point + s * z(q, h)`: `z` is the
//! empirical `q`-quantile of the errors `(actual - point) / s` on the validation split, and `s`
//! is a local scale known when the forecast is made (how much the series moved over its last
//! rows, or 1). Quantiles are per step, since errors grow with the step; per target or pooled
//! over the targets. Which scale, window and grouping a run uses is chosen on validation alone,
//! by the candidates' pinball loss in a blocked cross-validation over its windows
//! ([`choose_intervals`]).
//!
//! Where the kept model is Repeat (the check against Repeat found no skill), the series is a
//! random walk as far as the forecaster can tell, and its intervals are a random walk's instead
//! ([`Residuals::random_walk`]): `z(q, h) = Phi^-1(q) sqrt(h)` and `s` the standard deviation of
//! its last [`RANDOM_WALK_WINDOW`] one-row changes. Nothing is fitted on validation's errors
//! then but the scale's floor and typical value: a 96-step quantile fitted on a validation split
//! rests on a few independent 96-row moves and on their drift, and measured before the test
//! split on 13 price series it missed the nominal coverage by 19.5 points where the random walk
//! missed by 4.3 (docs/forecasting.md, "Where Repeat is kept").
//!
//! Quantiles never cross: the empirical quantile function is non-decreasing in `q`, and `s` is
//! positive.

use serde::{Deserialize, Serialize};

use crate::{DataError, Windows};

/// What a forecast's errors are divided by before their quantiles are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleKind {
    /// 1: the errors as they are.
    Constant,
    /// The standard deviation of the target's last `window` values (the origin's included).
    LevelStd,
    /// The mean absolute change between consecutive values over the target's last `window`
    /// changes (a volatility).
    AbsChange,
    /// The standard deviation of the target's last `window` changes between consecutive values:
    /// a random walk's one-row volatility ([`Residuals::random_walk`]; not a candidate).
    ChangeStd,
}

/// The window of the random walk's scale where Repeat is kept: chosen before the test split
/// among 24, 96 and 336 rows (docs/forecasting.md, "Where Repeat is kept").
pub const RANDOM_WALK_WINDOW: usize = 96;

/// The quantile function of the standard normal distribution, `Phi^-1(q)` for `q` in `(0, 1)`:
/// bisection on `Phi(x) = erfc(-x / sqrt 2) / 2` to the last bit of `x`.
pub fn normal_quantile(q: f64) -> f64 {
    let (mut lo, mut hi) = (-40.0f64, 40.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid == lo || mid == hi {
            break;
        }
        if 0.5 * libm::erfc(-mid / std::f64::consts::SQRT_2) < q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The candidates [`choose_intervals`] tries: a scale and its window in rows, each per target
/// and pooled over the targets.
pub const CANDIDATES: [(ScaleKind, usize); 7] = [
    (ScaleKind::Constant, 0),
    (ScaleKind::LevelStd, 24),
    (ScaleKind::LevelStd, 96),
    (ScaleKind::LevelStd, 336),
    (ScaleKind::AbsChange, 24),
    (ScaleKind::AbsChange, 96),
    (ScaleKind::AbsChange, 336),
];

/// How a forecaster's point forecasts become quantiles: see the module documentation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intervals {
    /// The levels, increasing, each in `(0, 1)`.
    pub levels: Vec<f64>,
    /// The local scale.
    pub scale: ScaleKind,
    /// Its window in rows (0 with [`ScaleKind::Constant`]).
    pub window: usize,
    /// Quantiles per target (else one set pooled over the targets).
    pub per_target: bool,
    /// The smallest scale used: a flat stretch of history must not collapse an interval to a
    /// point. A thousandth of the median scale on the calibration windows.
    pub floor: f64,
    /// Each target's median scale on the calibration windows, used while fewer than
    /// [`Intervals::memory`] of its values are known: a stream's first rows, a short history.
    /// Read from one or two values, the local scale would be noise, or the floor, an interval
    /// narrowest exactly when the model knows least.
    pub typical: Vec<f64>,
    /// Targets of the forecaster.
    pub targets: usize,
    /// Its horizon.
    pub horizon: usize,
    /// `z`, `[group][step][level]`, the group being the target or 0 when pooled.
    pub z: Vec<f64>,
}

/// A run's calibration, saved in `best.ckpt`: the model's intervals, conformal Repeat's (the
/// baseline its figures are read beside), and how the model's were chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The model's.
    pub model: Intervals,
    /// Repeat's: its validation errors' quantiles per target and step, unscaled.
    pub repeat: Intervals,
    /// Each candidate's score in the blocked cross-validation of [`choose_intervals`], in
    /// [`CANDIDATES`] order, per target then pooled.
    pub candidates: Vec<CandidateScore>,
    /// Validation windows it was fitted on.
    pub windows: usize,
}

/// See [`Calibration::candidates`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateScore {
    /// The scale.
    pub scale: ScaleKind,
    /// Its window.
    pub window: usize,
    /// Per target or pooled.
    pub per_target: bool,
    /// Mean pinball loss (scaled units) over the validation windows, each scored when fitted on
    /// the blocks it is not in.
    pub pinball: f64,
    /// Observed coverage of the widest central interval the same way, where there is one.
    pub coverage: f64,
}

/// Checks quantile levels: each in `(0, 1)`, increasing, at most 99.
pub fn check_levels(levels: &[f64]) -> Result<(), DataError> {
    let fail = |why: String| Err(DataError::Config { why });
    if levels.is_empty() || levels.len() > 99 {
        return fail(format!("quantile levels: {} given; give 1 to 99 levels such as 0.1,0.5,0.9", levels.len()));
    }
    if let Some(q) = levels.iter().find(|q| !(**q > 0.0 && **q < 1.0)) {
        return fail(format!("quantile level {q} is outside (0, 1); levels are shares such as 0.1,0.5,0.9"));
    }
    if let Some(w) = levels.windows(2).find(|w| w[1] <= w[0]) {
        return fail(format!("quantile levels must increase: {} then {}", w[0], w[1]));
    }
    Ok(())
}

/// The central intervals among `levels`: pairs `(i, j)` of levels `q` and `1 - q` (to 1e-9),
/// `q < 0.5`, widest first, with their nominal coverage `1 - 2 q`.
pub fn central_pairs(levels: &[f64]) -> Vec<(usize, usize, f64)> {
    let mut out = Vec::new();
    for (i, &q) in levels.iter().enumerate().filter(|(_, q)| **q < 0.5) {
        if let Some(j) = levels.iter().position(|&p| (p - (1.0 - q)).abs() < 1e-9) {
            out.push((i, j, 1.0 - 2.0 * q));
        }
    }
    out
}

/// The name of a level in a column header: `q10` for 0.1, `q2.5` for 0.025.
pub fn level_name(q: f64) -> String {
    let pct = (q * 100.0 * 1e6).round() / 1e6;
    format!("q{pct}")
}

/// The local scale of a target from its most recent values (oldest first, the forecast's
/// origin last), before the floor: see [`ScaleKind`]. Uses the last `window` values (`window + 1`
/// for changes) or as many as there are; with fewer than two, 0.
pub fn local_scale(kind: ScaleKind, window: usize, recent: &[f64]) -> f64 {
    match kind {
        ScaleKind::Constant => 1.0,
        ScaleKind::LevelStd => {
            let v = &recent[recent.len().saturating_sub(window)..];
            if v.len() < 2 {
                return 0.0;
            }
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64).sqrt()
        }
        ScaleKind::AbsChange => {
            let v = &recent[recent.len().saturating_sub(window + 1)..];
            if v.len() < 2 {
                return 0.0;
            }
            v.windows(2).map(|w| (w[1] - w[0]).abs()).sum::<f64>() / (v.len() - 1) as f64
        }
        ScaleKind::ChangeStd => {
            let v = &recent[recent.len().saturating_sub(window + 1)..];
            if v.len() < 2 {
                return 0.0;
            }
            let n = (v.len() - 1) as f64;
            let mean = v.windows(2).map(|w| w[1] - w[0]).sum::<f64>() / n;
            (v.windows(2).map(|w| (w[1] - w[0] - mean) * (w[1] - w[0] - mean)).sum::<f64>() / n).sqrt()
        }
    }
}

/// The `q`-quantile of sorted values, linearly interpolated between order statistics (the
/// usual definition, R's type 7).
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let h = (n - 1) as f64 * q;
    let (lo, frac) = (h.floor() as usize, h - h.floor());
    let hi = (lo + 1).min(n - 1);
    sorted[lo] + frac * (sorted[hi] - sorted[lo])
}

/// The pinball (quantile) loss of the `q`-quantile `pred` when `actual` happened.
pub fn pinball(q: f64, pred: f64, actual: f64) -> f64 {
    let u = actual - pred;
    if u >= 0.0 {
        q * u
    } else {
        (q - 1.0) * u
    }
}

impl Intervals {
    /// How the quantiles scale, in words: `errors divided by the std of the last 96 values,
    /// per target`.
    pub fn describe(&self) -> String {
        let scale = match self.scale {
            ScaleKind::Constant => "errors as they are".to_string(),
            ScaleKind::LevelStd => format!("errors divided by the std of the last {} values", self.window),
            ScaleKind::AbsChange => format!("errors divided by the mean absolute change over the last {} rows", self.window),
            ScaleKind::ChangeStd => {
                let w = self.window;
                return format!(
                    "a random walk's: normal quantiles growing as the square root of the step, \
                     times the std of each target's last {w} changes"
                );
            }
        };
        format!("{scale}, {}", if self.per_target { "per target and step" } else { "per step, pooled over the targets" })
    }

    /// How many recent values of a target [`Intervals::scale_of`] reads.
    pub fn memory(&self) -> usize {
        match self.scale {
            ScaleKind::Constant => 0,
            ScaleKind::LevelStd => self.window,
            ScaleKind::AbsChange | ScaleKind::ChangeStd => self.window + 1,
        }
    }

    /// The scale a forecast of target `t` after `recent` (its values, oldest first) uses.
    pub fn scale_of(&self, t: usize, recent: &[f64]) -> f64 {
        if recent.len() < self.memory() {
            return self.typical[t];
        }
        local_scale(self.scale, self.window, recent).max(self.floor)
    }

    /// Writes the quantiles of target `t` into `out[step * Q + level]` for the point forecasts
    /// `point[step]` made with scale `scale`.
    pub fn fill(&self, t: usize, scale: f64, point: impl Iterator<Item = f64>, out: &mut [f64]) {
        let q = self.levels.len();
        let g = if self.per_target { t } else { 0 };
        for (k, p) in point.enumerate().take(self.horizon) {
            let z = &self.z[(g * self.horizon + k) * q..(g * self.horizon + k + 1) * q];
            for (o, z) in out[k * q..(k + 1) * q].iter_mut().zip(z) {
                *o = p + scale * z;
            }
        }
    }

    /// The quantiles of every target, `[step][target][level]`, for point forecasts
    /// `[step][target]`, each target's scale read from `recent(t)`.
    pub fn quantiles<'a>(&self, point: &[f64], recent: impl Fn(usize) -> &'a [f64]) -> Vec<f64> {
        let all: Vec<usize> = (0..self.targets).collect();
        self.quantiles_at(&all, point, recent)
    }

    /// [`quantiles`](Self::quantiles) of some of the targets: `targets[c]` is the target whose
    /// intervals serve forecast column `c` (`[step][c]` in `point`, `[step][c][level]` in the
    /// result), its scale read from `recent(c)`. A panel's series forecast alone is one column.
    pub fn quantiles_at<'a>(&self, targets: &[usize], point: &[f64], recent: impl Fn(usize) -> &'a [f64]) -> Vec<f64> {
        let (t_n, h, q) = (targets.len(), self.horizon, self.levels.len());
        let mut out = vec![0.0; h * t_n * q];
        let mut one = vec![0.0; h * q];
        for (c, &t) in targets.iter().enumerate() {
            let s = self.scale_of(t, recent(c));
            self.fill(t, s, (0..h).map(|k| point[k * t_n + c]), &mut one);
            for k in 0..h {
                out[(k * t_n + c) * q..(k * t_n + c + 1) * q].copy_from_slice(&one[k * q..(k + 1) * q]);
            }
        }
        out
    }

    /// The values of column `j` of `rows` that [`Intervals::scale_of`] reads for a forecast
    /// made after row `origin`, into `recent`.
    pub fn recent_in(&self, rows: &[Vec<f64>], origin: usize, j: usize, recent: &mut Vec<f64>) {
        last_values(rows, origin, j, self.memory(), recent);
    }

    /// [`Intervals::quantiles`] for point forecasts made after row `origin` of `rows`, the
    /// targets being columns `columns`.
    pub fn quantiles_after(&self, rows: &[Vec<f64>], origin: usize, columns: &[usize], point: &[f64]) -> Vec<f64> {
        let recent: Vec<Vec<f64>> = columns
            .iter()
            .map(|&j| {
                let mut v = Vec::new();
                self.recent_in(rows, origin, j, &mut v);
                v
            })
            .collect();
        self.quantiles(point, |t| &recent[t])
    }

    /// Checks what a checkpoint holds against the model it comes with: sizes, finite and
    /// non-decreasing quantiles, a positive floor.
    pub fn check(&self, targets: usize, horizon: usize) -> Result<(), String> {
        check_levels(&self.levels).map_err(|e| e.to_string())?;
        if self.targets != targets || self.horizon != horizon {
            return Err(format!(
                "its intervals are for {} targets and {} steps, the model has {targets} and {horizon}",
                self.targets, self.horizon
            ));
        }
        let groups = if self.per_target { targets } else { 1 };
        let q = self.levels.len();
        if self.z.len() != groups * horizon * q {
            return Err(format!("its intervals hold {} values where {} are needed", self.z.len(), groups * horizon * q));
        }
        if self.scale != ScaleKind::Constant && !(1..=1_000_000).contains(&self.window) {
            return Err(format!("its intervals' window {} is outside 1..=1000000", self.window));
        }
        if !(self.floor.is_finite() && self.floor > 0.0) {
            return Err(format!("its intervals' scale floor {} is not positive", self.floor));
        }
        if self.typical.len() != targets || self.typical.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(format!("its intervals' typical scales {:?} are not one positive number per target", self.typical));
        }
        if self.z.iter().any(|z| !z.is_finite()) || self.z.chunks(q).any(|c| c.windows(2).any(|w| w[1] < w[0])) {
            return Err("its intervals' quantiles are not finite and increasing".into());
        }
        Ok(())
    }
}

/// The last `n` values of column `j` up to row `origin` (fewer at the start), oldest first,
/// into `out`: a panel's missing values (NaN) passed over, as a stream of the series alone
/// never sees them.
pub fn last_values(rows: &[Vec<f64>], origin: usize, j: usize, n: usize, out: &mut Vec<f64>) {
    out.clear();
    let from = (origin + 1).saturating_sub(n);
    out.extend(rows[from..=origin].iter().map(|r| r[j]));
    if out.iter().any(|v| v.is_nan()) {
        out.clear();
        out.extend(rows[..=origin].iter().rev().map(|r| r[j]).filter(|v| !v.is_nan()).take(n));
        out.reverse();
    }
}

/// What calibration reads: every validation forecast's errors and Repeat's, and each origin's
/// local scales for every candidate.
#[derive(Debug, Clone)]
pub struct Residuals {
    /// Targets.
    pub targets: usize,
    /// Steps.
    pub horizon: usize,
    /// `actual - forecast`, `[window][target][step]`.
    errors: Vec<f64>,
    /// `actual - last`, the same layout.
    repeat: Vec<f64>,
    /// Per candidate ([`CANDIDATES`]), then the random walk's ([`RANDOM_WALK_WINDOW`]): the local
    /// scale before any floor, `[window][target]`.
    scales: Vec<Vec<f64>>,
}

impl Residuals {
    /// Room for the forecasts after the windows of `w` (target columns `targets`), with each
    /// origin's local scales read from `w`'s rows; errors are added with [`Residuals::set`].
    pub fn new(w: &Windows, targets: &[usize]) -> Self {
        let longest = CANDIDATES.iter().map(|c| c.1 + 1).max().unwrap_or(1).max(RANDOM_WALK_WINDOW + 1);
        let mut scales = vec![Vec::with_capacity(w.len() * targets.len()); CANDIDATES.len() + 1];
        let mut recent = Vec::with_capacity(longest);
        for (i, &s) in w.starts.iter().enumerate() {
            let origin = s + w.lookback - 1;
            let present = w.present_targets(i, targets);
            for (t, &j) in targets.iter().enumerate() {
                // A series without this window's values has no forecast here: its entries stay
                // NaN, and fitting and scoring pass over them.
                if present.binary_search(&t).is_err() {
                    scales.iter_mut().for_each(|s| s.push(f64::NAN));
                    continue;
                }
                last_values(w.rows, origin, j, longest, &mut recent);
                for (c, &(kind, window)) in CANDIDATES.iter().enumerate() {
                    scales[c].push(local_scale(kind, window, &recent));
                }
                scales[CANDIDATES.len()].push(local_scale(ScaleKind::ChangeStd, RANDOM_WALK_WINDOW, &recent));
            }
        }
        let n = w.len() * targets.len() * w.horizon;
        Self { targets: targets.len(), horizon: w.horizon, errors: vec![f64::NAN; n], repeat: vec![f64::NAN; n], scales }
    }

    /// Records the forecast `pred` of target `t` after window `i`, made after the value `last`,
    /// and what happened, `actual`.
    pub fn set(&mut self, i: usize, t: usize, last: f64, pred: &[f64], actual: &[f64]) {
        let at = (i * self.targets + t) * self.horizon;
        for (k, (p, y)) in pred.iter().zip(actual).enumerate() {
            self.errors[at + k] = y - p;
            self.repeat[at + k] = y - last;
        }
    }

    /// Windows.
    pub fn windows(&self) -> usize {
        self.scales[0].len() / self.targets.max(1)
    }

    /// Fits the model's intervals (or Repeat's, with `repeat`) with candidate `c`'s scale on
    /// the windows in `ranges` (each `[start, end)`).
    pub fn fit(&self, levels: &[f64], c: usize, per_target: bool, ranges: &[(usize, usize)], repeat: bool) -> Intervals {
        let (t_n, h) = (self.targets, self.horizon);
        let (kind, window) = CANDIDATES[c];
        let errors = if repeat { &self.repeat } else { &self.errors };
        let fitted: Vec<usize> = ranges.iter().flat_map(|&(a, b)| a..b).collect();
        let (scales, floor, typical) = self.floor_and_typical(c, kind, &fitted);
        let groups = if per_target { t_n } else { 1 };
        let mut z = Vec::with_capacity(groups * h * levels.len());
        let mut v = Vec::new();
        for g in 0..groups {
            // A panel's series without a forecast in these windows takes the errors of all.
            let alone = per_target && fitted.iter().any(|&i| !errors[(i * t_n + g) * h].is_nan());
            for k in 0..h {
                v.clear();
                for (n, &i) in fitted.iter().enumerate() {
                    for t in (0..t_n).filter(|&t| !alone || t == g) {
                        let e = errors[(i * t_n + t) * h + k];
                        if !e.is_nan() {
                            v.push(e / scales[n * t_n + t].max(floor));
                        }
                    }
                }
                v.sort_by(f64::total_cmp);
                z.extend(levels.iter().map(|&q| quantile_sorted(&v, q)));
            }
        }
        Intervals { levels: levels.to_vec(), scale: kind, window, per_target, floor, typical, targets: t_n, horizon: h, z }
    }

    /// Scale `c`'s values on windows `fitted` (`[window][target]`), its floor (a thousandth of
    /// their median; 1 when constant) and each target's median ([`Intervals::typical`]).
    fn floor_and_typical(&self, c: usize, kind: ScaleKind, fitted: &[usize]) -> (Vec<f64>, f64, Vec<f64>) {
        let t_n = self.targets;
        let scales: Vec<f64> = fitted.iter().flat_map(|&i| &self.scales[c][i * t_n..(i + 1) * t_n]).copied().collect();
        let mut sorted: Vec<f64> = scales.iter().copied().filter(|s| !s.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        let median = quantile_sorted(&sorted, 0.5);
        let floor = if kind == ScaleKind::Constant { 1.0 } else { (median * 1e-3).max(1e-12) };
        let typical = (0..t_n)
            .map(|t| {
                let mut own: Vec<f64> = scales.iter().skip(t).step_by(t_n).filter(|s| !s.is_nan()).map(|s| s.max(floor)).collect();
                own.sort_by(f64::total_cmp);
                if own.is_empty() {
                    floor
                } else {
                    quantile_sorted(&own, 0.5)
                }
            })
            .collect();
        (scales, floor, typical)
    }

    /// A random walk's intervals, for a kept Repeat: at step `h` and level `q`,
    /// `last + Phi^-1(q) sqrt(h) s`, with `s` the standard deviation of the target's last
    /// [`RANDOM_WALK_WINDOW`] changes ([`ScaleKind::ChangeStd`]). Only the scale's floor and
    /// typical value come from the windows (all of them); no error quantile is fitted.
    pub fn random_walk(&self, levels: &[f64]) -> Intervals {
        let (t_n, h) = (self.targets, self.horizon);
        let all: Vec<usize> = (0..self.windows()).collect();
        let (_, floor, typical) = self.floor_and_typical(CANDIDATES.len(), ScaleKind::ChangeStd, &all);
        let z_all: Vec<f64> = levels.iter().map(|&q| normal_quantile(q)).collect();
        let z = (0..t_n).flat_map(|_| (1..=h).flat_map(|k| z_all.iter().map(move |z| z * (k as f64).sqrt()))).collect();
        Intervals {
            levels: levels.to_vec(),
            scale: ScaleKind::ChangeStd,
            window: RANDOM_WALK_WINDOW,
            per_target: true,
            floor,
            typical,
            targets: t_n,
            horizon: h,
            z,
        }
    }

    /// The mean pinball loss over levels, targets and steps of the model's intervals `iv`
    /// (candidate `c`'s scale) on windows `range`, and the coverage of its widest central
    /// interval (NaN without one).
    pub fn score(&self, iv: &Intervals, c: usize, range: (usize, usize)) -> (f64, f64) {
        let (t_n, h, q) = (self.targets, self.horizon, iv.levels.len());
        let pair = central_pairs(&iv.levels).first().copied();
        let (mut loss, mut inside, mut n) = (0.0, 0usize, 0usize);
        let mut out = vec![0.0; h * q];
        for i in range.0..range.1 {
            for t in 0..t_n {
                if self.errors[(i * t_n + t) * h].is_nan() {
                    continue;
                }
                let s = self.scales[c][i * t_n + t].max(iv.floor);
                // Quantiles of the error itself: the forecast is 0 in these units.
                iv.fill(t, s, std::iter::repeat_n(0.0, h), &mut out);
                for k in 0..h {
                    let e = self.errors[(i * t_n + t) * h + k];
                    let qs = &out[k * q..(k + 1) * q];
                    loss += iv.levels.iter().zip(qs).map(|(&l, &p)| pinball(l, p, e)).sum::<f64>();
                    if let Some((a, b, _)) = pair {
                        inside += usize::from(qs[a] <= e && e <= qs[b]);
                    }
                    n += 1;
                }
            }
        }
        let n = n.max(1) as f64;
        (loss / (n * q as f64), if pair.is_some() { inside as f64 / n } else { f64::NAN })
    }
}

/// The validation windows are cut into this many consecutive blocks to score the candidates.
pub const FOLDS: usize = 4;

/// The model's intervals and conformal Repeat's. The model's are the candidate with the lowest
/// pinball loss in a blocked cross-validation over the validation windows (each of [`FOLDS`]
/// consecutive blocks scored when fitted on the others), refitted on all of them.
///
/// A single split (fit on the first half, score on the second) chose differently from one seed
/// to the next on ETTh1 on differences of 0.1 %, each scale's figure resting on one stretch of
/// time; scored on every window, the choice was the same for every seed and for 2, 4 or 8
/// blocks (docs/forecasting.md).
///
/// With `repeat_kept` (the model kept is Repeat), the model's intervals are the random walk's
/// ([`Residuals::random_walk`]); the candidates are still scored, for the record.
pub fn choose_intervals(levels: &[f64], res: &Residuals, repeat_kept: bool) -> Calibration {
    let n = res.windows();
    let blocks: Vec<(usize, usize)> = (0..FOLDS).map(|b| (n * b / FOLDS, n * (b + 1) / FOLDS)).filter(|r| r.1 > r.0).collect();
    let mut candidates = Vec::new();
    let mut index = Vec::new();
    for per_target in [true, false] {
        for (c, &(scale, window)) in CANDIDATES.iter().enumerate() {
            // Means over every scored window: each block's weighted by its size.
            let (mut pinball, mut coverage) = (0.0, 0.0);
            for &(a, b) in &blocks {
                let iv = res.fit(levels, c, per_target, &[(0, a), (b, n)], false);
                let (p, cov) = res.score(&iv, c, (a, b));
                let share = (b - a) as f64 / n as f64;
                pinball += p * share;
                coverage += cov * share;
            }
            if blocks.len() < 2 {
                (pinball, coverage) = (f64::NAN, f64::NAN);
            }
            candidates.push(CandidateScore { scale, window, per_target, pinball, coverage });
            index.push((c, per_target));
        }
    }
    // Ties (and NaN, from too few windows) go to the first: per target, unscaled.
    let best = (0..candidates.len()).fold(0, |b, i| if candidates[i].pinball < candidates[b].pinball { i } else { b });
    let (c, per_target) = index[best];
    Calibration {
        model: if repeat_kept { res.random_walk(levels) } else { res.fit(levels, c, per_target, &[(0, n)], false) },
        repeat: res.fit(levels, 0, true, &[(0, n)], true),
        candidates,
        windows: n,
    }
}

/// Coverage, width and pinball loss of quantile forecasts per step, summed in a fixed order.
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalTable {
    /// The levels.
    pub levels: Vec<f64>,
    /// Steps.
    pub horizon: usize,
    /// Per step: values scored.
    n: Vec<usize>,
    /// Per step and level: actual values at or below the quantile.
    below: Vec<usize>,
    /// Per step and central pair ([`central_pairs`]): actual values inside, and summed widths.
    inside: Vec<usize>,
    width: Vec<f64>,
    /// Per step: the pinball loss summed over levels and values.
    loss: Vec<f64>,
}

/// One step's (or all steps') figures of an [`IntervalTable`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IntervalFigures {
    /// Values scored.
    pub n: usize,
    /// Per central interval (widest first): nominal coverage, observed coverage, mean width.
    pub intervals: Vec<(f64, f64, f64)>,
    /// Per level: the share of actual values at or below the quantile.
    pub below: Vec<f64>,
    /// The pinball loss, mean over levels and values.
    pub pinball: f64,
}

impl IntervalTable {
    /// An empty table.
    pub fn new(levels: &[f64], horizon: usize) -> Self {
        let (q, p) = (levels.len(), central_pairs(levels).len());
        Self {
            levels: levels.to_vec(),
            horizon,
            n: vec![0; horizon],
            below: vec![0; horizon * q],
            inside: vec![0; horizon * p],
            width: vec![0.0; horizon * p],
            loss: vec![0.0; horizon],
        }
    }

    /// Adds one forecast: quantiles `[step][level]` and the actual values `[step]`.
    pub fn add(&mut self, quantiles: &[f64], actual: &[f64]) {
        let q = self.levels.len();
        let pairs = central_pairs(&self.levels);
        for (k, (qs, &y)) in quantiles.chunks(q).zip(actual).enumerate().take(self.horizon) {
            self.n[k] += 1;
            for (l, (&lv, &p)) in self.levels.iter().zip(qs).enumerate() {
                self.below[k * q + l] += usize::from(y <= p);
                self.loss[k] += pinball(lv, p, y);
            }
            for (c, &(a, b, _)) in pairs.iter().enumerate() {
                self.inside[k * pairs.len() + c] += usize::from(qs[a] <= y && y <= qs[b]);
                self.width[k * pairs.len() + c] += qs[b] - qs[a];
            }
        }
    }

    /// Adds what `other` scored, when it has the same levels and steps; returns whether it did.
    pub fn merge(&mut self, other: &IntervalTable) -> bool {
        if self.levels != other.levels || self.horizon != other.horizon {
            return false;
        }
        let add = |a: &mut [usize], b: &[usize]| a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        add(&mut self.n, &other.n);
        add(&mut self.below, &other.below);
        add(&mut self.inside, &other.inside);
        self.width.iter_mut().zip(&other.width).for_each(|(a, b)| *a += b);
        self.loss.iter_mut().zip(&other.loss).for_each(|(a, b)| *a += b);
        true
    }

    fn figures(&self, steps: std::ops::Range<usize>) -> IntervalFigures {
        let q = self.levels.len();
        let pairs = central_pairs(&self.levels);
        let n: usize = steps.clone().map(|k| self.n[k]).sum();
        let d = n.max(1) as f64;
        let intervals = pairs
            .iter()
            .enumerate()
            .map(|(c, &(_, _, nominal))| {
                let inside: usize = steps.clone().map(|k| self.inside[k * pairs.len() + c]).sum();
                let width: f64 = steps.clone().map(|k| self.width[k * pairs.len() + c]).sum();
                (nominal, inside as f64 / d, width / d)
            })
            .collect();
        let below = (0..q).map(|l| steps.clone().map(|k| self.below[k * q + l]).sum::<usize>() as f64 / d).collect();
        let pinball = steps.map(|k| self.loss[k]).sum::<f64>() / (d * q as f64);
        IntervalFigures { n, intervals, below, pinball }
    }

    /// Step `k`'s figures.
    pub fn step(&self, k: usize) -> IntervalFigures {
        self.figures(k..k + 1)
    }

    /// All steps pooled.
    pub fn total(&self) -> IntervalFigures {
        self.figures(0..self.horizon)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_equal_a_hand_computation() {
        // Levels 0.1, 0.5, 0.9; two steps; three forecasts.
        let mut t = IntervalTable::new(&[0.1, 0.5, 0.9], 2);
        // Step 1: y = 1.5 in [1, 3] (below: q50 = 2, q90 = 3); step 2: y = 5 above [0, 4].
        t.add(&[1.0, 2.0, 3.0, 0.0, 2.0, 4.0], &[1.5, 5.0]);
        // Step 1: y = 0 below [1, 2]; step 2: y = 2 in [1, 5] (at q50: counted below).
        t.add(&[1.0, 1.5, 2.0, 1.0, 2.0, 5.0], &[0.0, 2.0]);
        // Step 1: y = 3 at the upper bound [0, 3]: inside, below q90 too.
        t.add(&[0.0, 1.0, 3.0, 0.0, 0.0, 0.0], &[3.0, 0.0]);
        let s1 = t.step(0);
        assert_eq!(s1.n, 3);
        // Inside: yes, no, yes; widths 2, 1, 3.
        assert_eq!(s1.intervals, vec![(0.8, 2.0 / 3.0, 2.0)]);
        // At or below q10: 0, 1, 0; q50: 1, 1, 0; q90: 1, 1, 1.
        assert_eq!(s1.below, vec![1.0 / 3.0, 2.0 / 3.0, 1.0]);
        // Pinball (q u above the quantile, (1 - q) |u| below): forecast 1: 0.1*0.5 + 0.5*0.5 +
        // 0.1*1.5 = 0.45; forecast 2: 0.9*1 + 0.5*1.5 + 0.1*2 = 1.85; forecast 3: 0.1*3 + 0.5*2 +
        // 0 = 1.3. Sum 3.6 over 9 values.
        assert!((s1.pinball - 3.6 / 9.0).abs() < 1e-12, "{}", s1.pinball);
        let s2 = t.step(1);
        // Inside: no (5 > 4), yes, yes (0 in [0, 0]); widths 4, 4, 0.
        assert_eq!(s2.intervals, vec![(0.8, 2.0 / 3.0, 8.0 / 3.0)]);
        // Pinball: 0.1*5 + 0.5*3 + 0.9*1 = 2.9; 0.1*1 + 0 + 0.1*3 = 0.4; 0. Sum 3.3.
        assert!((s2.pinball - 3.3 / 9.0).abs() < 1e-12, "{}", s2.pinball);
        let all = t.total();
        assert_eq!(all.n, 6);
        assert_eq!(all.intervals[0].1, 4.0 / 6.0);
        // Widths 2 + 1 + 3 at step 1 and 4 + 4 + 0 at step 2.
        assert!((all.intervals[0].2 - 14.0 / 6.0).abs() < 1e-12);
        assert!((all.pinball - 6.9 / 18.0).abs() < 1e-12);
        // Merged into an empty table it scores the same; other levels are not merged.
        let mut sum = IntervalTable::new(&[0.1, 0.5, 0.9], 2);
        assert!(sum.merge(&t));
        assert_eq!(sum, t);
        assert!(!IntervalTable::new(&[0.25, 0.75], 2).merge(&t));
    }

    #[test]
    fn quantiles_interpolate_and_levels_are_checked() {
        let v = [1.0, 2.0, 4.0, 8.0];
        assert_eq!(quantile_sorted(&v, 0.0), 1.0);
        assert_eq!(quantile_sorted(&v, 1.0), 8.0);
        // Position 3 * 0.5 = 1.5: halfway between 2 and 4.
        assert_eq!(quantile_sorted(&v, 0.5), 3.0);
        assert!(check_levels(&[0.1, 0.5, 0.9]).is_ok());
        for bad in [vec![], vec![0.0], vec![0.5, 1.0], vec![0.9, 0.1], vec![0.5, 0.5], vec![f64::NAN]] {
            assert!(check_levels(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(central_pairs(&[0.05, 0.1, 0.5, 0.9, 0.95]), vec![(0, 4, 0.9), (1, 3, 0.8)]);
        assert_eq!(level_name(0.1), "q10");
        assert_eq!(level_name(0.025), "q2.5");
    }

    #[test]
    fn local_scales_are_std_and_mean_change() {
        let v = [1.0, 3.0, 2.0, 6.0];
        // Last 2 values: 2 and 6, std 2; last 3 changes: 2, 1, 4, mean 7/3; last 2: 2.5.
        assert_eq!(local_scale(ScaleKind::LevelStd, 2, &v), 2.0);
        assert!((local_scale(ScaleKind::AbsChange, 3, &v) - 7.0 / 3.0).abs() < 1e-15);
        assert_eq!(local_scale(ScaleKind::AbsChange, 2, &v), 2.5);
        assert_eq!(local_scale(ScaleKind::LevelStd, 96, &[5.0]), 0.0);
        assert_eq!(local_scale(ScaleKind::Constant, 0, &[]), 1.0);
    }

    /// Errors whose spread follows the series' recent volatility: the chosen intervals scale
    /// with it, cover near their nominal share on later windows, and never cross.
    #[test]
    fn calibration_follows_volatility_and_never_crosses() {
        // Steps of about unit spread: the sum of 12 uniforms from a 64-bit LCG, less 6.
        let mut state = 7u64;
        let mut rng = move || {
            (0..12)
                .map(|_| {
                    state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    (state >> 11) as f64 / (1u64 << 53) as f64
                })
                .sum::<f64>()
                - 6.0
        };
        // A random walk whose volatility switches between 0.2 and 2 every 300 rows.
        let n = 4000;
        let mut x = vec![0.0];
        let mut vol = Vec::new();
        for i in 1..n {
            let s = if (i / 300) % 2 == 0 { 0.2 } else { 2.0 };
            vol.push(s);
            x.push(x[i - 1] + s * rng());
        }
        let rows: Vec<Vec<f64>> = x.iter().map(|&v| vec![v]).collect();
        let w = Windows::new(&rows, (0, n), 48, 4, 1).unwrap();
        let mut res = Residuals::new(&w, &[0]);
        for (i, &s) in w.starts.iter().enumerate() {
            let last = rows[s + 47][0];
            let actual: Vec<f64> = (0..4).map(|k| rows[s + 48 + k][0]).collect();
            res.set(i, 0, last, &[last; 4], &actual);
        }
        let cal = choose_intervals(&[0.1, 0.5, 0.9], &res, false);
        assert_ne!(cal.model.scale, ScaleKind::Constant, "{:?}", cal.candidates);
        let best = cal.candidates.iter().map(|c| c.pinball).fold(f64::INFINITY, f64::min);
        let constant = cal.candidates.iter().find(|c| c.scale == ScaleKind::Constant).unwrap().pinball;
        assert!(best < 0.9 * constant, "scaled {best} against constant {constant}");
        let c = CANDIDATES.iter().position(|&c| c == (cal.model.scale, cal.model.window)).unwrap();
        let (_, coverage) = res.score(&cal.model, c, (0, res.windows()));
        assert!((coverage - 0.8).abs() < 0.03, "coverage {coverage}");
        assert!(cal.model.z.chunks(3).all(|z| z[0] <= z[1] && z[1] <= z[2]));
        assert!(cal.model.check(1, 4).is_ok() && cal.repeat.check(1, 4).is_ok());

        // With fewer values than the scale reads, the typical scale: the median over the
        // windows of the scale they had (about halfway between the two regimes' here).
        let iv = &cal.model;
        let mut own: Vec<f64> = res.scales[c].iter().map(|s| s.max(iv.floor)).collect();
        own.sort_by(f64::total_cmp);
        assert_eq!(iv.typical, vec![quantile_sorted(&own, 0.5)]);
        let short = &x[..iv.memory() - 1];
        assert_eq!(iv.scale_of(0, short), iv.typical[0]);
        assert_eq!(iv.scale_of(0, &x[..1]), iv.typical[0]);
        let full = &x[..iv.memory()];
        assert_eq!(iv.scale_of(0, full), local_scale(iv.scale, iv.window, full).max(iv.floor));
        let mut bad = iv.clone();
        bad.typical = vec![0.0];
        assert!(bad.check(1, 4).is_err());

        // Where Repeat is kept, the same walk gets a random walk's intervals: normal quantiles
        // growing as the square root of the step, times the std of the last 96 changes. This
        // walk's steps have unit variance times the regime's volatility, so they cover near
        // 80 % (the scale lags each switch of regime by up to 96 rows of 300).
        let rw = choose_intervals(&[0.1, 0.5, 0.9], &res, true);
        assert_eq!((rw.model.scale, rw.model.window, rw.model.per_target), (ScaleKind::ChangeStd, RANDOM_WALK_WINDOW, true));
        assert_eq!(rw.candidates, cal.candidates, "the candidates are scored all the same");
        assert_eq!(rw.repeat, cal.repeat);
        for k in 0..4 {
            for (l, q) in [0.1, 0.5, 0.9].into_iter().enumerate() {
                let want = normal_quantile(q) * ((k + 1) as f64).sqrt();
                assert!((rw.model.z[k * 3 + l] - want).abs() < 1e-15, "step {k}, level {q}");
            }
        }
        let (_, coverage) = res.score(&rw.model, CANDIDATES.len(), (0, res.windows()));
        assert!((coverage - 0.8).abs() < 0.04, "random walk coverage {coverage}");
        assert!(rw.model.check(1, 4).is_ok());
        let full = &x[..rw.model.memory()];
        assert_eq!(rw.model.memory(), RANDOM_WALK_WINDOW + 1);
        assert_eq!(rw.model.scale_of(0, full), local_scale(ScaleKind::ChangeStd, 96, full).max(rw.model.floor));
        assert_eq!(rw.model.scale_of(0, &full[1..]), rw.model.typical[0]);
    }

    #[test]
    fn normal_quantiles_and_the_std_of_changes() {
        // Phi^-1 to 12 digits of the tabulated values.
        for (q, z) in
            [(0.5, 0.0), (0.9, 1.2815515655446004), (0.1, -1.2815515655446004), (0.975, 1.959963984540054), (0.001, -3.090232306167813)]
        {
            assert!((normal_quantile(q) - z).abs() < 1e-12, "Phi^-1({q}) = {} against {z}", normal_quantile(q));
        }
        // Values 1, 3, 2, 6: changes 2, -1, 4, mean 5/3, squared deviations (1 + 64 + 49) / 9
        // over 3 changes, std sqrt(114 / 27); the last 2 changes, -1 and 4: std 2.5.
        let v = [1.0, 3.0, 2.0, 6.0];
        assert!((local_scale(ScaleKind::ChangeStd, 3, &v) - (114.0f64 / 27.0).sqrt()).abs() < 1e-15);
        assert!((local_scale(ScaleKind::ChangeStd, 2, &v) - 2.5).abs() < 1e-15);
        assert_eq!(local_scale(ScaleKind::ChangeStd, 96, &[5.0]), 0.0);
    }
}
