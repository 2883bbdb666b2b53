//! Chronological splits, z-score scaling fitted on the training rows, and windows of
//! `lookback` inputs and `horizon` targets.

use serde::{Deserialize, Serialize};

use crate::table::short;
use crate::DataError;

/// How rows are split into train, validation and test, in time order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Split {
    /// The ETT protocol's row borders: train `[0, train)`, validation `[train - L, val)`, test
    /// `[val - L, test)` (ETTh1: 8640, 11520, 14400).
    Borders {
        /// End of the training rows.
        train: usize,
        /// End of the validation rows.
        val: usize,
        /// End of the test rows.
        test: usize,
    },
    /// Fractions of all rows for training and validation; the rest is test. Validation and test
    /// windows reach `L` rows back into the previous split, as in the protocol.
    Fractions {
        /// Share of rows for training.
        train: f64,
        /// Share of rows for validation.
        val: f64,
    },
}

impl Split {
    /// The ETTh1 protocol.
    pub const ETTH1: Split = Split::Borders { train: 8640, val: 11520, test: 14400 };

    /// `[start, end)` row ranges of train, validation and test for `n` rows and lookback `l`.
    pub fn ranges(&self, n: usize, l: usize) -> Result<[(usize, usize); 3], DataError> {
        let (tr, va, te) = match *self {
            Split::Borders { train, val, test } => (train, val, test),
            Split::Fractions { train, val } => {
                if !(train > 0.0 && val >= 0.0 && train + val < 1.0) {
                    return Err(DataError::Config {
                        why: format!("split fractions train {train}, val {val} must be positive and sum below 1"),
                    });
                }
                let tr = (n as f64 * train).round() as usize;
                let va = tr + (n as f64 * val).round() as usize;
                (tr, va, n)
            }
        };
        if !(tr <= va && va <= te && te <= n) || tr < l {
            return Err(DataError::Config { why: format!("split borders {tr}, {va}, {te} do not fit {n} rows with lookback {l}") });
        }
        Ok([(0, tr), (tr - l, va), (va - l, te)])
    }
}

/// Per-column z-score scaling, fitted on training rows only (population std, ddof 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scaler {
    /// Column means.
    pub mean: Vec<f64>,
    /// Column standard deviations (positive: a constant column is an error).
    pub std: Vec<f64>,
}

impl Scaler {
    /// Fits on `rows`, the training rows of the columns named `columns`. A column that is
    /// constant there has no scale, and one whose values are so large that their variance is
    /// not a finite number cannot be scaled: both are errors naming the column.
    pub fn fit(rows: &[Vec<f64>], columns: &[String]) -> Result<Self, DataError> {
        let c = rows.first().map_or(0, |r| r.len());
        let n = rows.len() as f64;
        let err = |why: String| DataError::Data { origin: "training rows".into(), why };
        let name = |j: usize| columns.get(j).cloned().unwrap_or_else(|| format!("#{}", j + 1));
        if rows.is_empty() {
            return Err(err("no training rows to fit the scaler on".into()));
        }
        let mut mean = Vec::with_capacity(c);
        let mut std = Vec::with_capacity(c);
        for j in 0..c {
            let m = rows.iter().map(|r| r[j]).sum::<f64>() / n;
            let v = rows.iter().map(|r| (r[j] - m).powi(2)).sum::<f64>() / n;
            if !(m.is_finite() && v.is_finite()) {
                return Err(err(format!(
                    "column `{}`: values too large to scale (their mean or variance over the {} training rows is not a finite number)",
                    name(j),
                    rows.len()
                )));
            }
            if v <= 0.0 || m + v.sqrt() == m {
                return Err(err(format!(
                    "column `{}` is constant ({}) on the {} training rows, so it has no scale; leave it out with --columns",
                    name(j),
                    short(m),
                    rows.len()
                )));
            }
            mean.push(m);
            std.push(v.sqrt());
        }
        Ok(Self { mean, std })
    }

    /// `(x - mean) / std`, row by row. A value so far from the training rows that its scaled
    /// value is not a finite `f32` (the models' usual float) is an error naming its data row
    /// (from 1) and column (`columns[j]`), since no model could read it.
    pub fn transform(&self, rows: &[Vec<f64>], columns: &[String]) -> Result<Vec<Vec<f64>>, DataError> {
        rows.iter().enumerate().map(|(t, r)| self.transform_row(r, columns, &format!("data row {}", t + 1))).collect()
    }

    /// One row scaled as by [`transform`](Self::transform); errors name it `at`.
    pub fn transform_row(&self, row: &[f64], columns: &[String], at: &str) -> Result<Vec<f64>, DataError> {
        row.iter()
            .enumerate()
            .map(|(j, v)| {
                let z = (v - self.mean[j]) / self.std[j];
                if z.is_finite() && (z as f32).is_finite() {
                    return Ok(z);
                }
                let name = columns.get(j).cloned().unwrap_or_else(|| format!("#{}", j + 1));
                Err(DataError::Data {
                    origin: format!("{at}, column `{name}`"),
                    why: format!(
                        "{} lies {z:.1e} standard deviations from the training rows' mean {}: too far to scale",
                        short(*v),
                        short(self.mean[j])
                    ),
                })
            })
            .collect()
    }

    /// Undoes [`transform`](Self::transform) for column `j`.
    pub fn inverse(&self, j: usize, v: f64) -> f64 {
        v * self.std[j] + self.mean[j]
    }
}

/// Windows over a row range: input rows `[s, s + lookback)`, target rows
/// `[s + lookback, s + lookback + horizon)`, for every start `s` with the given stride.
#[derive(Debug, Clone)]
pub struct Windows<'a> {
    /// The (scaled) rows.
    pub rows: &'a [Vec<f64>],
    /// Window starts.
    pub starts: Vec<usize>,
    /// Input length.
    pub lookback: usize,
    /// Target length.
    pub horizon: usize,
}

impl<'a> Windows<'a> {
    /// All windows that fit inside `range` of `rows`.
    pub fn new(rows: &'a [Vec<f64>], range: (usize, usize), lookback: usize, horizon: usize, stride: usize) -> Result<Self, DataError> {
        let (a, b) = range;
        if stride == 0 {
            return Err(DataError::Config { why: "stride must be at least 1".into() });
        }
        if b < a + lookback + horizon {
            return Err(DataError::Config {
                why: format!(
                    "lookback {lookback} + horizon {horizon} = {} rows do not fit in the {} rows of this split",
                    lookback + horizon,
                    b.saturating_sub(a)
                ),
            });
        }
        let starts = (a..=b - lookback - horizon).step_by(stride).collect();
        Ok(Self { rows, starts, lookback, horizon })
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether there is no window.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Inputs `[n, lookback, C]` and targets `[n, horizon, T]` (columns `targets`) of the
    /// windows `idx`, flattened row-major.
    pub fn gather(&self, idx: &[usize], targets: &[usize]) -> (Vec<f64>, Vec<f64>) {
        let mut x = Vec::with_capacity(idx.len() * self.lookback * self.rows[0].len());
        let mut y = Vec::with_capacity(idx.len() * self.horizon * targets.len());
        for &i in idx {
            let s = self.starts[i];
            for r in &self.rows[s..s + self.lookback] {
                x.extend_from_slice(r);
            }
            for r in &self.rows[s + self.lookback..s + self.lookback + self.horizon] {
                y.extend(targets.iter().map(|&j| r[j]));
            }
        }
        (x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_every_start_and_batches_may_be_partial() {
        let rows: Vec<Vec<f64>> = (0..10).map(|t| vec![t as f64, -(t as f64)]).collect();
        let w = Windows::new(&rows, (0, 10), 3, 2, 1).unwrap();
        assert_eq!(w.starts, [0, 1, 2, 3, 4, 5]);
        let (x, y) = w.gather(&[5], &[1]);
        assert_eq!(x, [5.0, -5.0, 6.0, -6.0, 7.0, -7.0]);
        assert_eq!(y, [-8.0, -9.0]);
        let w2 = Windows::new(&rows, (0, 10), 3, 2, 4).unwrap();
        assert_eq!(w2.starts, [0, 4]);
        assert!(Windows::new(&rows, (0, 4), 3, 2, 1).is_err());
    }
}
