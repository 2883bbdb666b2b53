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
    read_long_with(path, id_column, choice, &[])
}

/// [`read_long`] of a file whose rows also hold covariates of their id (`covariates`, a load
/// forecast of each id, say): the table's columns are the ids (the series' values), then for
/// each id in order its covariates, named [`covariate_column`]`(id, covariate)`. The value
/// column is the one chosen column that is not a covariate.
///
/// With [`ColumnChoice::open_end`] naming the value column, an id's rows with an empty value are
/// its rows ahead: they must be dated after its last value.
pub fn read_long_with(path: &Path, id_column: &str, choice: &ColumnChoice, covariates: &[String]) -> Result<(Table, String), DataError> {
    let (table, ids) = Table::from_path_with_ids(path, id_column, choice)?;
    let origin = path.display().to_string();
    let values: Vec<&String> = table.columns.iter().filter(|c| !covariates.contains(c)).collect();
    let value = values.first().map(|v| v.to_string()).unwrap_or_default();
    Ok((pivot_with(table, &ids, &origin, covariates)?, value))
}

/// The name of id `id`'s covariate `covariate` among a pivoted panel's columns.
pub fn covariate_column(id: &str, covariate: &str) -> String {
    format!("{id}:{covariate}")
}

/// The pivot of [`read_long`], of a table already read with its ids.
pub fn pivot(table: Table, ids: &[String], origin: &str) -> Result<Table, DataError> {
    pivot_with(table, ids, origin, &[])
}

/// The pivot of [`read_long_with`], of a table already read with its ids.
pub fn pivot_with(table: Table, ids: &[String], origin: &str, covariates: &[String]) -> Result<Table, DataError> {
    let err = |why: String| DataError::Data { origin: origin.to_string(), why };
    let Some(times) = table.times.as_ref() else {
        return Err(err(match &table.date_column {
            Some(d) => format!("long format: the date column `{d}` does not read as dates, and the series are aligned on it"),
            None => "long format needs a date column (name it with --date-column): the series are aligned on it".into(),
        }));
    };
    for c in covariates {
        if !table.columns.contains(c) {
            return Err(err(format!("no covariate column `{c}` (columns: {})", table.columns.join(", "))));
        }
    }
    let values: Vec<&String> = table.columns.iter().filter(|c| !covariates.contains(c)).collect();
    if values.len() != 1 {
        let besides = if covariates.is_empty() { String::new() } else { format!(", the covariates ({})", covariates.join(", ")) };
        return Err(err(format!(
            "long format reads one value column besides the id{besides} and the date, and this file has {} ({}); pick it with --columns (the value column first, then covariates of each id)",
            values.len(),
            values.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    let value_at = table.columns.iter().position(|c| c == values[0]).expect("found");
    let cov_at: Vec<usize> = covariates.iter().map(|c| table.columns.iter().position(|x| x == c).expect("checked")).collect();
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
    let (n_ids, n_cov) = (order.len(), covariates.len());
    let width = n_ids * (1 + n_cov);
    let mut rows = vec![vec![f64::NAN; width]; dates.len()];
    let mut seen = vec![false; dates.len() * n_ids];
    // Per id: the date of its last value, and of its first row ahead (value empty).
    let mut last_value: Vec<Option<i64>> = vec![None; n_ids];
    let mut first_ahead: Vec<Option<i64>> = vec![None; n_ids];
    for (k, (id, (&t, row))) in ids.iter().zip(times.iter().zip(&table.rows)).enumerate() {
        let (r, c) = (row_of[&t], index[id.as_str()]);
        if std::mem::replace(&mut seen[r * n_ids + c], true) {
            return Err(err(format!("data row {}: id `{id}` has a second row at the same date", k + 1)));
        }
        let v = row[value_at];
        rows[r][c] = v;
        for (i, &j) in cov_at.iter().enumerate() {
            rows[r][n_ids + c * n_cov + i] = row[j];
        }
        let mark = if v.is_nan() { &mut first_ahead[c] } else { &mut last_value[c] };
        *mark = Some(match *mark {
            Some(m) if v.is_nan() => m.min(t),
            Some(m) => m.max(t),
            None => t,
        });
    }
    for (c, id) in order.iter().enumerate() {
        if let (Some(ahead), Some(last)) = (first_ahead[c], last_value[c]) {
            if ahead < last {
                return Err(err(format!(
                    "id `{id}` has a row ahead (its value empty) dated before its last value: an id's rows ahead come after its rows"
                )));
            }
        }
    }
    let mut columns = order.clone();
    for id in &order {
        columns.extend(covariates.iter().map(|c| covariate_column(id, c)));
    }
    Ok(Table { columns, rows, times: Some(dates), date_column: table.date_column })
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
