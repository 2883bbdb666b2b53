//! One cell of a table as a reader found it, before the table's checks.

use crate::calendar::parse_time;

/// One cell as a reader found it: text (CSV, Parquet strings), a typed number or time
/// (Parquet), or nothing. Only the Parquet reader makes the typed ones.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(not(feature = "parquet"), allow(dead_code))]
pub(crate) enum Cell {
    Text(String),
    Number(f64),
    /// Seconds since 1970-01-01.
    Time(i64),
    Null,
}

impl Cell {
    pub(crate) fn is_number(&self) -> bool {
        match self {
            Cell::Number(_) => true,
            Cell::Text(t) => t.parse::<f64>().is_ok(),
            Cell::Time(_) | Cell::Null => false,
        }
    }

    pub(crate) fn time(&self) -> Option<i64> {
        match self {
            Cell::Time(t) => Some(*t),
            Cell::Text(t) => parse_time(t),
            Cell::Number(_) | Cell::Null => None,
        }
    }

    pub(crate) fn shown(&self) -> String {
        match self {
            Cell::Text(t) => t.clone(),
            Cell::Number(v) => v.to_string(),
            Cell::Time(t) => format!("the time {t} s"),
            Cell::Null => "null".into(),
        }
    }
}
