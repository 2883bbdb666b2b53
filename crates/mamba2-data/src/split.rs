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
            // A panel's series are missing (NaN) where they have no row: each is fitted on the
            // values it has. A wide table has none missing, and this is the plain mean.
            let count = rows.iter().filter(|r| !r[j].is_nan()).count();
            if count == 0 {
                return Err(err(format!("series `{}` has no value in the {} training rows", name(j), rows.len())));
            }
            let n = if count == rows.len() { n } else { count as f64 };
            let m = rows.iter().map(|r| r[j]).filter(|v| !v.is_nan()).sum::<f64>() / n;
            let v = rows.iter().map(|r| r[j]).filter(|v| !v.is_nan()).map(|x| (x - m).powi(2)).sum::<f64>() / n;
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
                // A panel's missing value stays missing.
                if v.is_nan() || z.is_finite() && (z as f32).is_finite() {
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
    /// For a panel with missing values ([`panel`](crate::panel)): per window, the columns that
    /// have a value at every one of its rows, in order. `None` when every column has every
    /// value, as in a wide table.
    pub present: Option<Vec<Vec<usize>>>,
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
        let mut starts: Vec<usize> = (a..=b - lookback - horizon).step_by(stride).collect();
        let span = lookback + horizon;
        let cols = rows.first().map_or(0, Vec::len);
        // Missing values counted per column up to each row: a window has all of a column's
        // values where the count does not change across it.
        let missing_any = rows[a..b].iter().any(|r| r.iter().any(|v| v.is_nan()));
        let present = missing_any.then(|| {
            let mut before = vec![vec![0u32; cols]; b - a + 1];
            for (r, row) in rows[a..b].iter().enumerate() {
                for j in 0..cols {
                    before[r + 1][j] = before[r][j] + u32::from(row[j].is_nan());
                }
            }
            let present: Vec<Vec<usize>> =
                starts.iter().map(|&s| (0..cols).filter(|&j| before[s + span - a][j] == before[s - a][j]).collect()).collect();
            let kept: Vec<(usize, Vec<usize>)> = starts.iter().copied().zip(present).filter(|(_, p)| !p.is_empty()).collect();
            starts = kept.iter().map(|(s, _)| *s).collect();
            kept.into_iter().map(|(_, p)| p).collect::<Vec<_>>()
        });
        if starts.is_empty() {
            return Err(DataError::Config {
                why: format!(
                    "no series has all {span} values (lookback {lookback} + horizon {horizon}) of any window in this split: a series \
                     of a panel needs rows at that many consecutive dates of the panel"
                ),
            });
        }
        Ok(Self { rows, starts, lookback, horizon, present })
    }

    /// The positions `t` in `targets` (column indices) whose column has every value of window
    /// `i`: all of them in a table with none missing.
    pub fn present_targets(&self, i: usize, targets: &[usize]) -> Vec<usize> {
        match &self.present {
            None => (0..targets.len()).collect(),
            Some(p) => (0..targets.len()).filter(|&t| p[i].binary_search(&targets[t]).is_ok()).collect(),
        }
    }

    /// Whether some window lacks some column's values.
    pub fn has_missing(&self) -> bool {
        self.present.is_some()
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
        assert!(w.present.is_none(), "a table with no value missing");
    }

    /// A panel's column is in a window only where it has every value of it; a window that no
    /// column has whole is no window.
    #[test]
    fn a_window_holds_a_column_only_where_it_has_every_value() {
        let nan = f64::NAN;
        // Column 0 whole; column 1 missing at rows 5 and 6; column 2 starting at row 8.
        let rows: Vec<Vec<f64>> =
            (0..14).map(|t| vec![t as f64, if t == 5 || t == 6 { nan } else { 1.0 }, if t < 8 { nan } else { 2.0 }]).collect();
        let w = Windows::new(&rows, (0, 14), 3, 1, 1).unwrap();
        assert_eq!(w.starts, (0..=10).collect::<Vec<_>>());
        let p = w.present.as_ref().unwrap();
        for (i, &s) in w.starts.iter().enumerate() {
            let mut want = vec![0];
            if s + 4 <= 5 || s >= 7 {
                want.push(1);
            }
            if s >= 8 {
                want.push(2);
            }
            assert_eq!(p[i], want, "window at row {s}");
        }
        // Positions among the targets asked for, in their order.
        assert_eq!(w.present_targets(8, &[2, 1]), [0, 1]);
        assert_eq!(w.present_targets(3, &[2, 1]), Vec::<usize>::new());
        // With column 0 gone, the windows over rows 5 and 6 have no column whole.
        let gone: Vec<Vec<f64>> = rows.iter().map(|r| r[1..].to_vec()).collect();
        let w = Windows::new(&gone, (0, 14), 3, 1, 1).unwrap();
        assert_eq!(w.starts, [0, 1, 7, 8, 9, 10]);
        let only_gap: Vec<Vec<f64>> = rows[2..9].iter().map(|r| r[1..2].to_vec()).collect();
        let e = Windows::new(&only_gap, (0, 7), 3, 1, 1).unwrap_err().to_string();
        assert!(e.contains("no series has all 4 values"), "{e}");
    }

    /// Each column's scale comes from the values it has; a missing value stays missing, and a
    /// column with none in the training rows is an error naming it.
    #[test]
    fn the_scaler_fits_each_column_on_the_values_it_has() {
        let nan = f64::NAN;
        let rows = vec![vec![1.0, nan], vec![3.0, 10.0], vec![5.0, 20.0], vec![7.0, nan]];
        let names = ["a".to_string(), "b".to_string()];
        let s = Scaler::fit(&rows, &names).unwrap();
        assert_eq!((s.mean[0], s.mean[1]), (4.0, 15.0));
        assert_eq!((s.std[0], s.std[1]), (5f64.sqrt(), 5.0));
        let t = s.transform(&rows, &names).unwrap();
        assert!(t[0][1].is_nan() && t[1][1] == -1.0);
        let e = Scaler::fit(&[vec![1.0, nan], vec![2.0, nan]], &names).unwrap_err().to_string();
        assert_eq!(e, "training rows: series `b` has no value in the 2 training rows");
    }
}
