//! Training, evaluating and streaming Mamba-2 forecasters on time series from CSV or Parquet
//! files; the library behind the `mamba2` command.
//!
//! - [`data`]: CSV and Parquet loading (with the date column's time stamps), chronological
//!   splits, z-score scaling fitted on training rows, windows, the Repeat baseline.
//! - [`calendar`]: dates to a row clock, and the day and week cycles of the sampling interval.
//! - [`features`]: what the model reads at each row, from the past alone ([`features::RowEncoder`]).
//! - [`Forecaster`]: each series its own sequence through a Mamba-2 over time; a head and a
//!   direct map forecast the next `H` values relative to the last one, plus a learned cycle
//!   (`docs/forecasting.md`). [`ForecastStream`]: the same model one row at a time.
//! - [`train`]: the loop, with early stopping, atomic best/last checkpoints, exact resume, a
//!   NaN/Inf guard naming the step and parameter, and JSON-lines metrics. [`open_forecaster`]:
//!   a checkpoint from anyone, its sizes bounded before memory is reserved.
//! - [`plot`]: line charts as PNG (plotters), with axes, labels, title and legend.
//!
//! ```
//! use burn::backend::NdArray;
//! use mamba2_train::calendar::Calendar;
//! use mamba2_train::data::{ColumnChoice, Scaler, Table};
//! use mamba2_train::{ForecastStream, ForecasterConfig};
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
//! // An untrained default model forecasts Repeat, over a history and row by row alike.
//! let config = ForecasterConfig::defaults(48, 4, table.columns.clone(), table.columns.clone(), Some(calendar));
//! let model = config.init::<NdArray<f64>>(&Default::default()).unwrap();
//! let whole = model.forecast_history(&rows, &clock, &Default::default()).unwrap(); // [H, 2]
//! let mut stream = ForecastStream::<f64>::new(&model);
//! let last = (0..rows.len()).map(|r| stream.push(&rows[r], clock[r]).unwrap()).last().unwrap();
//! assert_eq!(whole, last);
//! assert_eq!(&whole[..2], &rows[199][..]);
//! ```

// Every `unsafe` block states why it is sound, and clippy holds it to that.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod calendar;
pub mod data;
pub mod ema;
pub mod features;
mod forecaster;
mod load;
mod memory;
mod parallel;
mod parquet_input;
pub mod plot;
mod readout;
mod stream;
mod trainer;

pub use forecaster::{
    default_backbone, series_major_to_rows, Batch, ForecastSpec, Forecaster, ForecasterConfig, RelativeTruth, DEFAULT_PATCH,
};
pub use load::{open_forecaster, Opened};
pub use memory::keep_freed_memory;
pub use parallel::{Cluster, Peer, Workers, DEFAULT_PEER_TIMEOUT, EXCHANGE_THREAD};
pub use stream::ForecastStream;
pub use trainer::{
    evaluate, evaluate_continuous, evaluate_table, train, train_parallel, train_step, train_workers, EpochRecord, Loss, Prepared, Progress,
    RunDir, TrainConfig, TrainSummary,
};

/// Everything that can stop a run, with the offending value in the message.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file could not be read or written.
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
    /// A chart could not be drawn.
    #[error("{path}: chart: {why}")]
    Plot {
        /// The chart's file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// Training produced NaN or infinity.
    #[error("non-finite value at optimizer step {step}: {what}")]
    NonFinite {
        /// Steps completed.
        step: usize,
        /// What went non-finite (the loss, or the first parameter's gradient).
        what: String,
    },
    /// The model rejected its inputs or a checkpoint.
    #[error(transparent)]
    Model(#[from] mamba2_model::ModelError),
    /// The optimizer failed.
    #[error(transparent)]
    Optim(#[from] mamba2_optim::OptimError),
    /// A data-parallel worker could not exchange with the others, or stopped because another
    /// one did.
    #[error("worker {rank}: {why}")]
    Collective {
        /// The worker that reports it.
        rank: usize,
        /// What happened.
        why: String,
    },
}
