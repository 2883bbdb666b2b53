//! `mamba2`: train, evaluate and run Mamba-2 forecasters on time series in CSV or Parquet files.
//!
//! With no arguments, `mamba2 train` trains on the ETTh1 copy shipped with the repository under
//! the standard protocol (L 96, H 96, all 7 series) and prints test MSE/MAE beside the Repeat
//! baseline and the published table.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

mod backtest;
mod figures;
mod generate;
mod report;

use anyhow::{bail, Context, Result};
use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::AutodiffBackend;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use mamba2::plot::{draw, Band, Chart, Line, BAND_RGB};
use mamba2_data::calendar::Calendar;
use mamba2_data::quantile::{central_pairs, level_name, Calibration};
use mamba2_data::{repeat_table, ColumnChoice, ErrorTable, Scaler, Split, Table, Windows};
use mamba2_forecast::features::Truth;
use mamba2_forecast::{ForecastSpec, ForecastStream, Forecaster, ForecasterConfig, Loss, PanelSpec, StreamBank};
use mamba2_model::load_checkpoint;
use mamba2_tensor::compare::to_f64_vec;
use mamba2_train::{trade_table, train_parallel, Cluster, Prepared, RunDir, TrainConfig, Workers};
use report::Reporter;

/// ETTh1 (Zhou et al., Informer, AAAI 2021; CC BY-ND 4.0), shipped unmodified in data/ett/.
const ETTH1: &str = include_str!("../../../data/ett/ETTh1.csv");
const ETTH1_NAME: &str = "ETTh1.csv (embedded)";

#[derive(Parser)]
#[command(name = "mamba2", version, about = "Mamba-2 forecasters on time series (CSV or Parquet), and text from HF Mamba-2 checkpoints")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a forecaster (defaults: ETTh1, L 96, H 96, all 7 series).
    Train(Box<TrainArgs>),
    /// Metrics of a checkpoint on every window of a data file.
    Eval(UseArgs),
    /// The next H rows after the last rows of a data file.
    Predict(UseArgs),
    /// Walk-forward evaluation: folds at the end of the data, each forecast out of sample by a
    /// model trained on the rows before it.
    Backtest(Box<backtest::BacktestArgs>),
    /// Read CSV rows from stdin (header first) and print a forecast after each row.
    Stream(StreamArgs),
    /// Continue a text with an HF Mamba-2 language model (config.json, safetensors, tokenizer.json).
    Generate(generate::GenerateArgs),
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum DeviceArg {
    /// This machine's cores (Flex f32 or NdArray f64, with the host fast path).
    Cpu,
    /// An NVIDIA GPU through CubeCL (a build with `--features cuda`).
    Cuda,
    /// A GPU through WebGPU (Vulkan, Metal, DX12), or Mesa's lavapipe where there is none (a
    /// build with `--features wgpu`).
    Wgpu,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum LossArg {
    Mse,
    Mae,
    MseMae,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum DtypeArg {
    F32,
    F64,
}

#[derive(Args, Clone)]
struct Backend {
    /// Where to compute.
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Float type.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DtypeArg,
}

#[derive(Args, Clone)]
struct DataArgs {
    /// CSV file with a header row, or Parquet file (numeric columns, an optional timestamp column) (default: the embedded ETTh1)
    #[arg(long)]
    data: Option<PathBuf>,
    /// Date/time column, read for the calendar, not as a feature (default: one named date, time, datetime or timestamp).
    #[arg(long)]
    date_column: Option<String>,
    /// Input columns, comma separated (default: every other column).
    #[arg(long, value_delimiter = ',')]
    columns: Option<Vec<String>>,
}

#[derive(Args, Clone)]
struct TrainArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The column naming each row's series in a long-format --data file (one row per id and
    /// date, one value column): each id a series of its own, aligned with the others on the
    /// date column; the same date borders split every series
    #[arg(long)]
    id_column: Option<String>,
    /// Predicted columns, comma separated (default: all input columns but --future-columns).
    #[arg(long, value_delimiter = ',')]
    targets: Option<Vec<String>>,
    /// Covariates known in advance, comma separated (a load forecast, a calendar of events):
    /// at each row the model also reads their values at the H rows it forecasts, so predict
    /// and stream must be given them for the rows after the last (rows ahead, targets empty)
    #[arg(long, value_delimiter = ',')]
    future_columns: Option<Vec<String>>,
    /// A CSV of static covariates: one row per series (its id, or its column of a wide table,
    /// in the first column) and its fixed attributes (a sector, a market); numbers are
    /// standardised over the series, other values one-hot. Kept in the checkpoint, so predict
    /// and stream need no such file
    #[arg(long, value_name = "FILE")]
    static_data: Option<PathBuf>,
    /// Train and validation fractions, e.g. `0.7,0.1` (default: the ETTh1 borders for ETTh1, else 0.7,0.1).
    #[arg(long, value_delimiter = ',')]
    split: Option<Vec<f64>>,
    /// Row borders `train_end,val_end,test_end` (overrides --split).
    #[arg(long, value_delimiter = ',')]
    borders: Option<Vec<usize>>,
    /// Lookback L: rows of history per training and evaluation window.
    #[arg(long, default_value_t = 96)]
    lookback: usize,
    /// Horizon H (1: next-step).
    #[arg(long, default_value_t = 96)]
    horizon: usize,
    /// Width of the Mamba-2 stack [default: 32].
    #[arg(long)]
    d_model: Option<usize>,
    /// Mamba-2 blocks [default: 1].
    #[arg(long)]
    layers: Option<usize>,
    /// State size per channel [default: 16].
    #[arg(long)]
    d_state: Option<usize>,
    /// Channels per head [default: 16].
    #[arg(long)]
    headdim: Option<usize>,
    /// d_inner = expand * d_model [default: 2].
    #[arg(long)]
    expand: Option<usize>,
    /// Chunk length of the chunked scan [default: 32].
    #[arg(long)]
    chunk_size: Option<usize>,
    /// Values of its own past each row's input holds [default: 96, or L when shorter].
    #[arg(long)]
    patch: Option<usize>,
    /// No linear map from each row's inputs to the forecast beside the Mamba's head.
    #[arg(long)]
    no_direct: bool,
    /// Rows of the past the rolling mean (and std) cover [default: L / 2].
    #[arg(long)]
    norm_window: Option<usize>,
    /// Divide each series by its rolling standard deviation too, and forecast in those units.
    #[arg(long)]
    scale: bool,
    /// Do not read calendar cycles from the date column.
    #[arg(long)]
    no_calendar: bool,
    /// Length in rows of the learned per-series cycle, 0 for none [default: a day for data
    /// sampled within a day, else a week; none without a calendar].
    #[arg(long)]
    cycle: Option<usize>,
    /// No learned per-series embedding.
    #[arg(long)]
    no_series_embedding: bool,
    /// Every series also reads every predicted series' current value (channel mixing).
    #[arg(long)]
    mix: bool,
    /// Dropout before the head.
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Most passes over the training windows (early stopping may end the run sooner).
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    epochs: usize,
    /// Windows per batch (each window's series are sequences of their own).
    #[arg(long, default_value_t = TrainConfig::default().batch_size)]
    batch_size: usize,
    /// Peak learning rate (warmup, then cosine decay).
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    lr: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = TrainConfig::default().weight_decay)]
    weight_decay: f64,
    /// Stop after this many epochs without a better validation MSE.
    #[arg(long, default_value_t = TrainConfig::default().patience)]
    patience: usize,
    /// Seed of the initialisation, the window order and dropout.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train once per seed (comma separated) into --out/seed-N and print the test metrics'
    /// mean and standard deviation.
    #[arg(long, value_delimiter = ',')]
    seeds: Option<Vec<u64>>,
    /// Do not evaluate the test split (for choosing settings on the validation split).
    #[arg(long)]
    no_test: bool,
    /// Data-parallel workers in this process, one thread each: every step's batch is split
    /// between them and their gradients summed, which gives the one-worker run to rounding.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
    /// Processes of a run over several processes or machines, each started with the same
    /// settings and its own --rank; their workers together split every batch (docs/parallel.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    world_size: u32,
    /// This process of --world-size, from 0; process 0 runs the coordinator, reports and writes
    /// the run.
    #[arg(long, default_value_t = 0)]
    rank: u32,
    /// host:port where process 0 runs the coordinator (needed with --world-size).
    #[arg(long)]
    coordinator: Option<String>,
    /// host:port at which the other processes reach this one [default: the coordinator's host,
    /// its port + 1 + rank].
    #[arg(long)]
    listen: Option<String>,
    /// Seconds a worker waits for the others (to join, or in a step) before the run stops.
    #[arg(long, default_value_t = mamba2_train::DEFAULT_PEER_TIMEOUT.as_secs_f64())]
    peer_timeout: f64,
    /// Evaluate and keep a moving average of the weights with this decay per step, 0 for off
    /// [default: 0.99].
    #[arg(long)]
    ema: Option<f64>,
    /// Training loss.
    #[arg(long, value_enum, default_value = "mae")]
    loss: LossArg,
    /// Step between training window starts (each epoch starts them at another offset).
    #[arg(long, default_value_t = TrainConfig::default().stride)]
    stride: usize,
    /// First row of a training window whose forecast is trained on.
    #[arg(long, default_value_t = 0)]
    loss_from: usize,
    /// Of those rows, the last and every N-th before it are trained on.
    #[arg(long, default_value_t = TrainConfig::default().loss_every)]
    loss_every: usize,
    /// Keep the best epoch's model as trained, even where it does not beat Repeat on the
    /// validation split (by default the run keeps the blend of the two that validation supports,
    /// Repeat itself when the model has no significant skill).
    #[arg(long)]
    no_repeat_check: bool,
    /// Cost of taking a position in the trading figures, in basis points of the last value.
    #[arg(long, default_value_t = 0.0)]
    cost_bps: f64,
    /// Quantile levels forecast beside each point (shares, comma-separated), calibrated on the
    /// validation split; q and 1 - q make a central interval.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,0.9")]
    quantiles: Vec<f64>,
    // The help is an attribute, not a doc comment: rustdoc would read `<data file name>` as HTML.
    #[arg(long, help = "Output directory (checkpoints, metrics.jsonl, plots) [default: runs/<data file name>]")]
    out: Option<PathBuf>,
    /// Print each epoch's record as a JSON line instead of a progress display.
    #[arg(long)]
    json: bool,
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    resume: bool,
    #[command(flatten)]
    backend: Backend,
}

#[derive(Args, Clone)]
struct UseArgs {
    /// A checkpoint written by `mamba2 train` (best.ckpt or last.ckpt).
    #[arg(long)]
    checkpoint: PathBuf,
    /// eval: cost of taking a position in the trading figures, in basis points of the last value.
    #[arg(long, default_value_t = 0.0)]
    cost_bps: f64,
    /// eval: also score the forecasts that `stream` makes reading the file from its first row,
    /// for the windows that end at or after this row.
    #[arg(long)]
    continuous_from: Option<usize>,
    /// predict: the column naming each row's series in a long-format file; each id's rows (in
    /// file order) are a history of their own, and each gets its forecast
    #[arg(long)]
    id_column: Option<String>,
    /// predict: with --id-column, forecast only this id
    #[arg(long)]
    id: Option<String>,
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    backend: Backend,
}

#[derive(Args, Clone)]
struct StreamArgs {
    #[arg(long)]
    checkpoint: PathBuf,
    /// Date/time column, read for the calendar (default: as in training).
    #[arg(long)]
    date_column: Option<String>,
    /// Column naming each row's series: rows of many series interleaved, each id advancing
    /// its own state (a new id starts a fresh history); the output starts with the id
    #[arg(long)]
    id_column: Option<String>,
    /// State file: restored at the start when it exists, saved atomically at the end of the
    /// input, on SIGTERM, SIGINT or SIGHUP, and every --state-every rows. After a restart, rows
    /// dated at or before their series' last row are skipped (already in the state)
    #[arg(long)]
    state: Option<PathBuf>,
    /// Rows between saves of --state
    #[arg(long, default_value_t = 10_000, value_parser = rows_between_saves)]
    state_every: u64,
    #[command(flatten)]
    backend: Backend,
}

fn load_table(d: &DataArgs, columns: Option<Vec<String>>) -> Result<(Table, bool)> {
    let choice = ColumnChoice { date_column: d.date_column.clone(), columns: columns.or_else(|| d.columns.clone()), open_end: Vec::new() };
    Ok(match &d.data {
        Some(p) => (Table::from_path(p, &choice)?, false),
        None => (Table::from_csv_str(ETTH1, ETTH1_NAME, &choice)?, true),
    })
}

/// Runs `$body` with `$B` bound to the autodiff backend the flags select.
macro_rules! with_backend {
    ($b:expr, $B:ident, $body:expr) => {{
        match ($b.device, $b.dtype) {
            (DeviceArg::Cpu, DtypeArg::F32) => {
                type $B = Autodiff<Flex>;
                $body
            }
            (DeviceArg::Cpu, DtypeArg::F64) => {
                type $B = Autodiff<NdArray<f64>>;
                $body
            }
            #[cfg(feature = "cuda")]
            (DeviceArg::Cuda, DtypeArg::F32) => {
                type $B = Autodiff<burn::backend::Cuda>;
                $body
            }
            #[cfg(feature = "cuda")]
            (DeviceArg::Cuda, DtypeArg::F64) => bail!("--device cuda supports --dtype f32 only"),
            #[cfg(not(feature = "cuda"))]
            (DeviceArg::Cuda, _) => bail!("this binary was built without CUDA; rebuild with --features cuda"),
            #[cfg(feature = "wgpu")]
            (DeviceArg::Wgpu, DtypeArg::F32) => {
                wgpu_adapter()?;
                type $B = Autodiff<burn_wgpu::Wgpu>;
                $body
            }
            #[cfg(feature = "wgpu")]
            (DeviceArg::Wgpu, DtypeArg::F64) => bail!("--device wgpu supports --dtype f32 only"),
            #[cfg(not(feature = "wgpu"))]
            (DeviceArg::Wgpu, _) => bail!("this binary was built without WebGPU; rebuild with --features wgpu"),
        }
    }};
}

/// Fails with a message, instead of CubeCL's panic on first use, where WebGPU finds no adapter.
#[cfg(feature = "wgpu")]
fn wgpu_adapter() -> Result<()> {
    use burn::tensor::Tensor;
    mamba2_model::catch_panic(|| Tensor::<burn_wgpu::Wgpu, 1>::zeros([1], &Default::default()).into_data())
        .map(drop)
        .map_err(|e| {
            let first = e.lines().next().unwrap_or_default();
            anyhow::anyhow!(
                "--device wgpu: WebGPU found no device ({first}); without a GPU, Mesa's lavapipe provides one (Debian: mesa-vulkan-drivers libvulkan1)"
            )
        })
}

/// Runs `$body` with `$I` bound to the inference backend the flags select and the checkpoint at
/// `$path` loaded on it (see [`load_model`]), for the commands that use a trained model.
macro_rules! with_model {
    ($b:expr, $path:expr, $I:ident, ($model:ident, $scaler:ident, $spec:ident, $cal:ident, $device:ident), $body:block) => {
        with_backend!($b, B, {
            type $I = <B as AutodiffBackend>::InnerBackend;
            let $device = Default::default();
            let ($model, $scaler, $spec, $cal) = load_model::<$I>($path, &$device)?;
            $body
        })
    };
}

/// Published ETTh1 results at L 96 (MSE, MAE), best first; sources in docs/forecasting.md.
fn published(h: usize) -> Vec<(&'static str, f64, f64)> {
    // The S-Mamba paper's table, every horizon.
    let row = match h {
        96 => [0.386, 0.405, 0.386, 0.405, 0.386, 0.395, 0.414, 0.419, 0.384, 0.402, 0.386, 0.400],
        192 => [0.443, 0.437, 0.441, 0.436, 0.437, 0.424, 0.460, 0.445, 0.436, 0.429, 0.437, 0.432],
        336 => [0.489, 0.468, 0.487, 0.458, 0.479, 0.446, 0.501, 0.466, 0.491, 0.469, 0.481, 0.459],
        720 => [0.502, 0.489, 0.503, 0.491, 0.481, 0.470, 0.500, 0.488, 0.521, 0.500, 0.519, 0.516],
        _ => return Vec::new(),
    };
    let names = ["S-Mamba", "iTransformer", "RLinear", "PatchTST", "TimesNet", "DLinear"];
    let mut out: Vec<(&str, f64, f64)> = (0..6).map(|i| (names[i], row[2 * i], row[2 * i + 1])).collect();
    if h == 96 {
        // Newer results, from the models' own repositories or copies of their tables.
        out.extend([
            ("OLinear", 0.360, 0.382),
            ("TimeMixer++", 0.361, 0.403),
            ("TimeMachine", 0.364, 0.387),
            ("TQNet", 0.371, 0.393),
            ("CycleNet", 0.375, 0.395),
            ("TimeMixer", 0.375, 0.400),
        ]);
    }
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    out
}

fn cmd_train(a: TrainArgs) -> Result<()> {
    check_cost_bps(a.cost_bps)?;
    let (table, is_etth1, panel) = load_training_table(&a)?;
    let (config, tc, clock) = configure(&a, &table, panel)?;
    let target_idx = table.indices(&config.spec.targets)?;
    let split = match (&a.borders, &a.split) {
        (Some(b), _) if b.len() != 3 => bail!("--borders takes three row numbers train_end,val_end,test_end, got {b:?}"),
        (Some(b), _) => Split::Borders { train: b[0], val: b[1], test: b[2] },
        (None, Some(f)) if f.len() != 2 => bail!("--split takes two fractions train,val, got {f:?}"),
        (None, Some(f)) => Split::Fractions { train: f[0], val: f[1] },
        (None, None) if is_etth1 => Split::ETTH1,
        (None, None) => Split::Fractions { train: 0.7, val: 0.1 },
    };
    let ranges = split.ranges(table.rows.len(), a.lookback)?;
    let source = a.data.data.as_ref().map_or(ETTH1_NAME.to_string(), |p| p.display().to_string());
    let scaler = Scaler::fit(&table.rows[ranges[0].0..ranges[0].1], &table.columns).with_context(|| source.clone())?;
    let rows = scaler.transform(&table.rows, &table.columns).with_context(|| source.clone())?;
    let data = Prepared { rows, scaler, ranges, targets: target_idx.clone(), clock };
    // Check that every split has windows before any work is done.
    for (name, r) in ["train", "validation", "test"].iter().zip(ranges) {
        Windows::new(&data.rows, r, a.lookback, a.horizon, 1).with_context(|| format!("{name} split"))?;
    }
    let workers = workers(&a)?;
    if workers.cluster.is_some() && a.seeds.as_ref().is_some_and(|s| s.len() > 1) {
        bail!("--seeds with --world-size: start one run over the processes per seed");
    }
    let out_dir = a.out.clone().unwrap_or_else(|| default_out(&a.data, ""));
    let seeds = a.seeds.clone().unwrap_or_else(|| vec![a.seed]);
    let dirs: Vec<PathBuf> =
        if seeds.len() > 1 { seeds.iter().map(|s| out_dir.join(format!("seed-{s}"))).collect() } else { vec![out_dir.clone()] };
    for d in &dirs {
        if !a.resume && RunDir(d.clone()).last().exists() {
            bail!("{} already holds a run; pass --resume to continue it or choose another --out", d.display());
        }
    }
    let info = RunInfo::new(&a, &table, is_etth1, &split, &config, &tc, &data, &out_dir);
    if !a.json {
        info.print(&seeds);
    }
    let mut results = Vec::new();
    for (&seed, out) in seeds.iter().zip(&dirs) {
        if seeds.len() > 1 {
            println!("== seed {seed} ({})", out.display());
        }
        let tc = TrainConfig { seed, ..tc.clone() };
        results.push(train_one(&a, &config, &tc, &data, out, &info, &workers)?);
    }
    if seeds.len() > 1 && !a.no_test {
        let (mm, ms) = figures::mean_std(&results.iter().map(|r| r.0).collect::<Vec<_>>());
        let (am, as_) = figures::mean_std(&results.iter().map(|r| r.1).collect::<Vec<_>>());
        println!();
        println!(
            "test over {} seeds ({}): MSE {mm:.4} +- {ms:.4}  MAE {am:.4} +- {as_:.4} (mean +- sample std)",
            seeds.len(),
            seeds.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
        );
        let mut json = serde_json::json!({"seeds": seeds, "test_mse": results.iter().map(|r| r.0).collect::<Vec<_>>(), "test_mae": results.iter().map(|r| r.1).collect::<Vec<_>>(), "mse_mean": mm, "mse_std": ms, "mae_mean": am, "mae_std": as_});
        let tables: Option<Vec<&mamba2_train::QuantileTables>> = results.iter().map(|r| r.2.as_ref()).collect();
        if let Some(q) = tables.and_then(|t| figures::seeds_quantiles(&t)) {
            println!("{}", q.line());
            json["quantiles"] = q.json();
        }
        mamba2_model::write_atomically(&out_dir.join("seeds.json"), serde_json::to_string_pretty(&json)?.as_bytes())?;
    }
    Ok(())
}

/// The table `train` reads: `--data` (or the embedded ETTh1), or with `--id-column` the
/// long-format panel pivoted to a column per id (see [`mamba2_data::panel`]); whether it is the
/// embedded ETTh1; how the panel was read.
fn load_training_table(a: &TrainArgs) -> Result<(Table, bool, Option<PanelSpec>)> {
    let Some(id) = &a.id_column else {
        let (table, is_etth1) = load_table(&a.data, None)?;
        return Ok((table, is_etth1, None));
    };
    let Some(path) = &a.data.data else {
        bail!("--id-column {id}: the embedded ETTh1 is one wide table; give a long-format file with --data");
    };
    if a.mix {
        bail!("--mix with --id-column: each series would read every other series at every date, and a panel's series are missing where they have no row");
    }
    // `--columns value,a,b`: the value column, then covariates of each id (known ahead where
    // they are in --future-columns, which join them).
    let future = a.future_columns.clone().unwrap_or_default();
    let mut covariates: Vec<String> = a.data.columns.iter().flat_map(|c| c.iter().skip(1)).cloned().collect();
    covariates.extend(future.iter().filter(|f| !covariates.contains(f)).cloned().collect::<Vec<_>>());
    let columns = a.data.columns.as_ref().map(|c| c[..1].iter().chain(&covariates).cloned().collect::<Vec<_>>());
    if let Some(v) = a.data.columns.as_ref().and_then(|c| c.first()).filter(|v| future.contains(v)) {
        bail!("--future-columns {v}: the column is the panel's value column (the first of --columns); a future covariate is known ahead, not forecast");
    }
    let choice = ColumnChoice { date_column: a.data.date_column.clone(), columns, open_end: Vec::new() };
    let (mut table, value_column) = mamba2_data::panel::read_long_with(path, id, &choice, &covariates)?;
    // `--targets` picks ids (and their covariates): the others are left out, since a series
    // reads no other.
    if let Some(ids) = &a.targets {
        let mut names = ids.clone();
        for i in ids {
            names.extend(covariates.iter().map(|c| mamba2_data::panel::covariate_column(i, c)));
        }
        let keep = table.indices(ids).with_context(|| format!("--targets of a panel name its ids (column `{id}`)"))?;
        let keep: Vec<usize> = keep.into_iter().chain(table.indices(&names[ids.len()..])?).collect();
        table.rows = table.rows.iter().map(|r| keep.iter().map(|&j| r[j]).collect()).collect();
        table.columns = names;
    }
    Ok((table, false, Some(PanelSpec { id_column: id.clone(), value_column, covariates })))
}

/// The predicted columns: `--targets`, else every column but the future covariates (which are
/// known, not forecast); checks `--future-columns`.
fn train_targets(a: &TrainArgs, table: &Table, panel: Option<&PanelSpec>) -> Result<Vec<String>> {
    if let Some(p) = panel {
        // The pivot's columns: the ids, then their covariates.
        let n_ids = table.columns.len() / (1 + p.covariates.len());
        return Ok(table.columns[..n_ids].to_vec());
    }
    let future = a.future_columns.clone().unwrap_or_default();
    if let Some(unknown) = future.iter().find(|f| !table.columns.contains(f)) {
        bail!("--future-columns {unknown}: no such column (columns: {})", table.columns.join(", "));
    }
    let targets = a.targets.clone().unwrap_or_else(|| table.columns.iter().filter(|c| !future.contains(c)).cloned().collect());
    if let Some(both) = future.iter().find(|f| targets.contains(f)) {
        bail!("--future-columns {both}: the column is also a target; a future covariate is known ahead, not forecast");
    }
    if targets.is_empty() {
        bail!("--future-columns {}: every column is a future covariate; name the forecast ones with --targets", future.join(","));
    }
    Ok(targets)
}

/// The model and training settings the flags ask for on `table`, and each row's calendar clock.
fn configure(a: &TrainArgs, table: &Table, panel: Option<PanelSpec>) -> Result<(ForecasterConfig, TrainConfig, Vec<i64>)> {
    let targets = train_targets(a, table, panel.as_ref())?;
    // An unknown target is named as the table's error, before the config's own check.
    table.indices(&targets)?;
    let calendar = if a.no_calendar { None } else { table.times.as_deref().and_then(Calendar::detect) };
    let clock = clock_of(table, calendar.as_ref());
    let mut config = ForecasterConfig::defaults(a.lookback, a.horizon, table.columns.clone(), targets, calendar);
    let (spec, bb) = (&mut config.spec, &mut config.backbone);
    bb.d_model = a.d_model.unwrap_or(bb.d_model);
    bb.n_layer = a.layers.unwrap_or(bb.n_layer);
    bb.d_state = a.d_state.unwrap_or(bb.d_state);
    bb.headdim = a.headdim.unwrap_or(bb.headdim);
    bb.expand = a.expand.unwrap_or(bb.expand);
    bb.chunk_size = a.chunk_size.unwrap_or(bb.chunk_size);
    spec.patch = a.patch.unwrap_or(spec.patch);
    spec.direct = !a.no_direct;
    spec.norm_window = a.norm_window.unwrap_or(spec.norm_window);
    spec.scale = a.scale;
    spec.cycle = if spec.calendar.is_some() { a.cycle.unwrap_or(spec.cycle) } else { 0 };
    spec.series_embedding = !a.no_series_embedding;
    spec.mix = a.mix;
    spec.dropout = a.dropout;
    let future = a.future_columns.clone().unwrap_or_default();
    spec.future = match &panel {
        // A panel's ids' covariates known ahead, by their columns in the pivot.
        Some(p) => spec
            .targets
            .iter()
            .flat_map(|t| p.covariates.iter().filter(|c| future.contains(c)).map(|c| mamba2_data::panel::covariate_column(t, c)))
            .collect(),
        None => future,
    };
    spec.panel = panel;
    if let Some(path) = &a.static_data {
        let table = mamba2_data::statics::StaticTable::from_path(path)?;
        let (inputs, values) = table.encode(&spec.targets)?;
        spec.statics = Some(mamba2_forecast::StaticSpec { columns: table.columns, inputs, values });
    }
    config.validate()?;
    let tc = TrainConfig {
        epochs: a.epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        weight_decay: a.weight_decay,
        patience: a.patience,
        seed: a.seed,
        stride: a.stride,
        repeat_check: !a.no_repeat_check,
        quantiles: a.quantiles.clone(),
        loss_from: a.loss_from,
        loss_every: a.loss_every,
        ema: match a.ema {
            Some(d) if d > 0.0 => Some(d),
            Some(_) => None,
            None => TrainConfig::default().ema,
        },
        loss: match a.loss {
            LossArg::Mse => Loss::Mse,
            LossArg::Mae => Loss::Mae,
            LossArg::MseMae => Loss::MseMae,
        },
        ..TrainConfig::default()
    };
    tc.validate()?;
    Ok((config, tc, clock))
}

/// `runs/<data file name><suffix>`, where a command writes when `--out` is not given.
fn default_out(d: &DataArgs, suffix: &str) -> PathBuf {
    let stem = d.data.as_ref().and_then(|p| p.file_stem()).map_or("etth1".into(), |s| s.to_string_lossy().to_string());
    PathBuf::from("runs").join(format!("{stem}{suffix}"))
}

/// Fails unless `--cost-bps` is a cost: finite and not negative.
fn check_cost_bps(bps: f64) -> Result<()> {
    if !(bps.is_finite() && bps >= 0.0) {
        bail!("--cost-bps {bps} is not a cost: give basis points, 0 or more");
    }
    Ok(())
}

/// The data-parallel workers the flags ask for.
fn workers(a: &TrainArgs) -> Result<Workers> {
    if !(a.peer_timeout.is_finite() && a.peer_timeout > 0.0) {
        bail!("--peer-timeout {} is not a positive number of seconds", a.peer_timeout);
    }
    let cluster = match (a.world_size, &a.coordinator) {
        (1, None) if a.rank > 0 => bail!("--rank {} needs --world-size above it", a.rank),
        (1, None) if a.listen.is_some() => bail!("--listen needs --world-size above 1"),
        (1, None) => None,
        (1, Some(c)) => bail!("--coordinator {c} needs --world-size above 1"),
        (w, None) => bail!("--world-size {w} needs --coordinator HOST:PORT (where process 0 runs the coordinator)"),
        (w, Some(c)) => Some(Cluster::new(w as usize, a.rank as usize, c, a.listen.as_deref())?),
    };
    Ok(Workers { threads: a.workers as usize, cluster, timeout: std::time::Duration::from_secs_f64(a.peer_timeout) })
}

/// One training run into `out`, then its test metrics (printed, and returned as (MSE, MAE);
/// NaN with `--no-test` and on every process but 0 of a run over several).
fn train_one(
    a: &TrainArgs,
    config: &ForecasterConfig,
    tc: &TrainConfig,
    data: &Prepared,
    out: &Path,
    info: &RunInfo,
    workers: &Workers,
) -> Result<(f64, f64, Option<mamba2_train::QuantileTables>)> {
    let dir = RunDir(out.to_path_buf());
    let started = std::time::Instant::now();
    let ranges = data.ranges;
    let mut reporter = Reporter::new(a.json, tc.epochs, config.spec.lookback * config.spec.targets.len());
    with_backend!(a.backend, B, {
        let device = Default::default();
        let summary = train_parallel::<B>(config, tc, data, &dir, a.resume, &device, workers, |p| reporter.show(p))?;
        if let Some(c) = workers.cluster.as_ref().filter(|c| c.process > 0) {
            println!(
                "process {} of {}: trained {} epochs with the others; process 0 evaluates and writes {}",
                c.process,
                c.processes,
                summary.history.len(),
                out.display()
            );
            return Ok((f64::NAN, f64::NAN, None));
        }
        let loaded =
            load_checkpoint::<<B as AutodiffBackend>::InnerBackend, Forecaster<_>, ForecasterConfig>(&dir.best(), &device, |c, d| {
                c.init(d)
            })?;
        let test = Windows::new(&data.rows, ranges[2], a.lookback, a.horizon, 1)?;
        let best = &summary.history[summary.best_epoch.max(1) - 1];
        println!(
            "best epoch {} of {}{}: validation MSE {:.4}, MAE {:.4}; best.ckpt holds it",
            summary.best_epoch,
            summary.history.len(),
            if summary.stopped_early { " (early stop)" } else { "" },
            best.val_mse,
            best.val_mae,
        );
        if let Some(b) = &summary.blend {
            println!("{}", b.describe());
        }
        if let Some(c) = &summary.calibration {
            println!("{}", calibration_line(c));
        }
        let mut summary_json = info.json();
        summary_json["best_epoch"] = summary.best_epoch.into();
        summary_json["epochs_run"] = summary.history.len().into();
        summary_json["val_mse"] = best.val_mse.into();
        summary_json["val_mae"] = best.val_mae.into();
        summary_json["val_skill"] = best.val_skill.into();
        summary_json["val_repeat_mse"] = summary.val_repeat.0.into();
        summary_json["val_repeat_mae"] = summary.val_repeat.1.into();
        if let Some((p, m, e)) = summary.val_seasonal {
            summary_json["val_seasonal"] = serde_json::json!({"period": p, "mse": m, "mae": e});
        }
        summary_json["blend"] = serde_json::to_value(&summary.blend)?;
        if let Some(c) = &summary.calibration {
            let iv = &c.model;
            summary_json["calibration"] = serde_json::json!({
                "levels": iv.levels, "scale": iv.scale, "window": iv.window, "per_target": iv.per_target,
                "floor": iv.floor, "typical": iv.typical, "windows": c.windows, "candidates": c.candidates,
            });
        }
        loss_plot(out, &summary.history, summary.best_epoch)?;
        if a.no_test {
            let secs = started.elapsed().as_secs_f64();
            println!("wall time {secs:.0} s; test split not evaluated (--no-test)");
            summary_json["wall_seconds"] = secs.into();
            mamba2_model::write_atomically(&out.join("summary.json"), serde_json::to_string_pretty(&summary_json)?.as_bytes())?;
            println!("{}", wrote(out, &["loss.png"]));
            return Ok((f64::NAN, f64::NAN, None));
        }
        let repeat = repeat_table(&test, &data.targets, 32);
        let units = data.targets.iter().map(|&j| (data.scaler.mean[j], data.scaler.std[j])).collect();
        let calibration = summary.calibration.as_ref();
        let (errors, trades, quantiles) =
            trade_table(&loaded.module, &test, &data.clock, test.len() / 32 * 32, 32, units, a.cost_bps, calibration, &device)?;
        let ((mse, mae), (rmse, rmae)) = (errors.total().mse_mae(), repeat.total().mse_mae());
        let secs = started.elapsed().as_secs_f64();
        println!("wall time {secs:.0} s");
        println!(
            "test (L {}, H {}, {} windows, batch 32, last partial batch dropped), scaled units:",
            a.lookback,
            a.horizon,
            test.len() / 32 * 32
        );
        println!("  {:<14} MSE {:.4}  MAE {:.4}", "mamba2", mse, mae);
        println!("  {:<14} MSE {:.4}  MAE {:.4}", "Repeat", rmse, rmae);
        // The seasonal naive forecast of the validation baselines, on the same test windows.
        let seasonal =
            summary.val_seasonal.map(|(p, _, _)| (p, mamba2_data::seasonal_table(&test, &data.targets, p, 32).total().mse_mae()));
        if let Some((p, (m, e))) = seasonal {
            println!("  {:<14} MSE {m:.4}  MAE {e:.4}", format!("seasonal {p}"));
        }
        println!("test against Repeat, per forecast step:");
        figures::print(&errors, &repeat, &trades, "in the data's units, summed over the targets");
        if let Some(q) = &quantiles {
            println!("test quantiles beside conformal Repeat, per forecast step:");
            figures::print_quantiles(q);
        }
        // The same errors in each column's own units: the scaler divided column j by std_j.
        println!("test per column, in the data's units:");
        let mut units = Vec::new();
        for (t, (name, &j)) in config.spec.targets.iter().zip(&data.targets).enumerate() {
            let sums = errors.target(t);
            if sums.n == 0 {
                // A panel's series with no test window of all its values.
                println!("  {name:<14} no test window: it lacks values there");
                units.push(serde_json::json!({"column": name, "windows": 0}));
                continue;
            }
            let (m, ae) = sums.mse_mae();
            let sd = data.scaler.std[j];
            println!("  {name:<14} MSE {:<12.6} MAE {:<10.6} (RMSE {:.6})", m * sd * sd, ae * sd, (m * sd * sd).sqrt());
            units.push(serde_json::json!({"column": name, "windows": sums.n / a.horizon, "mse": m * sd * sd, "mae": ae * sd, "mse_scaled": m, "mae_scaled": ae}));
        }
        if info.is_etth1 && a.lookback == 96 && config.spec.targets.len() == 7 {
            let rows = published(a.horizon);
            if !rows.is_empty() {
                println!("published (ETTh1, L 96, scaled units; sources in docs/forecasting.md):");
                for (name, m, e) in rows {
                    println!("  {name:<14} MSE {m:.3}  MAE {e:.3}");
                }
            }
        }
        for (k, v) in [("test_mse", mse), ("test_mae", mae), ("repeat_mse", rmse), ("repeat_mae", rmae), ("wall_seconds", secs)] {
            summary_json[k] = v.into();
        }
        summary_json["test_windows"] = (test.len() / 32 * 32).into();
        let (overall, per_step) = figures::json(&errors, &repeat, &trades);
        summary_json["test"] = overall;
        if let Some((p, (m, e))) = seasonal {
            summary_json["test_seasonal"] = serde_json::json!({"period": p, "mse": m, "mae": e});
        }
        summary_json["test_per_step"] = per_step;
        summary_json["cost_bps"] = a.cost_bps.into();
        summary_json["test_per_column"] = units.into();
        if let Some(q) = &quantiles {
            let (overall, per_step) = figures::quantile_json(q);
            summary_json["test_quantiles"] = overall;
            summary_json["test_quantiles_per_step"] = per_step;
        }
        mamba2_model::write_atomically(&out.join("summary.json"), serde_json::to_string_pretty(&summary_json)?.as_bytes())?;
        test_plots(out, &loaded.module, &test, data, (&errors, &repeat), calibration, &device)?;
        let mut plots = vec!["loss.png", "forecast.png", "error_by_step.png"];
        if let Some(q) = &quantiles {
            reliability_plot(out, q)?;
            plots.push("reliability.png");
        }
        println!("{}", wrote(out, &plots));
        Ok((mse, mae, quantiles))
    })
}

/// The run's closing line: every file it left in `out`, and what the ones a user does not open
/// are for (the optimizer's state and the weight average are named by epoch, so they are listed
/// as found).
fn wrote(out: &Path, plots: &[&str]) -> String {
    let mut state: Vec<String> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| (n.starts_with("optim-") && n.ends_with(".safetensors")) || (n.starts_with("ema-") && n.ends_with(".ckpt")))
        .collect();
    state.sort();
    let mut line = format!("wrote {}: best.ckpt (the model to eval, predict and stream); last.ckpt", out.display());
    for f in &state {
        line += ", ";
        line += f;
    }
    line += " (what --resume continues from); metrics.jsonl, summary.json";
    for p in plots {
        line += ", ";
        line += p;
    }
    line
}

/// What a run reads, how it splits it, and what it trains: printed before training and recorded
/// in `summary.json`.
struct RunInfo {
    is_etth1: bool,
    lines: Vec<(String, String)>,
    json: serde_json::Value,
}

impl RunInfo {
    #[allow(clippy::too_many_arguments)]
    fn new(
        a: &TrainArgs,
        table: &Table,
        is_etth1: bool,
        split: &Split,
        config: &ForecasterConfig,
        tc: &TrainConfig,
        data: &Prepared,
        out: &Path,
    ) -> Self {
        let s = &config.spec;
        let source = a.data.data.as_ref().map_or(ETTH1_NAME.to_string(), |p| p.display().to_string());
        let [tr, va, te] = data.ranges;
        // A panel's windows are those where some series has every value.
        let windows = |r: (usize, usize)| Windows::new(&data.rows, r, s.lookback, s.horizon, 1).map_or(0, |w| w.len());
        let split_kind = match split {
            Split::Borders { .. } if is_etth1 && a.borders.is_none() => "the ETT protocol's borders",
            Split::Borders { .. } => "--borders",
            Split::Fractions { .. } if a.split.is_some() => "--split fractions",
            Split::Fractions { .. } => "default fractions 0.7, 0.1, 0.2",
        };
        let calendar = match (&s.calendar, &table.date_column) {
            (Some(c), Some(d)) => format!(
                "date column `{d}`, a row every {} s, cycles of {} rows{}",
                c.interval,
                c.periods.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(" and "),
                if s.cycle > 0 { format!(", learned cycle of {} rows", s.cycle) } else { String::new() }
            ),
            (None, Some(d)) if table.times.is_some() => format!("date column `{d}` (no calendar: irregular or --no-calendar)"),
            (None, Some(d)) => format!("column `{d}` skipped: it does not read as dates, so no calendar"),
            (None, None) | (Some(_), None) => "no date column, so no calendar".into(),
        };
        // Counted on Flex: NdArray<f32> beside a training NdArray<f64> in one process mixes their float types.
        let params = config.init::<Flex>(&Default::default()).map(|m| burn::module::Module::num_params(&m)).unwrap_or(0);
        let steps = (windows(tr) / tc.stride).div_ceil(tc.batch_size);
        let b = &config.backbone;
        let threads = rayon::current_num_threads();
        let backend = match (a.backend.device, a.backend.dtype) {
            (DeviceArg::Cpu, DtypeArg::F32) => "CPU, Flex f32",
            (DeviceArg::Cpu, DtypeArg::F64) => "CPU, NdArray f64",
            (DeviceArg::Cuda, _) => "CUDA f32",
            (DeviceArg::Wgpu, _) => "WebGPU f32",
        };
        let data_line = match &s.panel {
            None => format!("{source}: {} rows, {} columns ({}); {calendar}", table.rows.len(), s.features.len(), s.features.join(", ")),
            Some(p) => {
                let n = s.targets.len();
                let shown = s.targets.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
                let more = if n > 8 { format!(" and {} more", n - 8) } else { String::new() };
                let missing = table.rows.iter().map(|r| r[..n].iter().filter(|v| v.is_nan()).count()).sum::<usize>();
                let future = s.series_future();
                let quoted = |cs: Vec<&String>| cs.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ");
                let (ahead, past): (Vec<&String>, Vec<&String>) = p.covariates.iter().partition(|c| future.contains(c));
                let covariates = match (past.is_empty(), ahead.is_empty()) {
                    (true, true) => String::new(),
                    (true, false) => format!(", each id with its own {} known ahead", quoted(ahead)),
                    (false, true) => format!(", each id with its own {}", quoted(past)),
                    (false, false) => format!(", each id with its own {} and {} known ahead", quoted(past), quoted(ahead)),
                };
                format!(
                    "{source}: long format, {n} series (ids in column `{}`: {shown}{more}), values `{}`{covariates}, on {} dates ({missing} id-date pairs without a row); {calendar}",
                    p.id_column,
                    p.value_column,
                    table.rows.len()
                )
            }
        };
        let lines = vec![
            ("data".into(), data_line),
            (
                "split".into(),
                format!(
                    "{split_kind}: train rows {}..{} ({} windows), validation {}..{} ({}), test {}..{} ({})",
                    tr.0,
                    tr.1,
                    windows(tr),
                    va.0,
                    va.1,
                    windows(va),
                    te.0,
                    te.1,
                    windows(te)
                ),
            ),
            (
                "task".into(),
                match s.panel.as_ref().filter(|p| !p.covariates.is_empty()) {
                    Some(p) => format!(
                        "L {}, H {}: {} predicted series, each a sequence of its own reading its own id's {} covariates ({}; known ahead: {})",
                        s.lookback,
                        s.horizon,
                        s.targets.len(),
                        p.covariates.len(),
                        p.covariates.join(", "),
                        if s.future.is_empty() { "none".to_string() } else { s.series_future().join(", ") }
                    ),
                    None => format!(
                        "L {}, H {}: {} predicted series, each a sequence of its own; {} covariates{}",
                        s.lookback,
                        s.horizon,
                        s.targets.len(),
                        s.features.len() - s.targets.len() + if s.mix { s.targets.len() } else { 0 },
                        if s.future.is_empty() {
                            String::new()
                        } else {
                            format!(" ({} known ahead: {})", s.future.len(), s.future.join(", "))
                        }
                    ),
                } + &s.statics.as_ref().map_or(String::new(), |st| {
                    format!("; {} static input{} of each series from {}", st.inputs.len(), if st.inputs.len() == 1 { "" } else { "s" }, st.columns.join(", "))
                }),
            ),
            (
                "model".into(),
                format!(
                    "Mamba-2 d_model {}, {} block{}, d_state {}, headdim {}, expand {}; patch {}, rolling mean over {} rows{}; {params} parameters",
                    b.d_model,
                    b.n_layer,
                    if b.n_layer == 1 { "" } else { "s" },
                    b.d_state,
                    b.headdim,
                    b.expand,
                    s.patch,
                    s.norm_window,
                    if s.scale { " and std" } else { "" }
                ),
            ),
            (
                "training".into(),
                format!(
                    "at most {} epoch{} (early stop after {} without a better validation MSE), each about {steps} steps of {} windows \
                     (1 in {} of the training windows), peak lr {:e}, loss {}, {}",
                    tc.epochs,
                    if tc.epochs == 1 { "" } else { "s" },
                    tc.patience,
                    tc.batch_size,
                    tc.stride,
                    tc.lr,
                    match tc.loss {
                        Loss::Mse => "mse",
                        Loss::Mae => "mae",
                        Loss::MseMae => "mse + mae",
                    },
                    match tc.ema {
                        Some(d) => format!("the moving average of the weights (decay {d}) evaluated and kept"),
                        None => "the weights evaluated as trained".into(),
                    }
                ),
            ),
            (
                "backend".into(),
                match (a.workers, a.world_size) {
                    (1, 1) => format!("{backend}, {threads} threads"),
                    (w, 1) => format!("{backend}, {threads} threads, {w} data-parallel workers (up to {} windows each per step)", tc.batch_size.div_ceil(w as usize)),
                    (w, p) => format!(
                        "{backend}, {threads} threads, process {} of {p} (coordinator {}), {} data-parallel workers in all (up to {} windows each per step)",
                        a.rank,
                        a.coordinator.as_deref().unwrap_or("?"),
                        w * p,
                        tc.batch_size.div_ceil((w * p) as usize)
                    ),
                },
            ),
            ("out".into(), out.display().to_string()),
        ];
        let json = serde_json::json!({
            "data": source,
            "rows": table.rows.len(),
            "columns": s.features,
            "targets": s.targets,
            "split": split_kind,
            "ranges": {"train": [tr.0, tr.1], "validation": [va.0, va.1], "test": [te.0, te.1]},
            "windows": {"train": windows(tr), "validation": windows(va), "test": windows(te)},
            "parameters": params,
        });
        Self { is_etth1, lines, json }
    }

    fn print(&self, seeds: &[u64]) {
        for (k, v) in &self.lines {
            println!("{k:<9} {v}");
        }
        if seeds.len() > 1 {
            println!("{:<9} {}", "seeds", seeds.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "));
        }
        println!();
    }

    fn json(&self) -> serde_json::Value {
        self.json.clone()
    }
}

/// The run's charts (sample images in docs/img/):
/// - `loss.png`: training loss and validation MSE and MAE per epoch, the best epoch marked;
/// - `forecast.png`: the last target (in a panel, the last series with every value of the first
///   test window) over the first test window: its lookback and what followed
///   (black) and the forecast (red), in the data's units; for H 1, the one-step forecasts over
///   the first 240 test rows instead;
/// - `error_by_step.png`: test MSE per forecast step, the model's and Repeat's.
#[allow(clippy::too_many_arguments)]
fn line(label: &str, points: Vec<(f64, f64)>, rgb: [u8; 3], dashed: bool) -> Line<'_> {
    Line { label, points, rgb, markers: false, dashed }
}

/// `loss.png`: the training loss and the validation errors per epoch, and the best epoch.
fn loss_plot(out: &Path, history: &[mamba2_train::EpochRecord], best_epoch: usize) -> Result<()> {
    let per_epoch = |f: fn(&mamba2_train::EpochRecord) -> f64| history.iter().map(|r| (r.epoch as f64, f(r))).collect::<Vec<_>>();
    draw(
        &out.join("loss.png"),
        &Chart {
            title: "Loss per epoch",
            x_label: "epoch",
            y_label: "loss (scaled units)",
            lines: vec![
                line("training loss (the optimised one)", per_epoch(|r| r.train_loss), [31, 119, 180], false),
                line("validation MSE", per_epoch(|r| r.val_mse), [255, 127, 14], false),
                line("validation MAE", per_epoch(|r| r.val_mae), [44, 160, 44], true),
            ],
            marks: vec![(best_epoch as f64, format!("best epoch ({best_epoch}): best.ckpt"))],
            integer_x: true,
            bands: Vec::new(),
        },
        720,
        420,
    )?;
    Ok(())
}

/// `forecast.png` (the first test window's forecast, or for H 1 a stretch of one-step
/// forecasts, in the data's units) and `error_by_step.png` (test MSE per forecast step beside
/// Repeat's).
fn test_plots<B: burn::prelude::Backend>(
    out: &Path,
    model: &Forecaster<B>,
    test: &Windows,
    data: &Prepared,
    (errors, repeat): (&ErrorTable, &ErrorTable),
    calibration: Option<&Calibration>,
    device: &B::Device,
) -> Result<()> {
    let (l, h) = (test.lookback, test.horizon);
    let targets = model.target_indices();
    // The plotted series: the last target, or in a panel the last one with every value of the
    // first test window; its forecasts alone (each series is a sequence of its own).
    let tp = test.present_targets(0, targets).last().copied().expect("a window holds a series");
    let map = model.feature_map().only(&[tp]);
    let j = targets[tp];
    let name = model.spec().targets[tp].clone();
    // The widest central interval of its quantiles after the window starting at `s`, for its
    // point forecasts.
    let pair = calibration.and_then(|c| central_pairs(&c.model.levels).first().copied());
    let interval = |s: usize, point: &[f64]| -> Option<Vec<(f64, f64)>> {
        let (c, (a, b, _)) = (calibration?, pair?);
        let iv = &c.model;
        let mut recent = Vec::new();
        iv.recent_in(test.rows, s + l - 1, j, &mut recent);
        let n_q = iv.levels.len();
        let q = iv.quantiles_at(&[tp], point, |_| &recent);
        Some((0..h).map(|k| (q[k * n_q + a], q[k * n_q + b])).collect())
    };
    let mut band: Vec<(f64, f64, f64)> = Vec::new();
    let units = |v: f64| data.scaler.inverse(j, v);
    let forecast_title;
    type Points = Vec<(f64, f64)>;
    let (actual, forecast): (Points, Points) = if h == 1 {
        // One-step forecasts over a stretch of the test split, each from its own window.
        let starts: Vec<usize> =
            (0..test.len()).filter(|&i| test.present_targets(i, targets).contains(&tp)).map(|i| test.starts[i]).take(240).collect();
        let n = starts.len();
        let hb = map.build::<B::FloatElem>(test.rows, &data.clock, &starts, l, 1, 1, Truth::Values);
        let truth = hb.truth.clone();
        let pred = to_f64_vec(model.forward(&hb.into_device(1, device))?);
        forecast_title = format!("{name}: one-step forecasts over the first {n} test rows");
        let pick = |v: &[f64]| (0..n).map(|w| (w as f64 + 1.0, units(v[w]))).collect();
        for (w, &s) in starts.iter().enumerate() {
            if let Some(iv) = interval(s, &pred[w..w + 1]) {
                band.push((w as f64 + 1.0, units(iv[0].0), units(iv[0].1)));
            }
        }
        (pick(&truth), pick(&pred))
    } else {
        let s = test.starts[0];
        let hb = map.build::<B::FloatElem>(test.rows, &data.clock, &[s], l, 1, 1, Truth::Values);
        let pred = to_f64_vec(model.forward(&hb.into_device(h, device))?);
        forecast_title = format!("{name}: the forecast after the first test window (L {l}, H {h})");
        let actual = (0..l + h).map(|i| (i as f64 - (l as f64 - 1.0), units(test.rows[s + i][j]))).collect();
        if let Some(iv) = interval(s, &pred) {
            band = iv.iter().enumerate().map(|(k, &(lo, hi))| ((k + 1) as f64, units(lo), units(hi))).collect();
        }
        (actual, pred.iter().enumerate().map(|(k, &v)| ((k + 1) as f64, units(v))).collect())
    };
    let x_label = if h == 1 { "test row" } else { "rows after the last one the model saw" };
    let band_label = pair.map_or(String::new(), |(_, _, nominal)| format!("{:.0} % interval", 100.0 * nominal));

    draw(
        &out.join("forecast.png"),
        &Chart {
            title: &forecast_title,
            x_label,
            y_label: &format!("{name} (data units)"),
            lines: vec![line("actual", actual, [0, 0, 0], false), line("forecast", forecast, [214, 39, 40], false)],
            marks: if h == 1 { Vec::new() } else { vec![(0.0, "the last row the model saw".into())] },
            integer_x: true,
            bands: if band.is_empty() { Vec::new() } else { vec![Band { label: &band_label, points: band, rgb: BAND_RGB }] },
        },
        720,
        420,
    )?;
    let by_step = |e: &ErrorTable| (0..h).map(|k| ((k + 1) as f64, e.step(k).mse_mae().0)).collect::<Vec<_>>();
    draw(
        &out.join("error_by_step.png"),
        &Chart {
            title: "Test error by forecast step",
            x_label: "forecast step",
            y_label: "MSE (scaled units, all targets)",
            lines: vec![line("mamba2", by_step(errors), [214, 39, 40], false), line("Repeat", by_step(repeat), [127, 127, 127], true)],
            marks: Vec::new(),
            integer_x: true,
            bands: Vec::new(),
        },
        720,
        420,
    )?;
    Ok(())
}

/// `reliability.png`: for each quantile level, the share of test values at or below the
/// forecast quantile, the model's and conformal Repeat's, beside the diagonal a calibrated
/// forecast follows.
fn reliability_plot(out: &Path, q: &mamba2_train::QuantileTables) -> Result<()> {
    let levels = &q.model.levels;
    let observed = |t: &mamba2_data::quantile::IntervalTable| levels.iter().copied().zip(t.total().below).collect::<Vec<_>>();
    let ideal = [0.0, 1.0].iter().map(|&x| (x, x)).collect();
    let mut lines = vec![
        line("calibrated (observed = nominal)", ideal, [170, 170, 170], true),
        line("conformal Repeat", observed(&q.repeat), [127, 127, 127], false),
        line("mamba2", observed(&q.model), [214, 39, 40], false),
    ];
    for l in &mut lines[1..] {
        l.markers = true;
    }
    draw(
        &out.join("reliability.png"),
        &Chart {
            title: "Test reliability of the quantile forecasts",
            x_label: "quantile level (nominal share at or below)",
            y_label: "observed share at or below (all targets and steps)",
            lines,
            marks: Vec::new(),
            integer_x: false,
            bands: Vec::new(),
        },
        560,
        520,
    )?;
    Ok(())
}

/// One line on how the quantiles were calibrated.
fn calibration_line(c: &Calibration) -> String {
    let levels: Vec<String> = c.model.levels.iter().map(|q| format!("{q}")).collect();
    let chosen = c
        .candidates
        .iter()
        .find(|k| k.scale == c.model.scale && k.window == c.model.window && k.per_target == c.model.per_target)
        .map_or(f64::NAN, |k| k.pinball);
    let plain = c.candidates.first().map_or(f64::NAN, |k| k.pinball);
    if c.model.scale == mamba2_data::quantile::ScaleKind::ChangeStd {
        let best = c.candidates.iter().map(|k| k.pinball).fold(f64::NAN, f64::min);
        return format!(
            "quantiles {}: Repeat is kept, so {} (no error quantile fitted; the best conformal way to scale scored {best:.4} \
             on validation's {} blocks, {plain:.4} unscaled)",
            levels.join(", "),
            c.model.describe(),
            mamba2_data::quantile::FOLDS
        );
    }
    format!(
        "quantiles {} from the validation errors: {} (of {} ways to scale, the lowest pinball loss when each of {} blocks of \
         validation is scored fitted on the others: {chosen:.4}, against {plain:.4} unscaled); refitted on all {} windows",
        levels.join(", "),
        c.model.describe(),
        c.candidates.len(),
        mamba2_data::quantile::FOLDS,
        c.windows
    )
}

/// A checkpoint opened for `eval`, `predict` and `stream`: the model, the scaler it was trained
/// with, what it reads and predicts, and its quantile calibration where it has one.
fn load_model<B: burn::prelude::Backend>(
    path: &Path,
    device: &B::Device,
) -> Result<(Forecaster<B>, Scaler, ForecastSpec, Option<Calibration>)> {
    let mamba2_forecast::Opened { model, scaler, calibration, .. } = mamba2_forecast::open_forecaster::<B>(path, device)?;
    let spec = model.spec().clone();
    Ok((model, scaler, spec, calibration))
}

/// Each row's calendar clock: whole sampling intervals since the epoch where the data has a
/// calendar, else row numbers.
fn clock_of(table: &Table, calendar: Option<&Calendar>) -> Vec<i64> {
    match (calendar, &table.times) {
        (Some(cal), Some(times)) => times.iter().map(|&t| cal.clock(t)).collect(),
        _ => (0..table.rows.len() as i64).collect(),
    }
}

/// The rows of `--data` (or the embedded data) in the model's feature columns, scaled as in
/// training, and their calendar clock.
fn scaled_rows(d: &DataArgs, spec: &ForecastSpec, scaler: &Scaler) -> Result<(Vec<Vec<f64>>, Vec<i64>)> {
    let (mut rows, mut clock, ahead) = scaled_rows_ahead(d, spec, scaler)?;
    rows.truncate(rows.len() - ahead);
    clock.truncate(rows.len());
    if rows.is_empty() {
        bail!("{}: every row is a row ahead (its targets empty): there is no history", data_name(d));
    }
    Ok((rows, clock))
}

/// The name of `--data` (or the embedded data) in messages.
fn data_name(d: &DataArgs) -> String {
    d.data.as_ref().map_or(ETTH1_NAME.to_string(), |p| p.display().to_string())
}

/// [`scaled_rows`] with the rows ahead that a model reading future covariates needs: the file's
/// last rows whose other columns are all empty (NaN here); returns how many there are (0 for
/// another model, whose rows have no empty cell).
fn scaled_rows_ahead(d: &DataArgs, spec: &ForecastSpec, scaler: &Scaler) -> Result<(Vec<Vec<f64>>, Vec<i64>, usize)> {
    let table = match &spec.panel {
        None if !spec.future.is_empty() => {
            let choice = wide_choice(spec, d.date_column.clone());
            match &d.data {
                Some(p) => Table::from_path(p, &choice)?,
                None => Table::from_csv_str(ETTH1, ETTH1_NAME, &choice)?,
            }
        }
        None => load_table(d, Some(spec.features.clone()))?.0,
        Some(p) => read_panel(d, spec, p)?,
    };
    if spec.calendar.is_some() && table.times.is_none() {
        bail!("the model reads calendar cycles from a date column; this data has none that reads as dates");
    }
    let idx = table.indices(&spec.features)?;
    let rows: Vec<Vec<f64>> = table.rows.iter().map(|r| idx.iter().map(|&j| r[j]).collect()).collect();
    // Rows ahead are NaN in every column but the future ones (and in none without them).
    let first = spec.features.iter().position(|f| !spec.future.contains(f)).unwrap_or(0);
    let ahead = if spec.future.is_empty() { 0 } else { rows.iter().rev().take_while(|r| r[first].is_nan()).count() };
    let rows = scaler.transform(&rows, &spec.features).with_context(|| data_name(d))?;
    Ok((rows, clock_of(&table, spec.calendar.as_ref()), ahead))
}

/// `--data` in long format as the panel model `spec` was trained on (its id and value columns),
/// pivoted to a column per id; each of the model's series must have rows in it.
fn read_panel(d: &DataArgs, spec: &ForecastSpec, p: &PanelSpec) -> Result<Table> {
    let Some(path) = &d.data else {
        bail!("the model was trained on a long-format panel (ids in column `{}`); give such a file with --data", p.id_column);
    };
    // Scored rows hold every value: no rows ahead here.
    let choice = ColumnChoice { open_end: Vec::new(), ..panel_choice(p, spec, d.date_column.clone()) };
    let (table, _) = mamba2_data::panel::read_long_with(path, &p.id_column, &choice, &p.covariates)?;
    let missing: Vec<&str> = spec.features.iter().filter(|id| !table.columns.contains(id)).map(String::as_str).collect();
    if let Some(first) = missing.first() {
        bail!(
            "{}: the model's series `{first}` has no row in column `{}` ({} of its {} series missing)",
            path.display(),
            p.id_column,
            missing.len(),
            spec.features.len()
        );
    }
    Ok(table)
}

/// The flags given on the command line to subcommand `name` (clap's ids: field names; the
/// groups that flattened structs make are not flags).
fn given_flags(matches: &clap::ArgMatches, name: &str) -> Vec<String> {
    let (Some(m), Some(sub)) = (matches.subcommand_matches(name), Cli::command().find_subcommand(name).cloned()) else {
        return Vec::new();
    };
    m.ids()
        .filter(|id| sub.get_arguments().any(|a| a.get_id() == *id))
        .filter(|id| m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.as_str().to_string())
        .collect()
}

fn cmd_backtest(b: backtest::BacktestArgs, given: &[String]) -> Result<()> {
    let out = backtest::check(&b, given)?;
    with_backend!(b.train.backend, B, backtest::run::<B>(&b, &out))
}

fn cmd_eval(a: UseArgs) -> Result<()> {
    if a.id_column.is_some() {
        bail!(
            "eval takes no --id-column: a model trained on a long-format panel reads it with the id column in its checkpoint, and \
             one trained on a wide table scores a wide table"
        );
    }
    with_model!(a.backend, &a.checkpoint, I, (model, scaler, spec, calibration, device), {
        if a.continuous_from.is_some() && spec.panel.is_some() {
            bail!("--continuous-from streams one table from its first row; a panel's series start and stop at their own dates");
        }
        let (rows, clock) = scaled_rows(&a.data, &spec, &scaler)?;
        let targets = model.target_indices();
        let w = Windows::new(&rows, (0, rows.len()), spec.lookback, spec.horizon, 1)?;
        check_cost_bps(a.cost_bps)?;
        let units = targets.iter().map(|&j| (scaler.mean[j], scaler.std[j])).collect();
        let (errors, trades, quantiles) = trade_table(&model, &w, &clock, w.len(), 32, units, a.cost_bps, calibration.as_ref(), &device)?;
        let repeat = repeat_table(&w, targets, 1);
        let ((mse, mae), (rmse, rmae)) = (errors.total().mse_mae(), repeat.total().mse_mae());
        println!("{} windows (normalised units): mamba2 MSE {mse:.6} MAE {mae:.6}; Repeat MSE {rmse:.6} MAE {rmae:.6}", w.len());
        figures::print(&errors, &repeat, &trades, "in the data's units, summed over the targets");
        match &quantiles {
            Some(q) => {
                println!("quantiles beside conformal Repeat, per forecast step:");
                figures::print_quantiles(q);
            }
            None => println!("no quantiles: the checkpoint holds no calibration (written before quantiles existed)"),
        }
        if let Some(from) = a.continuous_from {
            let (cm, ca) =
                mamba2_train::evaluate_continuous(&model, &rows, &clock, (from.saturating_sub(spec.lookback), rows.len()), &device)?;
            println!("streamed from row 0, forecasts after rows {}..: mamba2 MSE {cm:.6} MAE {ca:.6}", from.saturating_sub(1));
        }
    });
    Ok(())
}

/// One line per predicted step, `{prefix}{step},{value per target}` and then each target's
/// quantiles (`[step][target][level]`, where there are any), in the data's own units; `targets`
/// holds each target's feature column (the scaler is per feature).
fn print_forecast(
    out: &mut impl Write,
    pred: &[f64],
    quantiles: Option<&[f64]>,
    targets: &[usize],
    scaler: &Scaler,
    prefix: &str,
) -> Result<()> {
    // Written number by number with ryu (the shortest digits that read back to the same f64, as
    // `Display` gives, several times faster): with quantiles a streamed row prints H lines of
    // 1 + Q numbers per target, and formatting them cost more than the model's step.
    let t_n = targets.len().max(1);
    let per = quantiles.map_or(0, |q| q.len() / pred.len().max(1));
    let mut num = ryu::Buffer::new();
    let mut put = |out: &mut dyn Write, v: f64| -> std::io::Result<()> {
        out.write_all(b",")?;
        out.write_all(num.format(v).as_bytes())
    };
    for (k, step) in pred.chunks(t_n).enumerate() {
        write!(out, "{prefix}{}", k + 1)?;
        for (v, &j) in step.iter().zip(targets) {
            put(out, scaler.inverse(j, *v))?;
        }
        if let Some(q) = quantiles {
            for (t, &j) in targets.iter().enumerate() {
                let at = (k * t_n + t) * per;
                for v in &q[at..at + per] {
                    put(out, scaler.inverse(j, *v))?;
                }
            }
        }
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// The forecast columns' header: the targets, then each target's quantiles (`OT_q10`).
fn forecast_header(targets: &[String], calibration: Option<&Calibration>) -> String {
    let mut cols = targets.to_vec();
    if let Some(c) = calibration {
        for t in targets {
            cols.extend(c.model.levels.iter().map(|&q| format!("{t}_{}", level_name(q))));
        }
    }
    cols.join(",")
}

/// `predict --id-column`: each id's rows are a history of their own (what `predict` gives on a
/// file of that id's rows alone), forecast one after the other.
fn predict_ids<B: burn::prelude::Backend>(
    a: &UseArgs,
    id_column: &str,
    model: &Forecaster<B>,
    scaler: &Scaler,
    spec: &ForecastSpec,
    calibration: Option<&Calibration>,
    device: &B::Device,
) -> Result<()> {
    let path = a.data.data.as_ref().context("--id-column reads a long-format --data file")?;
    if !spec.future.is_empty() {
        bail!("predict --id-column {id_column}: the model reads future covariates, whose rows ahead predict takes from a wide file only; stream --id-column takes them per id");
    }
    let choice = ColumnChoice { date_column: a.data.date_column.clone(), columns: Some(spec.features.clone()), open_end: Vec::new() };
    let (table, ids) = Table::from_path_with_ids(path, id_column, &choice)?;
    if spec.calendar.is_some() && table.times.is_none() {
        bail!("the model reads calendar cycles from a date column; this data has none that reads as dates");
    }
    let idx = table.indices(&spec.features)?;
    let clock = clock_of(&table, spec.calendar.as_ref());
    // Each id's rows in file order, the ids in order of first appearance.
    let mut order: Vec<&str> = Vec::new();
    let mut rows_of: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
    for (r, id) in ids.iter().enumerate() {
        rows_of
            .entry(id.as_str())
            .or_insert_with(|| {
                order.push(id.as_str());
                Vec::new()
            })
            .push(r);
    }
    if let Some(one) = &a.id {
        if !rows_of.contains_key(one.as_str()) {
            bail!("--id {one}: no row of {} has this id in column `{id_column}` ({} ids)", path.display(), order.len());
        }
        order = vec![one.as_str()];
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(out, "id,step,{}", forecast_header(&spec.targets, calibration))?;
    for id in order {
        let picked: Vec<Vec<f64>> = rows_of[id].iter().map(|&r| idx.iter().map(|&j| table.rows[r][j]).collect()).collect();
        let rows = scaler.transform(&picked, &spec.features).with_context(|| format!("{}, id {id}", path.display()))?;
        let clock: Vec<i64> = rows_of[id].iter().map(|&r| clock[r]).collect();
        let pred = model.forecast_history(&rows, &clock, device)?;
        let quantiles = calibration.map(|c| c.model.quantiles_after(&rows, rows.len() - 1, model.target_indices(), &pred));
        print_forecast(&mut out, &pred, quantiles.as_deref(), model.target_indices(), scaler, &format!("{},", csv_field(id)))?;
    }
    out.flush()?;
    Ok(())
}

/// The id column a command reads with a model trained on a panel: the checkpoint's, which
/// `--id-column`, where given, must name.
fn panel_id_column<'a>(given: Option<&str>, p: &'a PanelSpec) -> Result<&'a str> {
    match given {
        Some(g) if g != p.id_column => {
            bail!("--id-column {g}: the model was trained on a panel with ids in column `{}`", p.id_column)
        }
        _ => Ok(&p.id_column),
    }
}

/// The columns a wide model reads: its features, of which the ones not known ahead are left
/// empty in rows ahead when the model reads future covariates.
fn wide_choice(spec: &ForecastSpec, date_column: Option<String>) -> ColumnChoice {
    let open_end =
        if spec.future.is_empty() { Vec::new() } else { spec.features.iter().filter(|f| !spec.future.contains(f)).cloned().collect() };
    ColumnChoice { date_column, columns: Some(spec.features.clone()), open_end }
}

/// The columns a long-format panel model reads: its value column and its ids' covariates, the
/// value left empty in rows ahead when there are covariates.
fn panel_choice(p: &PanelSpec, spec: &ForecastSpec, date_column: Option<String>) -> ColumnChoice {
    let columns = std::iter::once(p.value_column.clone()).chain(p.covariates.iter().cloned()).collect();
    // A row ahead leaves the value and the covariates not known ahead empty.
    let future = spec.series_future();
    let open_end = if future.is_empty() {
        Vec::new()
    } else {
        std::iter::once(&p.value_column).chain(p.covariates.iter().filter(|c| !future.contains(c))).cloned().collect()
    };
    ColumnChoice { date_column, columns: Some(columns), open_end }
}

/// The scaler of series `t` of a panel model alone (its value, then its covariates) and the
/// names of those columns.
fn series_scaler(scaler: &Scaler, spec: &ForecastSpec, p: &PanelSpec, t: usize) -> (Scaler, Vec<String>) {
    let id = &spec.targets[t];
    let names: Vec<String> =
        std::iter::once(id.clone()).chain(p.covariates.iter().map(|c| mamba2_data::panel::covariate_column(id, c))).collect();
    let cols: Vec<usize> = names.iter().map(|n| spec.features.iter().position(|f| f == n).expect("the spec was validated")).collect();
    (Scaler { mean: cols.iter().map(|&j| scaler.mean[j]).collect(), std: cols.iter().map(|&j| scaler.std[j]).collect() }, names)
}

/// `predict` with a model trained on a panel: each id of the long-format file forecast after its
/// own last row, from the dates it has rows for (what `stream` gives after the same rows).
fn predict_panel<B: burn::prelude::Backend>(
    a: &UseArgs,
    p: &PanelSpec,
    model: &Forecaster<B>,
    scaler: &Scaler,
    spec: &ForecastSpec,
    calibration: Option<&Calibration>,
    device: &B::Device,
) -> Result<()> {
    let id_column = panel_id_column(a.id_column.as_deref(), p)?;
    let path = a
        .data
        .data
        .as_ref()
        .with_context(|| format!("the model was trained on a panel (ids in column `{id_column}`); give such a file with --data"))?;
    let (table, _) =
        mamba2_data::panel::read_long_with(path, id_column, &panel_choice(p, spec, a.data.date_column.clone()), &p.covariates)?;
    let clock = clock_of(&table, spec.calendar.as_ref());
    let n_ids = table.columns.len() / (1 + p.covariates.len());
    let mut ids: Vec<usize> = (0..n_ids).collect();
    if let Some(one) = &a.id {
        let k = table.columns[..n_ids].iter().position(|c| c == one);
        ids =
            vec![k.with_context(|| format!("--id {one}: no row of {} has this id in column `{id_column}` ({n_ids} ids)", path.display()))?];
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(out, "id,step,{}", forecast_header(std::slice::from_ref(&p.value_column), calibration))?;
    // The covariates known ahead, and the first one's place among an id's covariates: the same
    // for every id.
    let future = spec.series_future();
    let known_at = p.covariates.iter().position(|c| future.contains(c));
    for k in ids {
        let id = &table.columns[k];
        let t = spec.targets.iter().position(|s| s == id).with_context(|| {
            format!("{}: id `{id}` is not one of the {} series the model was trained on", path.display(), spec.targets.len())
        })?;
        let (own, names) = series_scaler(scaler, spec, p, t);
        // The id's columns in the pivot: its value, then its covariates.
        let cols: Vec<usize> = std::iter::once(k).chain((0..p.covariates.len()).map(|i| n_ids + k * p.covariates.len() + i)).collect();
        let dates: Vec<usize> = (0..table.rows.len()).filter(|&r| !table.rows[r][k].is_nan()).collect();
        // Its rows ahead: dated after its last value, with its covariates known ahead (the
        // pivot checked).
        let known = known_at.map(|i| cols[1 + i]);
        let ahead_dates: Vec<usize> = match (dates.last(), known) {
            (Some(&last), Some(j)) => (last + 1..table.rows.len()).filter(|&r| !table.rows[r][j].is_nan()).collect(),
            _ => Vec::new(),
        };
        let at = format!("{}, id {id}", path.display());
        let scaled = |rs: &[usize]| {
            rs.iter()
                .map(|&r| own.transform_row(&cols.iter().map(|&j| table.rows[r][j]).collect::<Vec<_>>(), &names, &at))
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        let (rows, ahead) = (scaled(&dates)?, scaled(&ahead_dates)?);
        let h = spec.horizon;
        if !future.is_empty() && ahead.len() < h {
            bail!(
                "{at}: the model reads the id's covariates known ahead ({}) at the {h} rows it forecasts; the id has {} rows ahead \
                 (rows dated after its last value, with the value empty and the covariates filled), {} short",
                future.join(", "),
                ahead.len(),
                h - ahead.len()
            );
        }
        let clock: Vec<i64> = dates.iter().map(|&r| clock[r]).collect();
        let pred = model.forecast_series_ahead(&rows, &ahead, &clock, t, device)?;
        let quantiles = calibration.map(|c| {
            let mut recent = Vec::new();
            c.model.recent_in(&rows, rows.len() - 1, 0, &mut recent);
            c.model.quantiles_at(&[t], &pred, |_| &recent)
        });
        print_forecast(&mut out, &pred, quantiles.as_deref(), &[t], scaler, &format!("{},", csv_field(id)))?;
    }
    out.flush()?;
    Ok(())
}

fn cmd_predict(a: UseArgs) -> Result<()> {
    with_model!(a.backend, &a.checkpoint, I, (model, scaler, spec, calibration, device), {
        if let Some(p) = &spec.panel {
            return predict_panel(&a, p, &model, &scaler, &spec, calibration.as_ref(), &device);
        }
        if let Some(id_column) = &a.id_column {
            return predict_ids(&a, id_column, &model, &scaler, &spec, calibration.as_ref(), &device);
        }
        if let Some(id) = &a.id {
            bail!("--id {id} picks one series of a long-format file: name its id column with --id-column");
        }
        let (mut rows, clock, n_ahead) = scaled_rows_ahead(&a.data, &spec, &scaler)?;
        let ahead = rows.split_off(rows.len() - n_ahead);
        if rows.is_empty() {
            bail!("{}: every row is a row ahead (its targets empty): there is no history", data_name(&a.data));
        }
        let h = spec.horizon;
        if !spec.future.is_empty() && n_ahead < h {
            bail!(
                "{}: the model reads the future covariates ({}) at the {h} rows it forecasts; the file ends with {n_ahead} rows ahead \
                 (rows after the history with the future columns filled and the others empty), {} short",
                data_name(&a.data),
                spec.future.join(", "),
                h - n_ahead
            );
        }
        let pred = model.forecast_history_ahead(&rows, &ahead, &clock, &device)?;
        // The quantiles after the last row (the table has at least one), scaled by each
        // target's last values.
        let quantiles = calibration.as_ref().map(|c| c.model.quantiles_after(&rows, rows.len() - 1, model.target_indices(), &pred));
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        writeln!(out, "step,{}", forecast_header(&spec.targets, calibration.as_ref()))?;
        print_forecast(&mut out, &pred, quantiles.as_deref(), model.target_indices(), &scaler, "")?;
        out.flush()?;
    });
    Ok(())
}

fn cmd_stream(a: StreamArgs) -> Result<()> {
    with_model!(a.backend, &a.checkpoint, I, (model, scaler, spec, calibration, device), {
        let _ = &device;
        let c = calibration.as_ref();
        match a.backend.dtype {
            DtypeArg::F64 => stream_rows(with_intervals(ForecastStream::<f64>::new(&model), c)?, &model, &scaler, &spec, c, &a),
            DtypeArg::F32 => stream_rows(with_intervals(ForecastStream::<f32>::new(&model), c)?, &model, &scaler, &spec, c, &a),
        }
    })
}

fn with_intervals<T: mamba2_model::HostFloat>(stream: ForecastStream<T>, c: Option<&Calibration>) -> Result<ForecastStream<T>> {
    Ok(match c {
        Some(c) => stream.with_intervals(c.model.clone())?,
        None => stream,
    })
}

/// `id` as a CSV field: quoted where it holds a comma, a quote or a line break.
fn csv_field(id: &str) -> String {
    if id.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", id.replace('"', "\"\""))
    } else {
        id.to_string()
    }
}

/// Saves the bank to `path`, naming why in an error.
fn save_bank<T: mamba2_model::HostFloat>(bank: &StreamBank<T>, path: &std::path::Path) -> Result<()> {
    bank.save(path).context("cannot save the stream state")
}

/// `--state-every`: a count of rows, at least 1.
fn rows_between_saves(s: &str) -> std::result::Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("a state is saved at least every row: give 1 or more".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("not a count of rows".into()),
    }
}

/// Reads CSV rows from stdin (header first) and prints the forecast after each: one series, or
/// with `--id-column` many, each its own state in a [`StreamBank`].
fn stream_rows<B: burn::prelude::Backend, T: mamba2_model::HostFloat>(
    stream: ForecastStream<T>,
    model: &Forecaster<B>,
    scaler: &Scaler,
    spec: &ForecastSpec,
    calibration: Option<&Calibration>,
    a: &StreamArgs,
) -> Result<()> {
    let bank = std::sync::Arc::new(std::sync::Mutex::new(StreamBank::new(&stream)));
    if let Some(path) = &a.state {
        // A save cut short by SIGKILL leaves its temporary file beside the state file.
        mamba2_model::remove_temporaries_of(path);
        if path.exists() {
            let n = bank.lock().expect("not poisoned").restore(path)?;
            eprintln!("state     {}: {n} series restored", path.display());
        }
        // Written now (the restored states, unchanged), so that a file that cannot be written
        // stops the stream before its first row, not after its last.
        save_bank(&bank.lock().expect("not poisoned"), path)?;
        // A signal saves every state as it stands after the last whole row, then ends the
        // process: the lock is held while a row is pushed and printed.
        let mut signals =
            signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP])
                .context("cannot listen for signals")?;
        let (bank, path) = (bank.clone(), path.clone());
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let bank = bank.lock().unwrap_or_else(|e| e.into_inner());
                match save_bank(&bank, &path) {
                    Ok(()) => {
                        eprintln!("state     {}: {} series saved on signal {sig}", path.display(), bank.len());
                        std::process::exit(0)
                    }
                    Err(e) => {
                        eprintln!("error: {e:#}");
                        std::process::exit(1)
                    }
                }
            }
        });
    }
    // A model trained on a panel reads rows of `id, date, value` (its checkpoint names the
    // columns): each id its own series of the model.
    let panel = spec.panel.as_ref();
    let id_column = match panel {
        Some(p) => Some(panel_id_column(a.id_column.as_deref(), p)?.to_string()),
        None => a.id_column.clone(),
    };
    // With future covariates, a row whose other columns are all empty is a row ahead.
    let choice = match panel {
        Some(p) => panel_choice(p, spec, a.date_column.clone()),
        None => wide_choice(spec, a.date_column.clone()),
    };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let header = lines.next().context("stdin: no header row")??;
    let id_at = match &id_column {
        Some(name) => {
            let cells = csv_cells(&header);
            Some(
                cells
                    .iter()
                    .position(|c| c == name)
                    .with_context(|| format!("stdin: no column `{name}` (--id-column) in the header ({})", cells.join(",")))?,
            )
        }
        None => None,
    };
    // Buffered and flushed once per input row: a reader gets each row's forecast whole as soon
    // as it is made, without one write per printed line.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let id_head = if id_at.is_some() { "id," } else { "" };
    let names = match panel {
        Some(p) => std::slice::from_ref(&p.value_column),
        None => &spec.targets[..],
    };
    writeln!(out, "{id_head}row,step,{}", forecast_header(names, calibration))?;
    let (mut since_save, mut skipped) = (0u64, 0u64);
    for (i, line) in lines.enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("stdin line {}", i + 2);
        let id = match id_at {
            Some(k) => {
                let cells = csv_cells(&line);
                let id = cells
                    .get(k)
                    .filter(|c| !c.is_empty())
                    .with_context(|| format!("{at}: no id in column `{}`", id_column.as_deref().unwrap_or_default()))?;
                id.clone()
            }
            None => String::new(),
        };
        let table = Table::from_header_and_row(&header, &line, i + 2, "stdin", &choice)?;
        let mut bank = bank.lock().expect("not poisoned");
        let clock = match (&spec.calendar, &table.times) {
            (Some(cal), Some(t)) => cal.clock(t[0]),
            (Some(_), None) => bail!("{at}: the model reads the calendar from a date column; this row has none that reads as a date"),
            // The model reads no calendar: the clock only orders a series' rows.
            (None, Some(t)) => t[0],
            (None, None) if !spec.future.is_empty() => {
                bail!("{at}: the model reads future covariates, and its rows ahead are matched to the rows they precede by date: give a date column")
            }
            (None, None) => bank.stream(&id).map_or(0, |s| s.rows() as i64) + 1,
        };
        // The feature columns the row's values are, for scaling and back.
        let series;
        let own: &[usize] = match panel {
            None => model.target_indices(),
            Some(_) => {
                series = [stream.series_index(&id).with_context(|| {
                    format!("{at}: id `{id}` is not one of the {} series the model was trained on", spec.targets.len())
                })?];
                &series
            }
        };
        let row = match panel {
            None => scaler.transform_row(&table.rows[0], &spec.features, &at)?,
            Some(p) => {
                let (own, names) = series_scaler(scaler, spec, p, own[0]);
                own.transform_row(&table.rows[0], &names, &at)?
            }
        };
        // A row ahead (its targets empty) gives the future covariates' values of a later row.
        let value_at = if panel.is_some() { 0 } else { model.target_indices()[0] };
        if !choice.open_end.is_empty() && row[value_at].is_nan() {
            if !bank.announce(&id, &row, clock).with_context(|| at.clone())? {
                skipped += 1;
            }
            continue;
        }
        // With a state file, a feed restarted from before the saved rows skips them; without
        // one every row counts, as in `predict`.
        let pred = if a.state.is_some() { bank.push_new(&id, &row, clock) } else { bank.push(&id, &row, clock).map(Some) };
        let Some(pred) = pred.with_context(|| at.clone())? else {
            skipped += 1;
            continue;
        };
        let this = bank.stream(&id).expect("pushed");
        let quantiles = this.quantiles(&pred);
        let prefix = match id_at {
            Some(_) => format!("{},{},", csv_field(&id), this.rows()),
            None => format!("{},", this.rows()),
        };
        print_forecast(&mut out, &pred, quantiles.as_deref(), own, scaler, &prefix)?;
        out.flush()?;
        since_save += 1;
        if let Some(path) = a.state.as_ref().filter(|_| since_save >= a.state_every) {
            save_bank(&bank, path)?;
            since_save = 0;
        }
    }
    let bank = bank.lock().expect("not poisoned");
    if skipped > 0 {
        eprintln!("skipped   {skipped} rows dated at or before their series' last row (already in the state)");
    }
    if let Some(path) = &a.state {
        save_bank(&bank, path)?;
        eprintln!("state     {}: {} series saved", path.display(), bank.len());
    }
    Ok(())
}

/// The cells of one CSV line, trimmed.
fn csv_cells(line: &str) -> Vec<String> {
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(line.as_bytes());
    reader.records().next().and_then(|r| r.ok()).map_or_else(Vec::new, |r| r.iter().map(str::to_string).collect())
}

/// burn-collective answers a lost worker by panicking on its own threads (and the exchange
/// thread that waits on them); the run then stops with one line naming what was lost, so those
/// panics stay silent. Every other panic is reported as usual.
fn quiet_exchange_panics() {
    let usual = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let name = std::thread::current().name().unwrap_or("").to_string();
        if !(name.starts_with(mamba2_train::EXCHANGE_THREAD) || name.starts_with("tokio-r")) {
            usual(info);
        }
    }));
}

fn main() {
    // Usage mistakes are reported on one line like every other error (help and version print
    // as usual).
    let parsed = Cli::command().try_get_matches().and_then(|m| Ok((Cli::from_arg_matches(&m)?, m)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ");
            eprintln!("error: {first} (see mamba2 --help)");
            std::process::exit(2);
        }
        Err(e) => e.exit(),
    };
    quiet_exchange_panics();
    // burn-collective's servers print every connection and transfer to standard output unless a
    // logger is already in place: this one keeps them quiet (errors reach the user as one line).
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
    // Training allocates the same large buffers every step: keep them mapped (a no-op off glibc).
    mamba2_train::keep_freed_memory();
    let result = match cli.command {
        Command::Train(a) => cmd_train(*a),
        Command::Eval(a) => cmd_eval(a),
        Command::Backtest(b) => cmd_backtest(*b, &given_flags(&matches, "backtest")),
        Command::Predict(a) => cmd_predict(a),
        Command::Stream(a) => cmd_stream(a),
        Command::Generate(a) => generate::cmd_generate(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
