//! Forecasts scored beside Repeat: the errors per target and step, the trader's figures, and
//! the choice, on the validation split, of how much of the model's correction of Repeat a run
//! keeps ([`Blend`]).
//!
//! The untrained forecaster is Repeat (its head, direct map and cycle start at zero), so every
//! trained model is a correction of Repeat. On series where no correction generalises (prices),
//! a run must not keep one that only looks good by chance: it keeps the blend
//! `last + alpha * (forecast - last)` that does best on validation, and keeps it only if it
//! beats Repeat there beyond noise (a one-sided Diebold-Mariano test at 1 %, small-sample corrected); otherwise it keeps
//! Repeat itself.

use burn::prelude::*;
use serde::{Deserialize, Serialize};

use mamba2_data::quantile::{choose_intervals, Calibration, IntervalTable, Residuals};
use mamba2_data::trade::{diebold_mariano, hln_corrected, newey_west_lag, skill, t_critical, TradeTable};
use mamba2_data::{ErrorTable, Windows};
use mamba2_forecast::features::Truth;
use mamba2_forecast::Forecaster;

use crate::TrainError;

/// Blend weights tried: `g / BLEND_GRID` for `g` in `0..=BLEND_GRID`.
pub const BLEND_GRID: usize = 20;

/// The blend weights, `g / BLEND_GRID`.
const WEIGHTS: [f64; BLEND_GRID + 1] = {
    let mut w = [0.0; BLEND_GRID + 1];
    let mut g = 0;
    while g <= BLEND_GRID {
        w[g] = g as f64 / BLEND_GRID as f64;
        g += 1;
    }
    w
};

/// The normal critical value of the one-sided test a kept model must pass: 1 %. At 5 % the
/// rule kept a model on 3 of 40 random walks (a model chosen among 21 blends is tested, so the
/// nominal level understates how often noise passes); at 1 %, on 1 (`docs/forecasting.md`).
pub const DM_LEVEL_Z: f64 = 2.326;

/// Calls `visit(window, target, last, forecast, truth)` for the forecast of every target after
/// each of the first `n` windows of `w` (in scaled units; `last` is the value the forecast was
/// made after), computing `batch_size` windows at a time.
pub fn each_forecast<B: Backend>(
    model: &Forecaster<B>,
    w: &Windows,
    clock: &[i64],
    n: usize,
    batch_size: usize,
    device: &B::Device,
    mut visit: impl FnMut(usize, usize, f64, &[f64], &[f64]),
) -> Result<(), TrainError> {
    let targets = model.target_indices();
    let map = model.feature_map();
    for (c, chunk) in w.starts[..n].chunks(batch_size).enumerate() {
        let first = c * batch_size;
        // Each window's sequences: its targets with every value there (all of them in a table
        // with none missing), in order.
        let present: Vec<Vec<usize>> = (first..first + chunk.len()).map(|i| w.present_targets(i, targets)).collect();
        let hb = map.build_present::<B::FloatElem>(
            w.rows,
            clock,
            chunk,
            w.has_missing().then_some(&present[..]),
            w.lookback,
            1,
            1,
            Truth::Values,
        );
        let (truth, level) = (hb.truth.clone(), hb.level.clone());
        // The correction in the backend's float type, the last value added in f64: a forecast
        // of Repeat (a correction of zero) then scores exactly as Repeat does.
        let relative = mamba2_tensor::compare::to_f64_vec(model.forward_relative(&hb.into_device(w.horizon, device))?);
        let pred: Vec<f64> = relative.iter().enumerate().map(|(i, r)| level[i / w.horizon] + r).collect();
        let order = present.iter().enumerate().flat_map(|(i, ts)| ts.iter().map(move |&t| (i, t)));
        for ((i, t), (p, y)) in order.zip(pred.chunks(w.horizon).zip(truth.chunks(w.horizon))) {
            let last = w.rows[chunk[i] + w.lookback - 1][targets[t]];
            visit(first + i, t, last, p, y);
        }
    }
    Ok(())
}

/// A model's forecasts on a window set scored beside Repeat's, with what choosing a blend of the
/// two needs.
#[derive(Debug, Clone)]
pub struct Scored {
    /// The model's errors per target and step.
    pub model: ErrorTable,
    /// Per window, per blend weight `g / BLEND_GRID`: the squared and absolute errors of the
    /// blend, summed over targets and steps.
    se: Vec<[f64; BLEND_GRID + 1]>,
    ae: Vec<[f64; BLEND_GRID + 1]>,
}

/// Scores `model`'s forecasts after every window of `w` (see [`Scored`]).
pub fn score<B: Backend>(
    model: &Forecaster<B>,
    w: &Windows,
    clock: &[i64],
    batch_size: usize,
    device: &B::Device,
) -> Result<Scored, TrainError> {
    let (t_n, h) = (model.target_indices().len(), w.horizon);
    let mut s =
        Scored { model: ErrorTable::new(t_n, h), se: vec![[0.0; BLEND_GRID + 1]; w.len()], ae: vec![[0.0; BLEND_GRID + 1]; w.len()] };
    each_forecast(model, w, clock, w.len(), batch_size, device, |i, t, last, p, y| {
        s.model.add(t, p, y);
        // The weights innermost, in registers: this runs for every validation value each
        // epoch, and vectorises across the weights.
        let (mut se, mut ae) = ([0.0; BLEND_GRID + 1], [0.0; BLEND_GRID + 1]);
        for (p, y) in p.iter().zip(y) {
            let (rel, truth) = (p - last, y - last);
            for g in 0..=BLEND_GRID {
                let e = WEIGHTS[g] * rel - truth;
                se[g] += e * e;
                ae[g] += e.abs();
            }
        }
        for g in 0..=BLEND_GRID {
            s.se[i][g] += se[g];
            s.ae[i][g] += ae[g];
        }
    })?;
    Ok(s)
}

/// How much of the model's correction of Repeat a run keeps, chosen on the validation split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Blend {
    /// The share kept: the kept forecast is `last + alpha * (model - last)`; 1 is the model as
    /// trained, 0 is Repeat.
    pub alpha: f64,
    /// The share that did best on validation (by MSE and MAE, each relative to Repeat's),
    /// before the significance test.
    pub best_alpha: f64,
    /// The Diebold-Mariano statistic of that blend against Repeat, per window, on the sum of
    /// the relative squared and absolute errors (negative: the blend is better).
    pub dm: f64,
    /// The same statistic of the model as trained.
    pub dm_model: f64,
    /// The critical value `dm` had to be below (Student's t of `n - 1` degrees at 1 %, one-sided).
    pub critical: f64,
    /// Whether it beat Repeat at the 1 % level (`dm < critical`): if not, `alpha` is 0.
    pub significant: bool,
    /// Validation windows and forecast steps the test had.
    pub windows: usize,
    /// See `windows`.
    pub horizon: usize,
    /// Whether the run chose (`false`: `--no-repeat-check` kept the model as trained).
    pub checked: bool,
    /// Validation MSE and MAE of the best blend.
    pub best_mse: f64,
    /// See `best_mse`.
    pub best_mae: f64,
    /// Validation MSE and MAE of the model as trained.
    pub model_mse: f64,
    /// See `model_mse`.
    pub model_mae: f64,
    /// Validation MSE and MAE of the kept forecast.
    pub kept_mse: f64,
    /// See `kept_mse`.
    pub kept_mae: f64,
    /// Validation MSE and MAE of Repeat.
    pub repeat_mse: f64,
    /// See `repeat_mse`.
    pub repeat_mae: f64,
}

impl Blend {
    /// One plain line for the run's report.
    pub fn describe(&self) -> String {
        let pct = |m: f64, r: f64| 100.0 * skill(m, r);
        if !self.checked {
            format!(
                "skill over Repeat on validation: MSE {:+.1} %, MAE {:+.1} %; best.ckpt keeps the model as trained \
                 (--no-repeat-check; the check would have kept {:.2} of it)",
                pct(self.model_mse, self.repeat_mse),
                pct(self.model_mae, self.repeat_mae),
                if self.significant { self.best_alpha } else { 0.0 }
            )
        } else if !self.significant && self.best_alpha == 0.0 {
            format!(
                "no skill: on validation the model does worse than Repeat (MSE skill {:+.1} %, MAE {:+.1} %); best.ckpt \
                 forecasts Repeat, the last value",
                pct(self.model_mse, self.repeat_mse),
                pct(self.model_mae, self.repeat_mae)
            )
        } else if !self.significant && self.dm.is_nan() {
            format!(
                "no skill shown: {} validation windows are too few to test an edge {} steps ahead (the model's MSE skill \
                 there is {:+.1} %); best.ckpt forecasts Repeat, the last value",
                self.windows,
                self.horizon,
                pct(self.model_mse, self.repeat_mse)
            )
        } else if !self.significant {
            format!(
                "no skill: on validation no blend of the model with Repeat beats Repeat beyond noise (the best, {:.2} of the \
                 model, has MSE skill {:+.1} %, Diebold-Mariano {:.2}, not below {:.2}); best.ckpt forecasts Repeat, \
                 the last value",
                self.best_alpha,
                pct(self.best_mse, self.repeat_mse),
                self.dm,
                self.critical
            )
        } else if self.alpha == 1.0 {
            format!(
                "skill over Repeat on validation: MSE {:+.1} %, MAE {:+.1} % (Diebold-Mariano {:.2}); best.ckpt keeps the model",
                pct(self.kept_mse, self.repeat_mse),
                pct(self.kept_mae, self.repeat_mae),
                self.dm
            )
        } else {
            format!(
                "skill over Repeat on validation: MSE {:+.1} %, MAE {:+.1} % (Diebold-Mariano {:.2}) with {:.2} of the model's \
                 correction of Repeat (all of it: MSE {:+.1} %, MAE {:+.1} %); best.ckpt keeps that blend",
                pct(self.kept_mse, self.repeat_mse),
                pct(self.kept_mae, self.repeat_mae),
                self.dm,
                self.alpha,
                pct(self.model_mse, self.repeat_mse),
                pct(self.model_mae, self.repeat_mae)
            )
        }
    }
}

impl Scored {
    /// The blend a run keeps (see the module documentation): the weight whose MSE and MAE,
    /// each relative to Repeat's, sum lowest (the larger weight on a tie), kept if it beats
    /// Repeat beyond noise, else 0. Without `check`, the model as trained (weight 1), with the
    /// figures that the check would have used.
    pub fn choose_blend(&self, check: bool) -> Blend {
        let n = self.se.len();
        let values = (self.model.total().n as f64 / n.max(1) as f64).max(1.0);
        let total = |v: &[[f64; BLEND_GRID + 1]], g: usize| v.iter().map(|w| w[g]).sum::<f64>() / (n as f64 * values);
        let (r_mse, r_mae) = (total(&self.se, 0), total(&self.ae, 0));
        let rel = |g: usize| total(&self.se, g) / r_mse + total(&self.ae, g) / r_mae;
        let best = (0..=BLEND_GRID).rev().min_by(|&a, &b| rel(a).total_cmp(&rel(b))).unwrap_or(BLEND_GRID);
        // The loss differential per window against Repeat, in the same relative units as the
        // choice, and its Diebold-Mariano statistic (small-sample corrected).
        let h = self.model.horizon;
        // With fewer than two windows per autocovariance the variance is not estimated at all,
        // so such a split holds no evidence either way (NaN: not significant).
        let lag = newey_west_lag(n, h);
        let dm_of = |g: usize| {
            let d: Vec<f64> =
                (0..n).map(|i| ((self.se[i][g] - self.se[i][0]) / r_mse + (self.ae[i][g] - self.ae[i][0]) / r_mae) / values).collect();
            if 2 * lag > n {
                f64::NAN
            } else {
                hln_corrected(diebold_mariano(&d, lag), n, h)
            }
        };
        let (dm, dm_model) = (if best == 0 { f64::NAN } else { dm_of(best) }, dm_of(BLEND_GRID));
        let critical = t_critical(DM_LEVEL_Z, n.saturating_sub(1));
        let significant = dm < critical;
        let kept = match (check, significant) {
            (false, _) => BLEND_GRID,
            (true, true) => best,
            (true, false) => 0,
        };
        let (m_mse, m_mae) = self.model.total().mse_mae();
        Blend {
            alpha: kept as f64 / BLEND_GRID as f64,
            best_alpha: best as f64 / BLEND_GRID as f64,
            dm,
            dm_model,
            critical,
            significant,
            checked: check,
            windows: n,
            horizon: h,
            best_mse: total(&self.se, best),
            best_mae: total(&self.ae, best),
            model_mse: m_mse,
            model_mae: m_mae,
            kept_mse: total(&self.se, kept),
            kept_mae: total(&self.ae, kept),
            repeat_mse: r_mse,
            repeat_mae: r_mae,
        }
    }
}

/// The errors ([`ErrorTable`]) and the trader's figures ([`TradeTable`]) of `model`'s forecasts
/// after the first `n` windows of `w`, in one pass, with each target's `(mean, std)` for the
/// strategy's return in the data's units; with a calibration, the quantile figures of the
/// model's and conformal Repeat's intervals too.
#[allow(clippy::too_many_arguments)]
pub fn trade_table<B: Backend>(
    model: &Forecaster<B>,
    w: &Windows,
    clock: &[i64],
    n: usize,
    batch_size: usize,
    units: Vec<(f64, f64)>,
    cost_bps: f64,
    calibration: Option<&Calibration>,
    device: &B::Device,
) -> Result<(ErrorTable, TradeTable, Option<QuantileTables>), TrainError> {
    let mut errors = ErrorTable::new(units.len(), w.horizon);
    let mut table = TradeTable::new(w.horizon, units, cost_bps);
    let mut q = calibration.map(|c| QuantileTables::new(c, w.horizon));
    let targets = model.target_indices();
    each_forecast(model, w, clock, n, batch_size, device, |i, t, last, p, y| {
        errors.add(t, p, y);
        table.add(t, last, p, y);
        if let (Some(c), Some(q)) = (calibration, q.as_mut()) {
            q.add(c, w, i, (t, targets[t]), (last, p), y, |v| v);
        }
    })?;
    Ok((errors, table, q))
}

/// The quantile calibration of `model` (see [`mamba2_data::quantile`]): its errors and Repeat's
/// after every window of `w` (the validation split), the local scale chosen by a blocked
/// cross-validation; a random walk's intervals where `repeat_kept` (the check against Repeat
/// kept Repeat, `alpha` 0).
#[allow(clippy::too_many_arguments)]
pub fn calibrate<B: Backend>(
    model: &Forecaster<B>,
    w: &Windows,
    clock: &[i64],
    levels: &[f64],
    batch_size: usize,
    repeat_kept: bool,
    device: &B::Device,
) -> Result<Calibration, TrainError> {
    let mut res = Residuals::new(w, model.target_indices());
    each_forecast(model, w, clock, w.len(), batch_size, device, |i, t, last, p, y| res.set(i, t, last, p, y))?;
    Ok(choose_intervals(levels, &res, repeat_kept))
}

/// Quantile figures of a model's and of conformal Repeat's forecasts, scored in the same pass as
/// the point forecasts' ([`trade_table`]).
#[derive(Debug, Clone)]
pub struct QuantileTables {
    /// The model's.
    pub model: IntervalTable,
    /// Conformal Repeat's.
    pub repeat: IntervalTable,
    /// Scratch space: a target's recent values, and one forecast's quantiles.
    recent: Vec<f64>,
    out: Vec<f64>,
}

impl QuantileTables {
    /// Empty tables for `c`'s levels.
    pub fn new(c: &Calibration, horizon: usize) -> Self {
        Self {
            model: IntervalTable::new(&c.model.levels, horizon),
            repeat: IntervalTable::new(&c.repeat.levels, horizon),
            recent: Vec::new(),
            out: Vec::new(),
        }
    }

    /// Scores the model's and conformal Repeat's quantiles of target `t` (feature column `j`)
    /// after window `i` of `w`, for the model's point forecasts `point` made after the value
    /// `last`, against `actual`; `to_units` maps a quantile in `w`'s scale to `actual`'s.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        c: &Calibration,
        w: &Windows,
        i: usize,
        (t, j): (usize, usize),
        (last, point): (f64, &[f64]),
        actual: &[f64],
        to_units: impl Fn(f64) -> f64,
    ) {
        let origin = w.starts[i] + w.lookback - 1;
        for (iv, table, repeat) in [(&c.model, &mut self.model, false), (&c.repeat, &mut self.repeat, true)] {
            iv.recent_in(w.rows, origin, j, &mut self.recent);
            self.out.resize(w.horizon * iv.levels.len(), 0.0);
            let s = iv.scale_of(t, &self.recent);
            if repeat {
                iv.fill(t, s, std::iter::repeat_n(last, w.horizon), &mut self.out);
            } else {
                iv.fill(t, s, point.iter().copied(), &mut self.out);
            }
            self.out.iter_mut().for_each(|v| *v = to_units(*v));
            table.add(&self.out, actual);
        }
    }

    /// Adds what `other` scored (see [`IntervalTable::merge`]).
    pub fn merge(&mut self, other: &QuantileTables) {
        self.model.merge(&other.model);
        self.repeat.merge(&other.repeat);
    }
}
