//! Time series from CSV or Parquet: loading, chronological splits, z-score scaling fitted on the training rows,
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

/// One cell as a reader found it: text (CSV, Parquet strings), a typed number or time
/// (Parquet), or nothing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell {
    Text(String),
    Number(f64),
    /// Seconds since 1970-01-01.
    Time(i64),
    Null,
}

impl Cell {
    fn is_number(&self) -> bool {
        match self {
            Cell::Number(_) => true,
            Cell::Text(t) => t.parse::<f64>().is_ok(),
            Cell::Time(_) | Cell::Null => false,
        }
    }

    fn time(&self) -> Option<i64> {
        match self {
            Cell::Time(t) => Some(*t),
            Cell::Text(t) => parse_time(t),
            Cell::Number(_) | Cell::Null => None,
        }
    }

    fn shown(&self) -> String {
        match self {
            Cell::Text(t) => t.clone(),
            Cell::Number(v) => v.to_string(),
            Cell::Time(t) => format!("the time {t} s"),
            Cell::Null => "null".into(),
        }
    }
}

/// `v` as a user would write it: plain for everyday sizes, in exponent form for tiny and huge
/// ones (not 200 digits of zeros).
fn short(v: f64) -> String {
    if v != 0.0 && !(1e-4..1e15).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// Where rows come from, for error messages: CSV rows are named by their line in the file,
/// Parquet rows by their number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowNames {
    Lines,
    Rows,
}

/// Whether `bytes` open like a Parquet file (its magic number).
pub fn is_parquet(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PAR1")
}

impl Table {
    /// Reads `path`: a Parquet file (recognised by its first bytes, whatever its name) or CSV
    /// text. Every chosen cell must be a finite number; the error names the file, the line (or
    /// the Parquet row) and the column of the first one that is not.
    pub fn from_path(path: &Path, choice: &ColumnChoice) -> Result<Self, TrainError> {
        let bytes = std::fs::read(path).map_err(|source| TrainError::Io { path: path.display().to_string(), cause: source })?;
        let origin = path.display().to_string();
        if is_parquet(&bytes) {
            return crate::parquet_input::read(bytes, &origin, choice);
        }
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet")) {
            return Err(TrainError::Data { origin, why: "named .parquet but not a Parquet file (it does not start with PAR1)".into() });
        }
        let text = String::from_utf8(bytes).map_err(|e| TrainError::Data {
            origin: origin.clone(),
            why: format!("not UTF-8 text (invalid byte at offset {}); CSV must be UTF-8", e.utf8_error().valid_up_to()),
        })?;
        Self::from_csv_str(&text, &origin, choice)
    }

    /// Reads the CSV file at `path` (see [`Table::from_path`], which also reads Parquet).
    pub fn from_csv_path(path: &Path, choice: &ColumnChoice) -> Result<Self, TrainError> {
        Self::from_path(path, choice)
    }

    /// Parses CSV text (`source` names it in errors): RFC 4180 quoting, CRLF or LF line ends, a
    /// UTF-8 byte order mark, cells trimmed, blank lines skipped.
    pub fn from_csv_str(text: &str, source: &str, choice: &ColumnChoice) -> Result<Self, TrainError> {
        Self::parse_csv(text, source, choice, 0)
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
        Self::parse_csv(&format!("{header}\n{row}\n"), source, choice, line_number.saturating_sub(2))
    }

    /// `text` as CSV, its data lines numbered from the file's (plus `skip`) in errors.
    fn parse_csv(text: &str, source: &str, choice: &ColumnChoice, skip: usize) -> Result<Self, TrainError> {
        let err = |why: String| TrainError::Data { origin: source.to_string(), why };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
        let mut records = reader.records().filter_map(|r| match r {
            // A line of spaces alone is blank too (csv skips only empty ones).
            Ok(rec) if rec.len() == 1 && rec[0].is_empty() => None,
            Ok(rec) => {
                let line = rec.position().map_or(0, |p| p.line() as usize);
                Some(Ok((line, rec.iter().map(|c| Cell::Text(c.to_string())).collect::<Vec<_>>())))
            }
            Err(e) => Some(Err(err(format!("{}not CSV: {e}", e.position().map_or(String::new(), |p| format!("line {}: ", p.line())))))),
        });
        let (_, header) = records.next().transpose()?.ok_or_else(|| err("empty file: no header row".into()))?;
        let header: Vec<String> = header.into_iter().map(|c| if let Cell::Text(t) = c { t } else { String::new() }).collect();
        if header.iter().all(|h| h.parse::<f64>().is_ok() || parse_time(h).is_some()) {
            return Err(err(format!(
                "the first row ({}) holds only numbers and dates: it looks like data, not a header; add a header row naming the columns",
                header.join(",")
            )));
        }
        let rows = records.map(|r| r.map(|(line, cells)| (line + skip, cells)));
        Self::from_cells(header, rows, source, choice, RowNames::Lines)
    }

    /// The table of `header` and `rows` (each with its line or row number for errors): the
    /// checks every reader shares.
    pub(crate) fn from_cells(
        header: Vec<String>,
        rows: impl Iterator<Item = Result<(usize, Vec<Cell>), TrainError>>,
        source: &str,
        choice: &ColumnChoice,
        names: RowNames,
    ) -> Result<Self, TrainError> {
        let err = |why: String| TrainError::Data { origin: source.to_string(), why };
        let at = |n: usize| match names {
            RowNames::Lines => format!("line {n}"),
            RowNames::Rows => format!("row {n}"),
        };
        for (i, h) in header.iter().enumerate() {
            if let Some(k) = header[..i].iter().position(|x| x == h) {
                return Err(err(format!("column `{h}` appears twice in the header (columns {} and {})", k + 1, i + 1)));
            }
        }
        let mut rows = rows.peekable();
        let first: Vec<Cell> = match rows.peek() {
            Some(Ok((_, cells))) => cells.clone(),
            Some(Err(_)) => return Err(rows.next().expect("peeked").expect_err("peeked an error")),
            None => Vec::new(),
        };
        let date = match &choice.date_column {
            Some(d) => Some(
                header
                    .iter()
                    .position(|h| h == d)
                    .ok_or_else(|| err(format!("unknown date column `{d}` (columns: {})", header.join(", "))))?,
            ),
            // A column named like a date, else the first whose cells are typed times (Parquet).
            None => header
                .iter()
                .position(|h| ["date", "time", "datetime", "timestamp"].contains(&h.to_ascii_lowercase().as_str()))
                .or_else(|| first.iter().position(|c| matches!(c, Cell::Time(_)))),
        };
        let picked: Vec<usize> = match &choice.columns {
            Some(cols) => cols
                .iter()
                .map(|c| {
                    header.iter().position(|h| h == c).ok_or_else(|| err(format!("unknown column `{c}` (columns: {})", header.join(", "))))
                })
                .collect::<Result<_, _>>()?,
            // Every numeric column: the ones whose first data cell is a number (or empty, so
            // that the empty cell is reported). A text column (an id, a label) is left out; a
            // later bad cell in a numeric column is an error.
            None => (0..header.len())
                .filter(|&i| {
                    Some(i) != date
                        && first.get(i).is_none_or(|c| c.is_number() || matches!(c, Cell::Null) || *c == Cell::Text(String::new()))
                })
                .collect(),
        };
        if picked.is_empty() {
            return Err(err("no numeric column to read".into()));
        }
        let mut table_rows = Vec::new();
        // Time stamps are kept when the first date cell reads as one; then every later cell must.
        let mut times: Option<Vec<i64>> = None;
        for (i, row) in rows.enumerate() {
            let (n, cells) = row?;
            if cells.len() != header.len() {
                return Err(err(format!("{}: {} cells, the header has {}", at(n), cells.len(), header.len())));
            }
            if let Some(d) = date {
                match (i, cells[d].time(), times.as_mut()) {
                    (0, Some(t), _) => times = Some(vec![t]),
                    (_, Some(t), Some(ts)) => ts.push(t),
                    (_, None, Some(_)) => {
                        return Err(err(format!(
                            "{}, column `{}`: `{}` is not a date like the rows before it",
                            at(n),
                            header[d],
                            cells[d].shown()
                        )))
                    }
                    _ => {}
                }
            }
            let row = picked
                .iter()
                .map(|&j| {
                    let bad = |what: String| Err(err(format!("{}, column `{}`: {what}", at(n), header[j])));
                    match &cells[j] {
                        Cell::Null => bad("empty cell".into()),
                        Cell::Text(t) if t.is_empty() => bad("empty cell".into()),
                        Cell::Number(v) if v.is_finite() => Ok(*v),
                        Cell::Number(v) => bad(format!("{v} is not a finite number")),
                        Cell::Time(_) => bad("a timestamp, not a number (name it with --date-column)".into()),
                        Cell::Text(t) => match t.parse::<f64>() {
                            Ok(v) if v.is_finite() => Ok(v),
                            Ok(v) => bad(format!("{v} is not a finite number")),
                            Err(_) => bad(format!("`{t}` is not a number")),
                        },
                    }
                })
                .collect::<Result<Vec<f64>, _>>()?;
            table_rows.push(row);
        }
        if table_rows.is_empty() {
            return Err(err("header only: no data rows".into()));
        }
        Ok(Self {
            columns: picked.iter().map(|&j| header[j].clone()).collect(),
            rows: table_rows,
            times,
            date_column: date.map(|d| header[d].clone()),
        })
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
    pub fn transform(&self, rows: &[Vec<f64>], columns: &[String]) -> Result<Vec<Vec<f64>>, TrainError> {
        rows.iter().enumerate().map(|(t, r)| self.transform_row(r, columns, &format!("data row {}", t + 1))).collect()
    }

    /// One row scaled as by [`transform`](Self::transform); errors name it `at`.
    pub fn transform_row(&self, row: &[f64], columns: &[String], at: &str) -> Result<Vec<f64>, TrainError> {
        row.iter()
            .enumerate()
            .map(|(j, v)| {
                let z = (v - self.mean[j]) / self.std[j];
                if z.is_finite() && (z as f32).is_finite() {
                    return Ok(z);
                }
                let name = columns.get(j).cloned().unwrap_or_else(|| format!("#{}", j + 1));
                Err(TrainError::Data {
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
        let t =
            Table::from_csv_str("\u{feff}x,\"y,z\",w\r\n1,\"2.5\",\"a \"\"q\"\"\"\r\n\r\n3, 4 ,b\r\n", "inline", &ColumnChoice::default())
                .unwrap();
        assert_eq!(t.columns, ["x", "y,z"], "BOM stripped, quoted header, text column left out");
        assert_eq!(t.rows, [[1.0, 2.5], [3.0, 4.0]], "CRLF, quotes, blank line, spaces");
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
