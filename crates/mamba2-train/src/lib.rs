//! Training, evaluating and streaming Mamba-2 forecasters on CSV time series; the library
//! behind the `mamba2` command.
//!
//! - [`data`]: CSV loading, chronological splits, z-score scaling fitted on training rows,
//!   windows, the Repeat baseline.
//! - [`Forecaster`]: RevIN (optional), Mamba-2 over time, a head on the last position, an
//!   optional linear skip over the lookback.
//! - [`train`]: the loop, with early stopping, atomic best/last checkpoints, exact resume, a
//!   NaN/Inf guard naming the step and parameter, and JSON-lines metrics.
//!
//! ```
//! use mamba2_train::data::{repeat_baseline, ColumnChoice, Scaler, Split, Table, Windows};
//!
//! let csv = "date,a,b\n".to_string()
//!     + &(0..50).map(|t| format!("t{t},{},{}\n", t % 7, (t * 3) % 5)).collect::<String>();
//! let table = Table::from_csv_str(&csv, "inline", &ColumnChoice::default()).unwrap();
//! assert_eq!(table.columns, ["a", "b"]);
//! let [train, _, test] = Split::Fractions { train: 0.6, val: 0.2 }.ranges(table.rows.len(), 5).unwrap();
//! let scaler = Scaler::fit(&table.rows[train.0..train.1]);
//! let rows = scaler.transform(&table.rows);
//! let windows = Windows::new(&rows, test, 5, 2, 1).unwrap();
//! let (mse, mae) = repeat_baseline(&windows, &[0, 1], 1);
//! assert!(mse > 0.0 && mae > 0.0);
//! ```

pub mod calendar;
pub mod data;
pub mod ema;
pub mod features;
mod forecaster;
mod memory;
pub mod plot;
mod stream;
mod trainer;

pub use forecaster::{default_backbone, series_major_to_rows, Batch, ForecastSpec, Forecaster, ForecasterConfig, DEFAULT_PATCH};
pub use memory::keep_freed_memory;
pub use stream::ForecastStream;
pub use trainer::{evaluate, evaluate_continuous, train, train_step, EpochRecord, Loss, Prepared, RunDir, TrainConfig, TrainSummary};

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
}
