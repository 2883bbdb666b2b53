//! Mamba-2 forecasters for time series: the model, its inputs, its training loss, and its
//! streaming form, one forecast per incoming row from the recurrent state. This crate is what a
//! trading or monitoring system depends on to run a model trained by `mamba2 train`: no command
//! line, charts, Parquet, tokenizers or async runtime come with it.
//!
//! - [`Forecaster`] (built from a [`ForecasterConfig`]): each series its own sequence through a
//!   Mamba-2 over time; a head and a direct map forecast the next `H` values relative to the last
//!   one, plus a learned cycle (`docs/forecasting.md`). [`Forecaster::loss`] is the training
//!   loss; on the CPU backends it runs as one fused host kernel.
//! - [`features`]: what the model reads at each row, from the past alone ([`features::RowEncoder`]).
//! - [`ForecastStream`]: the same model one row at a time on the host, equal to
//!   [`Forecaster::forecast_history`] over the same rows.
//! - [`StreamBank`]: one stream state per series id over shared weights (about 18 KB per series
//!   at the default size), saved to a state file and restored bit for bit.
//! - [`open_forecaster`]: a checkpoint from anyone (sizes bounded before memory is reserved),
//!   with the [`Scaler`](data::Scaler) it was trained with.
//! - [`data`]: the tables, calendar, splits and scaler of `mamba2-data`, re-exported.
//!
//! A checkpoint written by `mamba2 train` (here a small one, trained on a synthetic hourly series
//! with a date column), streamed row by row as a live system would:
//!
//! ```
//! use burn::backend::NdArray;
//! use mamba2_forecast::data::{ColumnChoice, Table};
//! use mamba2_forecast::{open_forecaster, ForecastStream};
//!
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
//! let opened = open_forecaster::<NdArray<f64>>(format!("{dir}/tiny.ckpt").as_ref(), &Default::default()).unwrap();
//! let (model, scaler) = (&opened.model, &opened.scaler);
//! let spec = model.spec();
//! let calendar = spec.calendar.as_ref().expect("trained with a date column");
//!
//! // The rows as they arrive, in the file's units; the model's columns picked by name.
//! let choice = ColumnChoice { date_column: None, columns: Some(spec.features.clone()), open_end: Vec::new() };
//! let table = Table::from_path(format!("{dir}/tiny.csv").as_ref(), &choice).unwrap();
//! let mut stream = ForecastStream::<f64>::new(model);
//! let mut forecast = Vec::new();
//! for (row, &time) in table.rows.iter().zip(table.times.as_ref().unwrap()) {
//!     let scaled = scaler.transform_row(row, &spec.features, "a live row").unwrap();
//!     forecast = stream.push(&scaled, calendar.clock(time)).unwrap(); // [H, targets], step-major
//! }
//! // Back to the data's units: the next `H` values of each target.
//! let targets = model.target_indices();
//! let next: Vec<f64> = forecast.iter().enumerate().map(|(i, &v)| scaler.inverse(targets[i % targets.len()], v)).collect();
//! assert_eq!(next.len(), spec.horizon * targets.len());
//! assert!(next.iter().all(|v| v.is_finite()));
//! ```
//!
//! An untrained model forecasts Repeat (the last value), over a history and row by row alike:
//!
//! ```
//! use burn::backend::NdArray;
//! use mamba2_forecast::data::calendar::Calendar;
//! use mamba2_forecast::data::{ColumnChoice, Scaler, Table};
//! use mamba2_forecast::{ForecastStream, ForecasterConfig};
//!
//! // Hourly rows with a date column: the calendar gives the day (24 rows) and the week.
//! let csv = "date,a,b\n".to_string()
//!     + &(0..200).map(|t| format!("2024-01-{:02} {:02}:00,{},{}\n", 1 + t / 24, t % 24, t % 7, (t * 3) % 5)).collect::<String>();
//! let table = Table::from_csv_str(&csv, "inline", &ColumnChoice::default()).unwrap();
//! let calendar = table.times.as_deref().and_then(Calendar::detect).unwrap();
//! assert_eq!(calendar.periods, [24, 168]);
//! let clock: Vec<i64> = table.times.as_ref().unwrap().iter().map(|&t| calendar.clock(t)).collect();
//! let rows = Scaler::fit(&table.rows[..140], &table.columns).unwrap().transform(&table.rows, &table.columns).unwrap();
//!
//! let config = ForecasterConfig::defaults(48, 4, table.columns.clone(), table.columns.clone(), Some(calendar));
//! let model = config.init::<NdArray<f64>>(&Default::default()).unwrap();
//! let whole = model.forecast_history(&rows, &clock, &Default::default()).unwrap(); // [H, 2]
//! let mut stream = ForecastStream::<f64>::new(&model);
//! let last = (0..rows.len()).map(|r| stream.push(&rows[r], clock[r]).unwrap()).last().unwrap();
//! assert_eq!(whole, last);
//! assert_eq!(&whole[..2], &rows[199][..]);
//! ```

// Every `unsafe` block (the feature map's vector loops) states why it is sound, and clippy holds it to that.
#![warn(clippy::undocumented_unsafe_blocks)]

mod bank;
mod codec;
pub mod features;
mod forecaster;
mod load;
mod readout;
mod stream;
mod truth;

pub use bank::{StreamBank, MAX_ID_BYTES};
pub use forecaster::{
    default_backbone, series_major_to_rows, Batch, ForecastSpec, Forecaster, ForecasterConfig, Loss, PanelSpec, RelativeTruth, StaticSpec,
    DEFAULT_PATCH,
};
pub use load::{open_forecaster, Opened};
/// The tables, calendar, splits and scaler a forecaster's rows come from (`mamba2-data`, built
/// without its `parquet` feature unless a user turns it on).
pub use mamba2_data as data;
pub use stream::ForecastStream;

/// Why a checkpoint could not be opened: the file, or the model it holds.
#[derive(Debug, thiserror::Error)]
pub enum ForecastError {
    /// The file could not be read, or what it holds does not fit together.
    #[error(transparent)]
    Data(#[from] mamba2_data::DataError),
    /// The model rejected the checkpoint.
    #[error(transparent)]
    Model(#[from] mamba2_model::ModelError),
    /// A state file could not be read, is damaged, or was saved by another model.
    #[error("state file {path}: {why}")]
    State {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
}
