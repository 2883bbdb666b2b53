//! Time series as tables of numbers, and what every forecaster does with them before a model
//! sees them; no tensors, no Burn.
//!
//! - [`Table`]: a CSV file (RFC 4180, a byte order mark, CRLF) or, with the default `parquet`
//!   feature, a Parquet file, read into named numeric columns and the date column's time stamps.
//!   Every bad cell is a [`DataError`] naming the file, the line and the column.
//! - [`calendar`]: dates to a row clock, and the day and week cycles of the sampling interval.
//! - [`Split`] (chronological train, validation and test rows), [`Scaler`] (z-scores fitted on
//!   the training rows alone), [`Windows`] (`lookback` inputs and `horizon` targets).
//! - [`panel`]: a file in long format (a row per series id and date) as a table of a column per
//!   id on the union of the dates, NaN where an id has no row; [`Windows`] then holds a series
//!   only in the windows it has whole.
//! - [`statics`]: a table of one row per series holding its fixed attributes (a sector, a
//!   market), encoded as inputs: numeric columns standardised, others one-hot.
//! - [`ErrorTable`]: squared and absolute errors per target and forecast step, summed in a fixed
//!   order; [`repeat_table`]: the Repeat baseline (the last value, held).
//!
//! ```
//! use mamba2_data::{repeat_baseline, ColumnChoice, Scaler, Split, Table, Windows};
//!
//! let csv = "date,load\n".to_string()
//!     + &(0..100).map(|t| format!("2024-01-{:02} {:02}:00,{}\n", 1 + t / 24, t % 24, t % 24)).collect::<String>();
//! let table = Table::from_csv_str(&csv, "inline", &ColumnChoice::default()).unwrap();
//! assert_eq!(table.columns, ["load"]);
//! let [train, val, _test] = Split::Fractions { train: 0.6, val: 0.2 }.ranges(table.rows.len(), 24).unwrap();
//! let scaler = Scaler::fit(&table.rows[train.0..train.1], &table.columns).unwrap();
//! let rows = scaler.transform(&table.rows, &table.columns).unwrap();
//! let windows = Windows::new(&rows, val, 24, 4, 1).unwrap();
//! let (mse, mae) = repeat_baseline(&windows, &[0], 1);
//! assert!(mse > 0.0 && mae > 0.0);
//! ```
//!
//! Features: `parquet` (default) reads Parquet files through the `parquet` crate; without it a
//! Parquet file is an error that says so.

#![forbid(unsafe_code)]

mod baseline;
pub mod calendar;
mod cell;
pub mod folds;
pub mod panel;
#[cfg(feature = "parquet")]
mod parquet_input;
pub mod quantile;
mod split;
pub mod statics;
mod table;
pub mod trade;

pub use baseline::{repeat_baseline, repeat_table, seasonal_table, ErrorSums, ErrorTable};
pub use split::{Scaler, Split, Windows};
pub use table::{is_parquet, ColumnChoice, Table};

/// What can be wrong with a data file or with settings that must fit it, with the offending
/// value in the message.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// The data is unusable.
    #[error("{origin}: {why}")]
    Data {
        /// Where the data came from.
        origin: String,
        /// What is wrong.
        why: String,
    },
    /// Settings that do not fit the data or each other.
    #[error("{why}")]
    Config {
        /// What is wrong.
        why: String,
    },
}
