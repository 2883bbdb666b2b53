//! The `mamba2` command's library: line charts as PNG ([`plot`]), shared by the command and its
//! tests. The command itself (`src/main.rs`) parses arguments (clap), reports progress
//! (indicatif), and runs `train`, `eval`, `predict`, `stream` and `generate` over the
//! `mamba2-data`, `mamba2-forecast` and `mamba2-train` crates; everything it needs beyond those
//! (clap, plotters, indicatif, tokenizers, Parquet) lives here, not in the libraries.
//!
//! ```
//! use mamba2::plot::{draw, read_png, Chart, Line};
//!
//! let path = std::env::temp_dir().join(format!("mamba2-plot-doc-{}.png", std::process::id()));
//! let points = (0..50).map(|i| (i as f64, (i as f64 / 8.0).sin())).collect();
//! let line = Line { label: "sine", points, rgb: [31, 119, 180], markers: false, dashed: false };
//! let chart = Chart { title: "A sine", x_label: "step", y_label: "value", lines: vec![line], ..Chart::default() };
//! draw(&path, &chart, 640, 400).unwrap();
//! assert_eq!(read_png(&path).unwrap().0, 640);
//! # std::fs::remove_file(&path).unwrap();
//! ```

#![forbid(unsafe_code)]

pub mod plot;

/// Why a chart could not be drawn or read.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// A file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// The chart cannot be drawn or decoded.
    #[error("{path}: chart: {why}")]
    Chart {
        /// The chart's file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The chart could not be written (atomically, so an older one stays whole).
    #[error(transparent)]
    Write(#[from] mamba2_model::ModelError),
}
