//! Panels in long format: one row per (series id, date), read into one table whose columns are
//! the series, on the union of their dates.
//!
//! A series is missing (NaN) at the dates it has no row for: before its first row, after its
//! last, and in its gaps. Nothing is filled in. A window of rows is used for a series only where
//! the series has a value at every row of it ([`Windows`](crate::Windows) finds them), so each
//! series trains and is scored on its own stretches of history, with the calendar of the shared
//! dates.

use std::collections::HashMap;
use std::path::Path;

use crate::table::{ColumnChoice, Table};
use crate::DataError;

/// A long-format file read as [`Table::from_path`] reads a wide one: `columns` are the ids (in
/// order of first appearance), and the value column's name; `rows` the union of the dates in time order, each cell the value
/// column at that (date, id), NaN where the id has no row.
///
/// The file needs a date column (the series are aligned on it) and exactly one value column
/// besides the id and the date (pick it with `choice.columns` when there are more). Errors name
/// the file and the line (or Parquet row): a missing date column, another count of value
/// columns, an id with two rows at one date.
pub fn read_long(path: &Path, id_column: &str, choice: &ColumnChoice) -> Result<(Table, String), DataError> {
    let (table, ids) = Table::from_path_with_ids(path, id_column, choice)?;
    let value = table.columns.first().cloned().unwrap_or_default();
    Ok((pivot(table, &ids, &path.display().to_string())?, value))
}

/// The pivot of [`read_long`], of a table already read with its ids.
pub fn pivot(table: Table, ids: &[String], origin: &str) -> Result<Table, DataError> {
    let err = |why: String| DataError::Data { origin: origin.to_string(), why };
    let Some(times) = table.times.as_ref() else {
        return Err(err(match &table.date_column {
            Some(d) => format!("long format: the date column `{d}` does not read as dates, and the series are aligned on it"),
            None => "long format needs a date column (name it with --date-column): the series are aligned on it".into(),
        }));
    };
    if table.columns.len() != 1 {
        return Err(err(format!(
            "long format reads one value column besides the id and the date, and this file has {} ({}); pick one with --columns",
            table.columns.len(),
            table.columns.join(", ")
        )));
    }
    let mut order: Vec<String> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for id in ids {
        if !index.contains_key(id.as_str()) {
            index.insert(id, order.len());
            order.push(id.clone());
        }
    }
    let mut dates: Vec<i64> = times.clone();
    dates.sort_unstable();
    dates.dedup();
    let row_of: HashMap<i64, usize> = dates.iter().enumerate().map(|(r, &t)| (t, r)).collect();
    let mut rows = vec![vec![f64::NAN; order.len()]; dates.len()];
    for (k, (id, (&t, row))) in ids.iter().zip(times.iter().zip(&table.rows)).enumerate() {
        let cell = &mut rows[row_of[&t]][index[id.as_str()]];
        if !cell.is_nan() {
            return Err(err(format!("data row {}: id `{id}` has a second row at the same date", k + 1)));
        }
        *cell = row[0];
    }
    Ok(Table { columns: order, rows, times: Some(dates), date_column: table.date_column })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(text: &str) -> Result<Table, DataError> {
        let choice = ColumnChoice::default();
        let (table, ids) = Table::from_csv_str_with_ids(text, "inline", "id", &choice)?;
        pivot(table, &ids, "inline")
    }

    /// Ids of different starts, ends and gaps land on the union of the dates, missing as NaN;
    /// rows in any order give the same table.
    #[test]
    fn series_of_different_spans_are_aligned_on_their_dates() {
        let text =
            "id,date,y\nb,2024-01-01 02:00,5\na,2024-01-01 00:00,1\na,2024-01-01 01:00,2\nb,2024-01-01 03:00,6\na,2024-01-01 03:00,4\n";
        let t = long(text).unwrap();
        assert_eq!(t.columns, ["b", "a"]);
        assert_eq!(t.times.as_ref().unwrap().len(), 4);
        let cells: Vec<String> = t.rows.iter().map(|r| format!("{:?}", r)).collect();
        assert_eq!(cells, ["[NaN, 1.0]", "[NaN, 2.0]", "[5.0, NaN]", "[6.0, 4.0]"]);
    }

    #[test]
    fn a_long_file_without_dates_or_with_two_values_or_a_repeated_date_is_refused() {
        let e = long("id,y\na,1\na,2\n").unwrap_err().to_string();
        assert!(e.contains("long format needs a date column"), "{e}");
        let e = long("id,date,y,z\na,2024-01-01,1,2\n").unwrap_err().to_string();
        assert!(e.contains("this file has 2 (y, z)"), "{e}");
        let e = long("id,date,y\na,2024-01-01,1\nb,2024-01-01,1\na,2024-01-01,3\n").unwrap_err().to_string();
        assert_eq!(e, "inline: data row 3: id `a` has a second row at the same date");
    }
}
