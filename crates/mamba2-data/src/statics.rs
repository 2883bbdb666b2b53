//! Static covariates: a small CSV table of one row per series (its first column the series'
//! name: a panel's id or a wide table's column) and the series' fixed attributes (a sector, a
//! market, a capacity), encoded as inputs every row of that series reads.
//!
//! A column whose cells all read as numbers is numeric: standardised over the series encoded.
//! Any other column is categorical: one input per distinct value (sorted), 1 for the series'
//! value and 0 for the others. Series of the table that are not encoded are ignored.
//!
//! ```
//! use mamba2_data::statics::StaticTable;
//!
//! let t = StaticTable::from_csv_str("id,sector,cap\na,energy,1\nb,banks,3\n", "inline").unwrap();
//! let (names, values) = t.encode(&["b".to_string(), "a".to_string()]).unwrap();
//! assert_eq!(names, ["sector=banks", "sector=energy", "cap"]);
//! assert_eq!(values, [vec![1.0, 0.0, 1.0], vec![0.0, 1.0, -1.0]]);
//! ```

use std::collections::HashMap;
use std::path::Path;

use crate::DataError;

/// A static table as read: its columns besides the first, and each series' cells.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticTable {
    /// Where it was read from, for errors.
    pub origin: String,
    /// The first column's name: the series' names are in it.
    pub id_column: String,
    /// The static columns, in the file's order.
    pub columns: Vec<String>,
    /// Each series' cells, one per static column, by the series' name.
    rows: HashMap<String, Vec<String>>,
}

/// At most this many inputs from a static table: far above any real use, checked before a
/// model is sized by it.
pub const MAX_STATIC_INPUTS: usize = 4096;

impl StaticTable {
    /// Reads a CSV file.
    pub fn from_path(path: &Path) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(|cause| DataError::Io { path: path.display().to_string(), cause })?;
        Self::from_csv_str(&text, &path.display().to_string())
    }

    /// Parses CSV text (`origin` names it in errors): a header row, then one row per series with
    /// a value in every cell.
    pub fn from_csv_str(text: &str, origin: &str) -> Result<Self, DataError> {
        let err = |why: String| DataError::Data { origin: origin.to_string(), why };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut reader = csv::ReaderBuilder::new().has_headers(false).trim(csv::Trim::All).from_reader(text.as_bytes());
        let mut records = reader.records();
        let header = match records.next() {
            Some(Ok(h)) => h.iter().map(str::to_string).collect::<Vec<_>>(),
            Some(Err(e)) => return Err(err(format!("not CSV: {e}"))),
            None => return Err(err("empty file: no header row".into())),
        };
        if header.len() < 2 {
            return Err(err(format!(
                "a static table holds the series' names in its first column and at least one static column after it; the header has {} ({})",
                header.len(),
                header.join(",")
            )));
        }
        for (i, h) in header.iter().enumerate() {
            if h.is_empty() || header[..i].contains(h) {
                return Err(err(format!(
                    "column {} of the header is {}",
                    i + 1,
                    if h.is_empty() { "empty".into() } else { format!("`{h}` again") }
                )));
            }
        }
        let mut rows = HashMap::new();
        for rec in records {
            let rec =
                rec.map_err(|e| err(format!("{}not CSV: {e}", e.position().map_or(String::new(), |p| format!("line {}: ", p.line())))))?;
            let line = rec.position().map_or(0, |p| p.line());
            if rec.iter().all(str::is_empty) {
                continue;
            }
            let id = rec[0].to_string();
            if let Some(k) = rec.iter().position(str::is_empty) {
                return Err(err(format!(
                    "line {line}: `{}` is empty for series `{id}`; every series needs a value in every column",
                    header[k]
                )));
            }
            if rows.insert(id.clone(), rec.iter().skip(1).map(str::to_string).collect()).is_some() {
                return Err(err(format!("line {line}: series `{id}` has a second row")));
            }
        }
        Ok(StaticTable { origin: origin.to_string(), id_column: header[0].clone(), columns: header[1..].to_vec(), rows })
    }

    /// The inputs' names and each of `series`' inputs, in that order: see the module
    /// documentation for the encoding.
    ///
    /// # Errors
    /// A series without a row, or more than [`MAX_STATIC_INPUTS`] inputs.
    pub fn encode(&self, series: &[String]) -> Result<(Vec<String>, Vec<Vec<f64>>), DataError> {
        let err = |why: String| DataError::Data { origin: self.origin.clone(), why };
        let cells: Vec<&Vec<String>> = series
            .iter()
            .map(|s| {
                self.rows.get(s).ok_or_else(|| {
                    let mut known: Vec<&str> = self.rows.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    let shown = if known.len() > 8 { format!("{} ...", known[..8].join(", ")) } else { known.join(", ") };
                    err(format!("no row for series `{s}` in column `{}` (it has: {shown})", self.id_column))
                })
            })
            .collect::<Result<_, _>>()?;
        let mut names = Vec::new();
        let mut values: Vec<Vec<f64>> = vec![Vec::new(); series.len()];
        for (k, column) in self.columns.iter().enumerate() {
            let numbers: Option<Vec<f64>> = cells.iter().map(|c| c[k].parse::<f64>().ok().filter(|v| v.is_finite())).collect();
            match numbers {
                Some(x) => {
                    let n = x.len().max(1) as f64;
                    let mean = x.iter().sum::<f64>() / n;
                    let sd = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
                    // A column equal for every series is centred to 0 and left unscaled.
                    let sd = if sd > 0.0 { sd } else { 1.0 };
                    names.push(column.clone());
                    for (v, out) in x.iter().zip(&mut values) {
                        out.push((v - mean) / sd);
                    }
                }
                None => {
                    let mut levels: Vec<&str> = cells.iter().map(|c| c[k].as_str()).collect();
                    levels.sort_unstable();
                    levels.dedup();
                    names.extend(levels.iter().map(|l| format!("{column}={l}")));
                    for (c, out) in cells.iter().zip(&mut values) {
                        out.extend(levels.iter().map(|l| if *l == c[k] { 1.0 } else { 0.0 }));
                    }
                }
            }
            if names.len() > MAX_STATIC_INPUTS {
                return Err(err(format!(
                    "the static columns make more than {MAX_STATIC_INPUTS} inputs (column `{column}` brings the count to {}); a categorical column gives one input per distinct value",
                    names.len()
                )));
            }
        }
        Ok((names, values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_columns_are_standardised_and_others_one_hot() {
        let t = StaticTable::from_csv_str("\u{feff}name,market,size\r\nx,EU,2\r\ny,US,4\r\nz,EU,6\r\nw,ASIA,1e9\r\n", "s.csv").unwrap();
        let (names, v) = t.encode(&["x".into(), "y".into(), "z".into()]).unwrap();
        assert_eq!(names, ["market=EU", "market=US", "size"]);
        let sd = (8.0f64 / 3.0).sqrt();
        let want = [[1.0, 0.0, -2.0 / sd], [0.0, 1.0, 0.0], [1.0, 0.0, 2.0 / sd]];
        for (row, w) in v.iter().zip(want) {
            for (a, b) in row.iter().zip(w) {
                assert!((a - b).abs() < 1e-12, "{v:?}");
            }
        }
        // A column numeric for some series and not others is categorical.
        let t = StaticTable::from_csv_str("id,c\na,1\nb,one\n", "s.csv").unwrap();
        assert_eq!(t.encode(&["a".into(), "b".into()]).unwrap().0, ["c=1", "c=one"]);
    }

    #[test]
    fn a_malformed_static_table_names_its_fault() {
        let cases = [
            ("", "empty file"),
            ("id\na\n", "the header has 1 (id)"),
            ("id,s,s\na,1,2\n", "column 3 of the header is `s` again"),
            ("id,s\na,1\na,2\n", "line 3: series `a` has a second row"),
            ("id,s\na,\n", "line 2: `s` is empty for series `a`"),
            ("id,s\na,1,2\n", "not CSV"),
        ];
        for (text, want) in cases {
            let e = StaticTable::from_csv_str(text, "s.csv").unwrap_err().to_string();
            assert!(e.starts_with("s.csv: ") && e.contains(want), "{text:?}: {e}");
        }
        let t = StaticTable::from_csv_str("id,s\na,1\n", "s.csv").unwrap();
        let e = t.encode(&["a".into(), "b".into()]).unwrap_err().to_string();
        assert_eq!(e, "s.csv: no row for series `b` in column `id` (it has: a)");
        let many = "id,s\n".to_string() + &(0..5000).map(|i| format!("{i},v{i}\n")).collect::<String>();
        let t = StaticTable::from_csv_str(&many, "s.csv").unwrap();
        let all: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
        assert!(t.encode(&all).unwrap_err().to_string().contains("more than 4096 inputs"));
    }
}
