//! `mamba2`: train, evaluate and run Mamba-2 forecasters on CSV time series.
//!
//! With no arguments, `mamba2 train` trains on the ETTh1 copy shipped with the repository under
//! the standard protocol (L 96, H 96, all 7 series) and prints test MSE/MAE beside the Repeat
//! baseline and the published table.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::AutodiffBackend;
use clap::{Args, Parser, Subcommand, ValueEnum};
use mamba2_model::{load_checkpoint, Loaded, Mamba2Config};
use mamba2_tensor::compare::to_f64_vec;
use mamba2_tensor::from_f64_vec;
use mamba2_train::data::{repeat_baseline, ColumnChoice, Scaler, Split, Table, Windows};
use mamba2_train::plot::{line_chart, Series};
use mamba2_train::{evaluate, train, ForecastSpec, Forecaster, ForecasterConfig, Prepared, RunDir, TrainConfig};

/// ETTh1 (Zhou et al., Informer, AAAI 2021; CC BY-ND 4.0), shipped unmodified in data/ett/.
const ETTH1: &str = include_str!("../../../../data/ett/ETTh1.csv");
const ETTH1_NAME: &str = "ETTh1.csv (embedded)";

#[derive(Parser)]
#[command(name = "mamba2", version, about = "Mamba-2 forecasters on CSV time series")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a forecaster (defaults: ETTh1, L 96, H 96, all 7 series).
    Train(TrainArgs),
    /// Metrics of a checkpoint on every window of a CSV.
    Eval(UseArgs),
    /// The next H rows after the last rows of a CSV.
    Predict(UseArgs),
    /// Read CSV rows from stdin (header first) and print a forecast after each row.
    Stream(StreamArgs),
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum DeviceArg {
    Cpu,
    Cuda,
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
    /// CSV file with a header row (default: the embedded ETTh1).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Date/time column to skip (default: one named date, time, datetime or timestamp).
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
    /// Predicted columns, comma separated (default: all input columns).
    #[arg(long, value_delimiter = ',')]
    targets: Option<Vec<String>>,
    /// Train and validation fractions, e.g. `0.7,0.1` (default: the ETTh1 borders for ETTh1, else 0.7,0.1).
    #[arg(long, value_delimiter = ',')]
    split: Option<Vec<f64>>,
    /// Row borders `train_end,val_end,test_end` (overrides --split).
    #[arg(long, value_delimiter = ',')]
    borders: Option<Vec<usize>>,
    /// Lookback L.
    #[arg(long, default_value_t = 96)]
    lookback: usize,
    /// Horizon H (1: next-step).
    #[arg(long, default_value_t = 96)]
    horizon: usize,
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 16)]
    d_state: usize,
    #[arg(long, default_value_t = 16)]
    headdim: usize,
    #[arg(long, default_value_t = 2)]
    expand: usize,
    #[arg(long, default_value_t = 32)]
    chunk_size: usize,
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    #[arg(long, default_value_t = 3)]
    patience: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// No per-window instance normalisation (needed for `stream`).
    #[arg(long)]
    no_revin: bool,
    /// No linear skip over the lookback (needed for `stream`).
    #[arg(long)]
    no_linear_skip: bool,
    /// Output directory (checkpoints, metrics.jsonl, plots).
    #[arg(long, default_value = "runs/etth1")]
    out: PathBuf,
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
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    backend: Backend,
}

#[derive(Args, Clone)]
struct StreamArgs {
    #[arg(long)]
    checkpoint: PathBuf,
    /// Date/time column to skip.
    #[arg(long)]
    date_column: Option<String>,
    #[command(flatten)]
    backend: Backend,
}

fn load_table(d: &DataArgs, columns: Option<Vec<String>>) -> Result<(Table, bool)> {
    let choice = ColumnChoice { date_column: d.date_column.clone(), columns: columns.or_else(|| d.columns.clone()) };
    Ok(match &d.data {
        Some(p) => (Table::from_csv_path(p, &choice)?, false),
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
        }
    }};
}

/// Runs `$body` with `$I` bound to the inference backend the flags select and the checkpoint at
/// `$path` loaded on it (see [`load_model`]), for the commands that use a trained model.
macro_rules! with_model {
    ($b:expr, $path:expr, $I:ident, ($model:ident, $scaler:ident, $spec:ident, $device:ident), $body:block) => {
        with_backend!($b, B, {
            type $I = <B as AutodiffBackend>::InnerBackend;
            let $device = Default::default();
            let ($model, $scaler, $spec) = load_model::<$I>($path, &$device)?;
            $body
        })
    };
}

fn published(h: usize) -> Option<[(&'static str, f64, f64); 6]> {
    let row = match h {
        96 => [0.386, 0.405, 0.386, 0.405, 0.386, 0.395, 0.414, 0.419, 0.384, 0.402, 0.386, 0.400],
        192 => [0.443, 0.437, 0.441, 0.436, 0.437, 0.424, 0.460, 0.445, 0.436, 0.429, 0.437, 0.432],
        336 => [0.489, 0.468, 0.487, 0.458, 0.479, 0.446, 0.501, 0.466, 0.491, 0.469, 0.481, 0.459],
        720 => [0.502, 0.489, 0.503, 0.491, 0.481, 0.470, 0.500, 0.488, 0.521, 0.500, 0.519, 0.516],
        _ => return None,
    };
    let names = ["S-Mamba", "iTransformer", "RLinear", "PatchTST", "TimesNet", "DLinear"];
    Some(std::array::from_fn(|i| (names[i], row[2 * i], row[2 * i + 1])))
}

fn cmd_train(a: TrainArgs) -> Result<()> {
    let (table, is_etth1) = load_table(&a.data, None)?;
    let features = table.columns.clone();
    let targets = a.targets.clone().unwrap_or_else(|| features.clone());
    let target_idx = table.indices(&targets)?;
    let split = match (&a.borders, &a.split) {
        (Some(b), _) if b.len() != 3 => bail!("--borders takes three row numbers train_end,val_end,test_end, got {b:?}"),
        (Some(b), _) => Split::Borders { train: b[0], val: b[1], test: b[2] },
        (None, Some(f)) if f.len() != 2 => bail!("--split takes two fractions train,val, got {f:?}"),
        (None, Some(f)) => Split::Fractions { train: f[0], val: f[1] },
        (None, None) if is_etth1 => Split::ETTH1,
        (None, None) => Split::Fractions { train: 0.7, val: 0.1 },
    };
    let ranges = split.ranges(table.rows.len(), a.lookback)?;
    let scaler = Scaler::fit(&table.rows[ranges[0].0..ranges[0].1]);
    let rows = scaler.transform(&table.rows);
    let backbone = Mamba2Config::new(a.d_model, a.layers)
        .with_d_state(a.d_state)
        .with_headdim(a.headdim)
        .with_expand(a.expand)
        .with_chunk_size(a.chunk_size);
    backbone.validate()?;
    let config = ForecasterConfig {
        spec: ForecastSpec {
            lookback: a.lookback,
            horizon: a.horizon,
            features,
            targets,
            revin: !a.no_revin,
            linear_skip: !a.no_linear_skip,
        },
        backbone,
    };
    let tc = TrainConfig {
        epochs: a.epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        weight_decay: a.weight_decay,
        patience: a.patience,
        seed: a.seed,
        ..TrainConfig::default()
    };
    tc.validate()?;
    let data = Prepared { rows, scaler, ranges, targets: target_idx.clone() };
    // Check that every split has windows before any work is done.
    for (name, r) in ["train", "validation", "test"].iter().zip(ranges) {
        Windows::new(&data.rows, r, a.lookback, a.horizon, 1).with_context(|| format!("{name} split"))?;
    }
    let dir = RunDir(a.out.clone());
    if !a.resume && dir.last().exists() {
        bail!("{} already holds a run; pass --resume to continue it or choose another --out", a.out.display());
    }
    let started = std::time::Instant::now();
    with_backend!(a.backend, B, {
        let device = Default::default();
        let summary = train::<B>(&config, &tc, &data, &dir, a.resume, &device, |line| println!("{line}"))?;
        let loaded =
            load_checkpoint::<<B as AutodiffBackend>::InnerBackend, Forecaster<_>, ForecasterConfig>(&dir.best(), &device, |c, d| {
                c.init(d)
            })?;
        let test = Windows::new(&data.rows, ranges[2], a.lookback, a.horizon, 1)?;
        let (mse, mae) = evaluate(&loaded.module, &test, &target_idx, 32, true, &device)?;
        let (rmse, rmae) = repeat_baseline(&test, &target_idx, 32);
        let secs = started.elapsed().as_secs_f64();
        println!();
        println!(
            "best epoch {} of {}{}; wall time {:.0} s",
            summary.best_epoch,
            summary.history.len(),
            if summary.stopped_early { " (early stop)" } else { "" },
            secs
        );
        println!("test (L {}, H {}, {} windows, batch 32, last partial batch dropped):", a.lookback, a.horizon, test.len() / 32 * 32);
        println!("  {:<14} MSE {:.4}  MAE {:.4}", "mamba2", mse, mae);
        println!("  {:<14} MSE {:.4}  MAE {:.4}", "Repeat", rmse, rmae);
        if is_etth1 && a.lookback == 96 && config.spec.targets.len() == 7 {
            if let Some(rows) = published(a.horizon) {
                println!("published (ETTh1, L 96):");
                for (name, m, e) in rows {
                    println!("  {name:<14} MSE {m:.3}  MAE {e:.3}");
                }
            }
        }
        let summary_json = serde_json::json!({"test_mse": mse, "test_mae": mae, "repeat_mse": rmse, "repeat_mae": rmae, "best_epoch": summary.best_epoch, "epochs_run": summary.history.len(), "wall_seconds": secs});
        mamba2_model::write_atomically(&a.out.join("summary.json"), serde_json::to_string_pretty(&summary_json)?.as_bytes())?;
        plots(&a.out, &summary.history, &loaded.module, &test, &target_idx, &device)?;
    });
    Ok(())
}

/// loss.png: train (blue) and validation (orange) loss per epoch; forecast.png: the last target
/// column over the first test window's horizon, actual (black) and forecast (red).
fn plots<B: burn::prelude::Backend>(
    out: &Path,
    history: &[mamba2_train::EpochRecord],
    model: &Forecaster<B>,
    test: &Windows,
    targets: &[usize],
    device: &B::Device,
) -> Result<()> {
    let train: Vec<f64> = history.iter().map(|r| r.train_loss).collect();
    let val: Vec<f64> = history.iter().map(|r| r.val_mse).collect();
    line_chart(
        &out.join("loss.png"),
        &[Series { values: &train, rgb: [31, 119, 180] }, Series { values: &val, rgb: [255, 127, 14] }],
        640,
        360,
    )?;
    let (x, y) = mamba2_train::batch_tensors::<B>(test, &[0], targets, device);
    let pred = to_f64_vec(model.forward(x)?);
    let truth = to_f64_vec(y);
    let t = targets.len();
    let col = |v: &[f64]| v.iter().skip(t - 1).step_by(t).copied().collect::<Vec<_>>();
    line_chart(
        &out.join("forecast.png"),
        &[Series { values: &col(&truth), rgb: [0, 0, 0] }, Series { values: &col(&pred), rgb: [214, 39, 40] }],
        640,
        360,
    )?;
    Ok(())
}

/// A checkpoint opened for `eval`, `predict` and `stream`: the model, the scaler it was trained
/// with, and what it reads and predicts.
fn load_model<B: burn::prelude::Backend>(path: &Path, device: &B::Device) -> Result<(Forecaster<B>, Scaler, ForecastSpec)> {
    let Loaded { module, meta, .. } = load_checkpoint::<B, Forecaster<B>, ForecasterConfig>(path, device, |c, d| c.init(d))?;
    let scaler: Scaler =
        serde_json::from_value(meta["scaler"].clone()).with_context(|| format!("{}: no data scaler in the checkpoint", path.display()))?;
    let spec = module.spec().clone();
    Ok((module, scaler, spec))
}

/// The rows of `--data` (or the embedded data) in the model's feature columns, scaled as in
/// training.
fn scaled_rows(d: &DataArgs, spec: &ForecastSpec, scaler: &Scaler) -> Result<Vec<Vec<f64>>> {
    let (table, _) = load_table(d, Some(spec.features.clone()))?;
    let idx = table.indices(&spec.features)?;
    let rows: Vec<Vec<f64>> = table.rows.iter().map(|r| idx.iter().map(|&j| r[j]).collect()).collect();
    Ok(scaler.transform(&rows))
}

fn cmd_eval(a: UseArgs) -> Result<()> {
    with_model!(a.backend, &a.checkpoint, I, (model, scaler, spec, device), {
        let rows = scaled_rows(&a.data, &spec, &scaler)?;
        let targets = model.target_indices();
        let w = Windows::new(&rows, (0, rows.len()), spec.lookback, spec.horizon, 1)?;
        let (mse, mae) = evaluate(&model, &w, targets, 32, false, &device)?;
        let (rmse, rmae) = repeat_baseline(&w, targets, 1);
        println!("{} windows (normalised units): mamba2 MSE {mse:.6} MAE {mae:.6}; Repeat MSE {rmse:.6} MAE {rmae:.6}", w.len());
    });
    Ok(())
}

/// One line per predicted step, `{prefix}{step},{value per target}`, in the data's own units;
/// `targets` holds each target's feature column (the scaler is per feature).
fn print_forecast(out: &mut impl Write, pred: &[f64], targets: &[usize], scaler: &Scaler, prefix: &str) -> Result<()> {
    for (k, step) in pred.chunks(targets.len().max(1)).enumerate() {
        let vals: Vec<String> = step.iter().zip(targets).map(|(v, &j)| format!("{}", scaler.inverse(j, *v))).collect();
        writeln!(out, "{prefix}{},{}", k + 1, vals.join(","))?;
    }
    Ok(())
}

fn cmd_predict(a: UseArgs) -> Result<()> {
    with_model!(a.backend, &a.checkpoint, I, (model, scaler, spec, device), {
        let rows = scaled_rows(&a.data, &spec, &scaler)?;
        // A streamable model reads the whole history (what `stream` sees); the others the last L rows.
        let used: &[Vec<f64>] = if model.streamable() {
            &rows
        } else {
            if rows.len() < spec.lookback {
                bail!("{} rows given, the model needs at least lookback = {}", rows.len(), spec.lookback);
            }
            &rows[rows.len() - spec.lookback..]
        };
        let flat: Vec<f64> = used.iter().flatten().copied().collect();
        let x = from_f64_vec::<I, 3>(flat, [1, used.len(), spec.features.len()], &device);
        let pred = if model.streamable() { model.forward_history(x)? } else { model.forward(x)? };
        let mut out = std::io::stdout().lock();
        writeln!(out, "step,{}", spec.targets.join(","))?;
        print_forecast(&mut out, &to_f64_vec(pred), model.target_indices(), &scaler, "")?;
    });
    Ok(())
}

fn cmd_stream(a: StreamArgs) -> Result<()> {
    with_model!(a.backend, &a.checkpoint, I, (model, scaler, spec, device), {
        if !model.streamable() {
            bail!(
                "{} was trained with RevIN or the linear skip, which need whole windows; train with --no-revin --no-linear-skip to stream",
                a.checkpoint.display()
            );
        }
        let stdin = std::io::stdin();
        let mut lines = stdin.lock().lines();
        let header = lines.next().context("stdin: no header row")??;
        let mut state = model.mamba.zero_state(1, &device);
        let mut out = std::io::stdout().lock();
        writeln!(out, "row,step,{}", spec.targets.join(","))?;
        for (i, line) in lines.enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let table = Table::from_csv_str(
                &format!("{header}\n{line}\n"),
                &format!("stdin row {}", i + 1),
                &ColumnChoice { date_column: a.date_column.clone(), columns: Some(spec.features.clone()) },
            )?;
            let row = scaler.transform(&table.rows)[0].clone();
            let x = from_f64_vec::<I, 2>(row, [1, spec.features.len()], &device);
            let (pred, next) = model.step(x, state)?;
            state = next;
            print_forecast(&mut out, &to_f64_vec(pred), model.target_indices(), &scaler, &format!("{},", i + 1))?;
            out.flush()?;
        }
    });
    Ok(())
}

fn main() {
    // Usage mistakes are reported on one line like every other error (help and version print
    // as usual).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ");
            eprintln!("error: {first} (see mamba2 --help)");
            std::process::exit(2);
        }
        Err(e) => e.exit(),
    };
    // Training allocates the same large buffers every step: keep them mapped (a no-op off glibc).
    mamba2_train::keep_freed_memory();
    let result = match cli.command {
        Command::Train(a) => cmd_train(a),
        Command::Eval(a) => cmd_eval(a),
        Command::Predict(a) => cmd_predict(a),
        Command::Stream(a) => cmd_stream(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
