//! Training Mamba-2 forecasters: the loop with early stopping, a weight average, atomic best and
//! last checkpoints, exact resume, a NaN/Inf guard naming the step and parameter, JSON-lines
//! metrics, evaluation, and data-parallel workers in one process or across processes
//! (`burn-collective`). The model is `mamba2-forecast`'s, the rows `mamba2-data`'s; the `mamba2`
//! command drives all three.
//!
//! - [`train`]: a run into a [`RunDir`] (`best.ckpt`, `last.ckpt`, `metrics.jsonl`), continued
//!   exactly by `resume`; a run is a function of its settings and seed, bit for bit, on a given
//!   machine and thread count. [`train_workers`] and [`train_parallel`]: the same run split over
//!   data-parallel workers.
//! - [`evaluate`], [`evaluate_table`], [`evaluate_continuous`]: a model's errors over windows.
//! - [`Ema`]: the exponential moving average of the weights that validation and checkpoints use.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use mamba2_forecast::data::{calendar::Calendar, ColumnChoice, Scaler, Split, Table};
//! use mamba2_forecast::ForecasterConfig;
//! use mamba2_train::{train, Prepared, RunDir, TrainConfig};
//!
//! let csv = "date,load\n".to_string()
//!     + &(0..400).map(|t| format!("2024-01-{:02} {:02}:00,{}\n", 1 + t / 24, t % 24, (t % 24) as f64 / 4.0)).collect::<String>();
//! let table = Table::from_csv_str(&csv, "inline", &ColumnChoice::default()).unwrap();
//! let calendar = table.times.as_deref().and_then(Calendar::detect);
//! let clock = table.times.as_ref().unwrap().iter().map(|&t| calendar.as_ref().unwrap().clock(t)).collect();
//! let (lookback, horizon) = (24, 4);
//! let ranges = Split::Fractions { train: 0.7, val: 0.15 }.ranges(table.rows.len(), lookback).unwrap();
//! let scaler = Scaler::fit(&table.rows[ranges[0].0..ranges[0].1], &table.columns).unwrap();
//! let rows = scaler.transform(&table.rows, &table.columns).unwrap();
//! let config = ForecasterConfig::defaults(lookback, horizon, table.columns.clone(), table.columns.clone(), calendar);
//! let data = Prepared { rows, scaler, ranges, targets: vec![0], clock };
//! let dir = RunDir(std::env::temp_dir().join(format!("mamba2-train-doc-{}", std::process::id())));
//! let tc = TrainConfig { epochs: 2, ..TrainConfig::default() };
//! let summary = train::<Autodiff<NdArray<f32>>>(&config, &tc, &data, &dir, false, &Default::default(), |_| {}).unwrap();
//! assert_eq!(summary.history.len(), 2);
//! assert!(dir.best().exists() && dir.metrics().exists());
//! # std::fs::remove_dir_all(&dir.0).unwrap();
//! ```

// Every `unsafe` block states why it is sound, and clippy holds it to that.
#![warn(clippy::undocumented_unsafe_blocks)]

mod ema;
mod memory;
mod parallel;
mod trainer;
mod validation;

pub use ema::Ema;
pub use memory::keep_freed_memory;
pub use parallel::{Cluster, Peer, Workers, DEFAULT_PEER_TIMEOUT, EXCHANGE_THREAD};
pub use trainer::{
    evaluate, evaluate_continuous, evaluate_table, train, train_parallel, train_step, train_workers, EpochRecord, Prepared, Progress,
    RunDir, TrainConfig, TrainSummary,
};
pub use validation::{calibrate, each_forecast, score, trade_table, Blend, QuantileTables, Scored, BLEND_GRID, DM_LEVEL_Z};

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

impl From<mamba2_data::DataError> for TrainError {
    /// The same message: a data error is one of a run's.
    fn from(e: mamba2_data::DataError) -> Self {
        match e {
            mamba2_data::DataError::Io { path, cause } => TrainError::Io { path, cause },
            mamba2_data::DataError::Data { origin, why } => TrainError::Data { origin, why },
            mamba2_data::DataError::Config { why } => TrainError::Config { why },
        }
    }
}

impl From<mamba2_forecast::ForecastError> for TrainError {
    fn from(e: mamba2_forecast::ForecastError) -> Self {
        match e {
            mamba2_forecast::ForecastError::Data(e) => e.into(),
            mamba2_forecast::ForecastError::Model(e) => TrainError::Model(e),
            mamba2_forecast::ForecastError::State { path, why } => TrainError::Data { origin: format!("state file {path}"), why },
        }
    }
}
