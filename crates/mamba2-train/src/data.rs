//! CSV time series: loading, chronological splits, z-score scaling fitted on the training rows,
//! and windows of `lookback` inputs and `horizon` targets.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::calendar::parse_time;
use crate::TrainError;

/// A numeric table read from a CSV file: named columns, rows in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The chosen numeric columns, in file order.
    pub columns: Vec<String>,
    /// `rows[t][j]` is column `j` at row `t`.
    pub rows: Vec<Vec<f64>>,
    /// Seconds since 1970-01-01 of each row, when the date column reads as dates (see
    /// [`parse_time`]).
    pub times: Option<Vec<i64>>,
    /// The date column's name, if the file has one.
    pub date_column: Option<String>,
}

/// Which columns to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ColumnChoice {
    /// A date/time column to skip (by default one named `date`, `time`, `datetime` or
    /// `timestamp`, if present).
    pub date_column: Option<String>,
    /// Columns to read; by default every numeric column (first data cell a number) but the
    /// date column.
    pub columns: Option<Vec<String>>,
}

fn split_csv_line(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter().map(|s| s.trim().to_string()).collect()
}

impl Table {
    /// Reads `path`. Every chosen cell must be a finite number; the error names the file, the
    /// line and the column of the first one that is not.
    pub fn from_csv_path(path: &Path, choice: &ColumnChoice) -> Result<Self, TrainError> {
        let text = std::fs::read(path).map_err(|source| TrainError::Io { path: path.display().to_string(), cause: source })?;
        let text =
            String::from_utf8(text).map_err(|_| TrainError::Data { origin: path.display().to_string(), why: "not UTF-8 text".into() })?;
        Self::from_csv_str(&text, &path.display().to_string(), choice)
    }

    /// Parses CSV text (`source` names it in errors).
    pub fn from_csv_str(text: &str, source: &str, choice: &ColumnChoice) -> Result<Self, TrainError> {
        Self::parse(text, source, choice, 0)
    }

    /// One data row that arrives on its own (`stream`), under its `header` line: errors name it
    /// as line `line_number` of `source`.
    pub fn from_header_and_row(
        header: &str,
        row: &str,
        line_number: usize,
        source: &str,
        choice: &ColumnChoice,
    ) -> Result<Self, TrainError> {
        Self::parse(&format!("{header}\n{row}\n"), source, choice, line_number.saturating_sub(2))
    }

    /// `text` as CSV, its line `i` (from 0) named line `i + 1 + skip` in errors.
    fn parse(text: &str, source: &str, choice: &ColumnChoice, skip: usize) -> Result<Self, TrainError> {
        let err = |why: String| TrainError::Data { origin: source.to_string(), why };
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| (if i == 0 { 0 } else { i + skip }, l));
        let (_, header) = lines.next().ok_or_else(|| err("empty file: no header row".into()))?;
        let header = split_csv_line(header);
        if header.iter().all(|h| h.parse::<f64>().is_ok() || parse_time(h).is_some()) {
            return Err(err(format!(
                "the first row ({}) holds only numbers and dates: it looks like data, not a header; add a header row naming the columns",
                header.join(",")
            )));
        }
        for (i, h) in header.iter().enumerate() {
            if let Some(k) = header[..i].iter().position(|x| x == h) {
                return Err(err(format!("column `{h}` appears twice in the header (columns {} and {})", k + 1, i + 1)));
            }
        }
        let date = match &choice.date_column {
            Some(d) => Some(
                header
                    .iter()
                    .position(|h| h == d)
                    .ok_or_else(|| err(format!("unknown date column `{d}` (columns: {})", header.join(", "))))?,
            ),
            None => header.iter().position(|h| ["date", "time", "datetime", "timestamp"].contains(&h.to_ascii_lowercase().as_str())),
        };
        let picked: Vec<usize> = match &choice.columns {
            Some(cols) => cols
                .iter()
                .map(|c| {
                    header.iter().position(|h| h == c).ok_or_else(|| err(format!("unknown column `{c}` (columns: {})", header.join(", "))))
                })
                .collect::<Result<_, _>>()?,
            // Every numeric column: the ones whose first data cell is a number. A text column
            // (an id, a label) is left out; a later bad cell in a numeric column is an error.
            None => {
                let first = lines.clone().next().map(|(_, l)| split_csv_line(l)).unwrap_or_default();
                (0..header.len()).filter(|&i| Some(i) != date && first.get(i).is_none_or(|c| c.parse::<f64>().is_ok())).collect()
            }
        };
        if picked.is_empty() {
            return Err(err("no numeric column to read".into()));
        }
        let mut rows = Vec::new();
        // Time stamps are kept when the first date cell reads as one; then every later cell must.
        let mut times: Option<Vec<i64>> = None;
        for (i, (lineno, line)) in lines.enumerate() {
            let cells = split_csv_line(line);
            if cells.len() != header.len() {
                return Err(err(format!("line {}: {} cells, the header has {}", lineno + 1, cells.len(), header.len())));
            }
            if let Some(d) = date {
                match (i, parse_time(&cells[d]), times.as_mut()) {
                    (0, Some(t), _) => times = Some(vec![t]),
                    (_, Some(t), Some(ts)) => ts.push(t),
                    (_, None, Some(_)) => {
                        return Err(err(format!(
                            "line {}, column `{}`: `{}` is not a date like the rows before it",
                            lineno + 1,
                            header[d],
                            cells[d]
                        )))
                    }
                    _ => {}
                }
            }
            let row = picked
                .iter()
                .map(|&j| {
                    let cell = &cells[j];
                    match cell.parse::<f64>() {
                        _ if cell.is_empty() => Err(err(format!("line {}, column `{}`: empty cell", lineno + 1, header[j]))),
                        Ok(v) if v.is_finite() => Ok(v),
                        Ok(v) => Err(err(format!("line {}, column `{}`: {v} is not a finite number", lineno + 1, header[j]))),
                        Err(_) => Err(err(format!("line {}, column `{}`: `{cell}` is not a number", lineno + 1, header[j]))),
                    }
                })
                .collect::<Result<Vec<f64>, _>>()?;
            rows.push(row);
        }
        if rows.is_empty() {
            return Err(err("header only: no data rows".into()));
        }
        Ok(Self { columns: picked.iter().map(|&j| header[j].clone()).collect(), rows, times, date_column: date.map(|d| header[d].clone()) })
    }

    /// Column indices of `names`, in the given order.
    pub fn indices(&self, names: &[String]) -> Result<Vec<usize>, TrainError> {
        names
            .iter()
            .map(|n| {
                self.columns.iter().position(|c| c == n).ok_or_else(|| TrainError::Data {
                    origin: "columns".into(),
                    why: format!("unknown column `{n}` (columns: {})", self.columns.join(", ")),
                })
            })
            .collect()
    }
}

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
    pub fn ranges(&self, n: usize, l: usize) -> Result<[(usize, usize); 3], TrainError> {
        let (tr, va, te) = match *self {
            Split::Borders { train, val, test } => (train, val, test),
            Split::Fractions { train, val } => {
                if !(train > 0.0 && val >= 0.0 && train + val < 1.0) {
                    return Err(TrainError::Config {
                        why: format!("split fractions train {train}, val {val} must be positive and sum below 1"),
                    });
                }
                let tr = (n as f64 * train).round() as usize;
                let va = tr + (n as f64 * val).round() as usize;
                (tr, va, n)
            }
        };
        if !(tr <= va && va <= te && te <= n) || tr < l {
            return Err(TrainError::Config { why: format!("split borders {tr}, {va}, {te} do not fit {n} rows with lookback {l}") });
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
    pub fn fit(rows: &[Vec<f64>], columns: &[String]) -> Result<Self, TrainError> {
        let c = rows.first().map_or(0, |r| r.len());
        let n = rows.len() as f64;
        let err = |why: String| TrainError::Data { origin: "training rows".into(), why };
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
                    "column `{}` is constant ({m}) on the {} training rows, so it has no scale; leave it out with --columns",
                    name(j),
                    rows.len()
                )));
            }
            mean.push(m);
            std.push(v.sqrt());
        }
        Ok(Self { mean, std })
    }

    /// `(x - mean) / std`, row by row.
    pub fn transform(&self, rows: &[Vec<f64>]) -> Vec<Vec<f64>> {
        rows.iter().map(|r| r.iter().enumerate().map(|(j, v)| (v - self.mean[j]) / self.std[j]).collect()).collect()
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
    pub fn new(rows: &'a [Vec<f64>], range: (usize, usize), lookback: usize, horizon: usize, stride: usize) -> Result<Self, TrainError> {
        let (a, b) = range;
        if stride == 0 {
            return Err(TrainError::Config { why: "stride must be at least 1".into() });
        }
        if b < a + lookback + horizon {
            return Err(TrainError::Config {
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
    let usable = windows.len() / batch_size * batch_size;
    let mut table = ErrorTable::new(targets.len(), windows.horizon);
    for i in 0..usable {
        let s = windows.starts[i];
        let last = &windows.rows[s + windows.lookback - 1];
        for (t, &j) in targets.iter().enumerate() {
            let truth: Vec<f64> = (0..windows.horizon).map(|k| windows.rows[s + windows.lookback + k][j]).collect();
            table.add(t, &vec![last[j]; windows.horizon], &truth);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_columns_are_the_numeric_ones() {
        let csv = "when,id,x,y\n2020,a1,1.5,2\n2021,b2,2.5,3\n";
        let t = Table::from_csv_str(csv, "inline", &ColumnChoice { date_column: Some("when".into()), columns: None }).unwrap();
        assert_eq!(t.columns, ["x", "y"]);
        assert_eq!(t.rows, vec![vec![1.5, 2.0], vec![2.5, 3.0]]);
        assert_eq!(t.times, None, "years alone are not dates");
        let bad = "date,x\n1,2\n2,oops\n";
        let e = Table::from_csv_str(bad, "inline", &ColumnChoice::default()).unwrap_err();
        assert_eq!(e.to_string(), "inline: line 3, column `x`: `oops` is not a number");
    }

    #[test]
    fn quoted_cells_and_fraction_splits() {
        assert_eq!(split_csv_line(r#"a,"b,c","d""e""#), ["a", "b,c", r#"d"e"#]);
        let [tr, va, te] = Split::Fractions { train: 0.7, val: 0.1 }.ranges(100, 10).unwrap();
        assert_eq!((tr, va, te), ((0, 70), (60, 80), (70, 100)));
        let scaler = Scaler::fit(&[vec![1.0], vec![3.0]], &["a".into()]).unwrap();
        assert_eq!((scaler.mean[0], scaler.std[0]), (2.0, 1.0), "population std (ddof 0)");
    }

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
