//! Tables of numbers from CSV or Parquet files, with the date column's time stamps.

use std::path::Path;

use crate::calendar::parse_time;
use crate::cell::Cell;
use crate::DataError;

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
    /// Columns left empty in the table's last rows, the rows ahead: rows that give only the
    /// values known in advance (future covariates) of the rows after the history. A row whose
    /// cells of these columns are all empty is such a row, and they read as NaN there; those
    /// rows must come last. Elsewhere an empty cell is an error as usual. Empty: none.
    pub open_end: Vec<String>,
}

/// `v` as a user would write it: plain for everyday sizes, in exponent form for tiny and huge
/// ones (not 200 digits of zeros).
pub(crate) fn short(v: f64) -> String {
    if v != 0.0 && !(1e-4..1e15).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// Where rows come from, for error messages: CSV rows are named by their line in the file,
/// Parquet rows by their number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "parquet"), allow(dead_code))]
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
    pub fn from_path(path: &Path, choice: &ColumnChoice) -> Result<Self, DataError> {
        Self::read_path(path, choice, None).map(|(table, _)| table)
    }

    /// [`from_path`](Self::from_path) of a file in long format, whose column `id_column` names
    /// each row's series: the table of the other columns, and each row's id (a number's cell
    /// as written). An empty id is an error naming its line (or Parquet row).
    pub fn from_path_with_ids(path: &Path, id_column: &str, choice: &ColumnChoice) -> Result<(Self, Vec<String>), DataError> {
        Self::read_path(path, choice, Some(id_column))
    }

    fn read_path(path: &Path, choice: &ColumnChoice, id_column: Option<&str>) -> Result<(Self, Vec<String>), DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.display().to_string(), cause: source })?;
        let origin = path.display().to_string();
        if is_parquet(&bytes) {
            #[cfg(feature = "parquet")]
            {
                let (header, columns) = crate::parquet_input::read(bytes, &origin)?;
                let n = columns.first().map_or(0, Vec::len);
                let mut cells: Vec<_> = columns.into_iter().map(|c| c.into_iter()).collect();
                let rows = (0..n).map(move |r| Ok((r + 1, cells.iter_mut().map(|c| c.next().unwrap_or(Cell::Null)).collect())));
                return Self::split_ids(header, rows, &origin, choice, RowNames::Rows, id_column);
            }
            #[cfg(not(feature = "parquet"))]
            return Err(DataError::Data {
                origin,
                why: "a Parquet file, and this build reads none (mamba2-data's `parquet` feature)".into(),
            });
        }
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet")) {
            return Err(DataError::Data { origin, why: "named .parquet but not a Parquet file (it does not start with PAR1)".into() });
        }
        let text = String::from_utf8(bytes).map_err(|e| DataError::Data {
            origin: origin.clone(),
            why: format!("not UTF-8 text (invalid byte at offset {}); CSV must be UTF-8", e.utf8_error().valid_up_to()),
        })?;
        Self::parse_csv_ids(&text, &origin, choice, 0, id_column)
    }

    /// [`from_cells`](Self::from_cells) of every column but `id_column` (when given), and the
    /// ids it held.
    fn split_ids(
        mut header: Vec<String>,
        rows: impl Iterator<Item = Result<(usize, Vec<Cell>), DataError>>,
        source: &str,
        choice: &ColumnChoice,
        names: RowNames,
        id_column: Option<&str>,
    ) -> Result<(Self, Vec<String>), DataError> {
        let Some(name) = id_column else {
            return Ok((Self::from_cells(header, rows, source, choice, names)?, Vec::new()));
        };
        let err = |why: String| DataError::Data { origin: source.to_string(), why };
        let k =
            header.iter().position(|h| h == name).ok_or_else(|| err(format!("no id column `{name}` (columns: {})", header.join(", "))))?;
        header.remove(k);
        let mut ids = Vec::new();
        let mut kept = Vec::new();
        for row in rows {
            let (n, mut cells) = row?;
            let at = match names {
                RowNames::Lines => format!("line {n}"),
                RowNames::Rows => format!("row {n}"),
            };
            let id = match cells.get(k) {
                Some(Cell::Null) | None => String::new(),
                Some(Cell::Time(_)) => return Err(err(format!("{at}, column `{name}`: a timestamp is not an id"))),
                Some(c) => c.shown(),
            };
            if id.is_empty() {
                return Err(err(format!("{at}, column `{name}`: no id")));
            }
            cells.remove(k);
            ids.push(id);
            kept.push(Ok((n, cells)));
        }
        // A long file's rows ahead come after each id's own rows, which the pivot checks: they
        // may be interleaved with other ids' rows.
        Ok((Self::from_cells_ahead(header, kept.into_iter(), source, choice, names, false)?, ids))
    }

    /// Reads the CSV file at `path` (see [`Table::from_path`], which also reads Parquet).
    pub fn from_csv_path(path: &Path, choice: &ColumnChoice) -> Result<Self, DataError> {
        Self::from_path(path, choice)
    }

    /// Parses CSV text (`source` names it in errors): RFC 4180 quoting, CRLF or LF line ends, a
    /// UTF-8 byte order mark, cells trimmed, blank lines skipped.
    pub fn from_csv_str(text: &str, source: &str, choice: &ColumnChoice) -> Result<Self, DataError> {
        Self::parse_csv(text, source, choice, 0)
    }

    /// [`from_path_with_ids`](Self::from_path_with_ids) of CSV text.
    pub fn from_csv_str_with_ids(
        text: &str,
        source: &str,
        id_column: &str,
        choice: &ColumnChoice,
    ) -> Result<(Self, Vec<String>), DataError> {
        Self::parse_csv_ids(text, source, choice, 0, Some(id_column))
    }

    /// One data row that arrives on its own (`stream`), under its `header` line: errors name it
    /// as line `line_number` of `source`.
    pub fn from_header_and_row(
        header: &str,
        row: &str,
        line_number: usize,
        source: &str,
        choice: &ColumnChoice,
    ) -> Result<Self, DataError> {
        Self::parse_csv(&format!("{header}\n{row}\n"), source, choice, line_number.saturating_sub(2))
    }

    /// `text` as CSV, its data lines numbered from the file's (plus `skip`) in errors.
    fn parse_csv(text: &str, source: &str, choice: &ColumnChoice, skip: usize) -> Result<Self, DataError> {
        Self::parse_csv_ids(text, source, choice, skip, None).map(|(table, _)| table)
    }

    fn parse_csv_ids(
        text: &str,
        source: &str,
        choice: &ColumnChoice,
        skip: usize,
        id_column: Option<&str>,
    ) -> Result<(Self, Vec<String>), DataError> {
        let err = |why: String| DataError::Data { origin: source.to_string(), why };
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
        Self::split_ids(header, rows, source, choice, RowNames::Lines, id_column)
    }

    /// The table of `header` and `rows` (each with its line or row number for errors): the
    /// checks every reader shares.
    pub(crate) fn from_cells(
        header: Vec<String>,
        rows: impl Iterator<Item = Result<(usize, Vec<Cell>), DataError>>,
        source: &str,
        choice: &ColumnChoice,
        names: RowNames,
    ) -> Result<Self, DataError> {
        Self::from_cells_ahead(header, rows, source, choice, names, true)
    }

    /// [`from_cells`](Self::from_cells), where `ahead_last` says whether rows ahead
    /// ([`ColumnChoice::open_end`]) must be the table's last rows.
    fn from_cells_ahead(
        header: Vec<String>,
        rows: impl Iterator<Item = Result<(usize, Vec<Cell>), DataError>>,
        source: &str,
        choice: &ColumnChoice,
        names: RowNames,
        ahead_last: bool,
    ) -> Result<Self, DataError> {
        let err = |why: String| DataError::Data { origin: source.to_string(), why };
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
        let open: Vec<usize> = picked.iter().copied().filter(|&j| choice.open_end.contains(&header[j])).collect();
        // The line of the first row ahead, once there is one.
        let mut ahead_from: Option<usize> = None;
        for (i, row) in rows.enumerate() {
            let (n, cells) = row?;
            if cells.len() != header.len() {
                return Err(err(format!("{}: {} cells, the header has {}", at(n), cells.len(), header.len())));
            }
            let empty = |c: &Cell| matches!(c, Cell::Null) || *c == Cell::Text(String::new());
            let is_ahead = !open.is_empty() && open.iter().all(|&j| empty(&cells[j]));
            match (is_ahead, ahead_from) {
                (true, None) => ahead_from = Some(n),
                (false, Some(first)) if ahead_last => {
                    return Err(err(format!(
                        "{}: a row with values after the rows ahead (the first at {}, with {} empty); the rows ahead come last",
                        at(n),
                        at(first),
                        open.iter().map(|&j| format!("`{}`", header[j])).collect::<Vec<_>>().join(", ")
                    )))
                }
                _ => {}
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
                    if is_ahead && open.contains(&j) {
                        return Ok(f64::NAN);
                    }
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
    pub fn indices(&self, names: &[String]) -> Result<Vec<usize>, DataError> {
        names
            .iter()
            .map(|n| {
                self.columns.iter().position(|c| c == n).ok_or_else(|| DataError::Data {
                    origin: "columns".into(),
                    why: format!("unknown column `{n}` (columns: {})", self.columns.join(", ")),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Scaler, Split};

    #[test]
    fn default_columns_are_the_numeric_ones() {
        let csv = "when,id,x,y\n2020,a1,1.5,2\n2021,b2,2.5,3\n";
        let t = Table::from_csv_str(csv, "inline", &ColumnChoice { date_column: Some("when".into()), columns: None, ..Default::default() })
            .unwrap();
        assert_eq!(t.columns, ["x", "y"]);
        assert_eq!(t.rows, vec![vec![1.5, 2.0], vec![2.5, 3.0]]);
        assert_eq!(t.times, None, "years alone are not dates");
        let bad = "date,x\n1,2\n2,oops\n";
        let e = Table::from_csv_str(bad, "inline", &ColumnChoice::default()).unwrap_err();
        assert_eq!(e.to_string(), "inline: line 3, column `x`: `oops` is not a number");
    }

    #[test]
    fn a_long_file_gives_each_row_its_id() {
        let dir = std::env::temp_dir().join(format!("mamba2-long-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("long.csv");
        std::fs::write(&path, "date,id,y\n2024-01-01,a,1.5\n2024-01-01,\"b,c\",2\n2024-01-02,7,3\n").unwrap();
        let (table, ids) = Table::from_path_with_ids(&path, "id", &ColumnChoice::default()).unwrap();
        assert_eq!((table.columns.clone(), ids), (vec!["y".to_string()], vec!["a".into(), "b,c".into(), "7".into()]));
        assert_eq!(table.rows, vec![vec![1.5], vec![2.0], vec![3.0]]);
        assert_eq!(table.times.as_ref().map(Vec::len), Some(3));
        for (text, says) in [
            ("date,id,y\n2024-01-01,a,1\n2024-01-02,,2\n", "long.csv: line 3, column `id`: no id"),
            ("date,name,y\n2024-01-01,a,1\n", "long.csv: no id column `id` (columns: date, name, y)"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = Table::from_path_with_ids(&path, "id", &ColumnChoice::default()).unwrap_err().to_string();
            assert!(e.ends_with(says), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
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
}
