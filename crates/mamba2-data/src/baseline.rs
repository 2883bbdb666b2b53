//! Forecast errors per target and step, and the Repeat baseline (the last value, held).

use crate::split::Windows;

/// Mean squared and mean absolute error of `pred` against `truth`, accumulated in f64.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ErrorSums {
    /// Sum of squared errors.
    pub se: f64,
    /// Sum of absolute errors.
    pub ae: f64,
    /// Number of values.
    pub n: usize,
}

impl ErrorSums {
    /// Adds a batch.
    pub fn add(&mut self, pred: &[f64], truth: &[f64]) {
        for (p, t) in pred.iter().zip(truth) {
            self.se += (p - t).powi(2);
            self.ae += (p - t).abs();
        }
        self.n += pred.len();
    }

    /// Both sums together.
    pub fn merge(&self, other: &ErrorSums) -> ErrorSums {
        ErrorSums { se: self.se + other.se, ae: self.ae + other.ae, n: self.n + other.n }
    }

    /// `(MSE, MAE)`.
    pub fn mse_mae(&self) -> (f64, f64) {
        (self.se / self.n as f64, self.ae / self.n as f64)
    }
}

/// Errors per target and forecast step: `sums[t * horizon + k]` for target `t`, step `k + 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorTable {
    /// Targets.
    pub targets: usize,
    /// Forecast steps.
    pub horizon: usize,
    /// The sums, target-major.
    pub sums: Vec<ErrorSums>,
}

impl ErrorTable {
    /// An empty table.
    pub fn new(targets: usize, horizon: usize) -> Self {
        Self { targets, horizon, sums: vec![ErrorSums::default(); targets * horizon] }
    }

    /// Adds one forecast of target `t` (its `horizon` steps) against what followed.
    pub fn add(&mut self, t: usize, pred: &[f64], truth: &[f64]) {
        for (k, (p, y)) in pred.iter().zip(truth).enumerate() {
            self.sums[t * self.horizon + k].add(&[*p], &[*y]);
        }
    }

    /// Everything together.
    pub fn total(&self) -> ErrorSums {
        self.sums.iter().fold(ErrorSums::default(), |a, b| a.merge(b))
    }

    /// Target `t` over every step.
    pub fn target(&self, t: usize) -> ErrorSums {
        self.sums[t * self.horizon..(t + 1) * self.horizon].iter().fold(ErrorSums::default(), |a, b| a.merge(b))
    }

    /// Step `k + 1` over every target.
    pub fn step(&self, k: usize) -> ErrorSums {
        (0..self.targets).fold(ErrorSums::default(), |a, t| a.merge(&self.sums[t * self.horizon + k]))
    }
}

/// The Repeat baseline: forecast every step as the last observed value. Batches of
/// `batch_size` windows in order, the last partial batch dropped (the protocol's test loader).
pub fn repeat_baseline(windows: &Windows, targets: &[usize], batch_size: usize) -> (f64, f64) {
    repeat_table(windows, targets, batch_size).total().mse_mae()
}

/// [`repeat_baseline`]'s errors per target and step.
pub fn repeat_table(windows: &Windows, targets: &[usize], batch_size: usize) -> ErrorTable {
    naive_table(windows, targets, batch_size, |end, _| end)
}

/// The seasonal naive forecast's errors per target and step: step `k` is the value of the row
/// a whole number of `period`s before `t + k`, the latest that the window shows (`t` its last
/// row). Batches as in [`repeat_baseline`].
pub fn seasonal_table(windows: &Windows, targets: &[usize], period: usize, batch_size: usize) -> ErrorTable {
    let p = period.max(1);
    naive_table(windows, targets, batch_size, |end, k| (end + k).saturating_sub(p * k.div_ceil(p)))
}

/// The errors of a forecast that copies a past row: `source(t, k)` is the row whose value
/// forecasts step `k` (from 1) after the window's last row `t`.
fn naive_table(windows: &Windows, targets: &[usize], batch_size: usize, source: impl Fn(usize, usize) -> usize) -> ErrorTable {
    let usable = windows.len() / batch_size * batch_size;
    let mut table = ErrorTable::new(targets.len(), windows.horizon);
    for i in 0..usable {
        let end = windows.starts[i] + windows.lookback - 1;
        for t in windows.present_targets(i, targets) {
            let j = targets[t];
            let pred: Vec<f64> = (1..=windows.horizon).map(|k| windows.rows[source(end, k)][j]).collect();
            let truth: Vec<f64> = (1..=windows.horizon).map(|k| windows.rows[end + k][j]).collect();
            table.add(t, &pred, &truth);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seasonal_naive_copies_the_last_period() {
        // A pure cycle of period 3 plus a jump: the seasonal forecast is exact before the jump.
        let rows: Vec<Vec<f64>> = (0..12).map(|i| vec![[1.0, 5.0, 2.0][i % 3] + if i >= 11 { 10.0 } else { 0.0 }]).collect();
        let w = Windows::new(&rows, (0, 12), 4, 4, 1).unwrap();
        let s = seasonal_table(&w, &[0], 3, 1);
        // Windows start 0..=4; only the last (start 4, forecasting rows 8..=11) sees the jump,
        // on its fourth step: one error of 10 among 5 * 4 values.
        assert_eq!(s.total().n, 20);
        assert!((s.total().se - 100.0).abs() < 1e-12 && (s.step(3).se - 100.0).abs() < 1e-12);
        // Repeat misses the cycle on every step.
        let r = repeat_table(&w, &[0], 1);
        assert!(r.total().se > 100.0);
        // Period 1 is Repeat.
        assert_eq!(seasonal_table(&w, &[0], 1, 1), r);
    }
}
