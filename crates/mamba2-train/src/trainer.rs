//! The training loop: epochs over shuffled windows, validation each epoch, early stopping,
//! best and last checkpoints written atomically, exact resume, a NaN/Inf guard, JSON-lines
//! metrics.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use mamba2_model::{load_checkpoint, save_checkpoint, write_atomically};
use mamba2_optim::{loss_value, AdamW, AdamWConfig, LrSchedule, OptimError, StepReport};
use mamba2_tensor::rng::SplitMix64;
use serde::{Deserialize, Serialize};

use mamba2_data::{repeat_table, seasonal_table, ErrorSums, ErrorTable, Scaler, Windows};
use mamba2_forecast::features::Truth;
use mamba2_forecast::{Batch, Forecaster, ForecasterConfig, Loss};

use crate::ema::Ema;
use crate::parallel::{Peer, Workers};
use crate::validation::{calibrate, each_forecast, score, Blend};
use crate::TrainError;
use mamba2_data::quantile::Calibration;

/// Optimisation settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Passes over the training windows.
    pub epochs: usize,
    /// Windows per batch (the last batch of an epoch may be smaller).
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Learning rate at the end of the cosine decay.
    pub min_lr: f64,
    /// Linear warmup steps.
    pub warmup_steps: usize,
    /// AdamW weight decay (A_log, D, dt_bias, norms and biases excluded).
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: Option<f64>,
    /// Stop after this many epochs without a better validation loss.
    pub patience: usize,
    /// Seed of the initialisation and of the window order.
    pub seed: u64,
    /// Step between training window starts; each epoch starts them at another offset, so that
    /// over epochs every start is used.
    pub stride: usize,
    /// The first row of a training window whose forecast is trained on: the model forecasts
    /// after every row, and rows `loss_from..L` each contribute their forecast's error.
    pub loss_from: usize,
    /// Of those rows, the last and every `loss_every`-th before it contribute.
    #[serde(default = "one")]
    pub loss_every: usize,
    /// What the optimizer minimises.
    #[serde(default)]
    pub loss: Loss,
    /// Evaluate and keep an exponential moving average of the weights with this decay per step
    /// ([`Ema`](crate::Ema)); `None`: the weights as they are.
    #[serde(default)]
    pub ema: Option<f64>,
    /// Keep of the best epoch's model only the blend with Repeat that beats Repeat on the
    /// validation split beyond noise, Repeat itself if none does ([`Blend`]); `false`: keep the
    /// model as trained.
    #[serde(default = "yes")]
    pub repeat_check: bool,
    /// The quantile levels `best.ckpt` is calibrated for ([`calibrate`](crate::calibrate)): one
    /// quantile forecast per level beside each point.
    #[serde(default = "default_quantiles")]
    pub quantiles: Vec<f64>,
}

/// The levels of the 80 % central interval and the median.
pub fn default_quantiles() -> Vec<f64> {
    vec![0.1, 0.5, 0.9]
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

/// Whether early stopping ends a run after `done` epochs, the best of which (counted from 1; 0
/// for none yet) was `best_epoch`: `patience` epochs have passed without a better validation MSE.
fn stops_early(done: usize, best_epoch: usize, patience: usize) -> bool {
    best_epoch > 0 && done >= best_epoch + patience
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 10,
            batch_size: 32,
            lr: 3e-3,
            min_lr: 1e-5,
            warmup_steps: 100,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            patience: 3,
            seed: 0,
            stride: 4,
            loss_from: 0,
            loss_every: 2,
            loss: Loss::Mae,
            ema: Some(0.99),
            repeat_check: true,
            quantiles: default_quantiles(),
        }
    }
}

impl TrainConfig {
    /// Checks the values a user can get wrong.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |why: &str| Err(TrainError::Config { why: why.to_string() });
        if self.batch_size == 0 {
            return bad("batch size must be at least 1, got 0");
        }
        if self.epochs == 0 {
            return bad("epochs must be at least 1, got 0");
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad("learning rate must be positive");
        }
        if self.loss_every == 0 {
            return bad("loss every must be at least 1, got 0");
        }
        mamba2_data::quantile::check_levels(&self.quantiles)?;
        if let Some(d) = self.ema {
            if !(0.0..1.0).contains(&d) {
                return bad(&format!("the weight average's decay must be at least 0 and below 1, got {d}"));
            }
        }
        if self.stride == 0 {
            return bad("stride must be at least 1, got 0");
        }
        Ok(())
    }
}

/// Scaled rows and the three window sets of a run.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Scaled rows (all columns of the feature list).
    pub rows: Vec<Vec<f64>>,
    /// The scaler fitted on the training rows.
    pub scaler: Scaler,
    /// Row ranges of train, validation, test.
    pub ranges: [(usize, usize); 3],
    /// Indices of the target columns among the features.
    pub targets: Vec<usize>,
    /// Each row's calendar clock (row numbers when the data has no calendar).
    pub clock: Vec<i64>,
}

/// One epoch's record, written as a JSON line to `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// 1-based epoch.
    pub epoch: usize,
    /// Optimizer steps so far.
    pub step: usize,
    /// Mean training loss of the epoch (f64).
    pub train_loss: f64,
    /// Validation MSE.
    pub val_mse: f64,
    /// Validation MAE.
    pub val_mae: f64,
    /// `1 - val_mse / MSE of Repeat on validation`: the share of Repeat's error the model
    /// removes.
    #[serde(default)]
    pub val_skill: f64,
    /// Learning rate of the last step.
    pub lr: f64,
    /// Mean gradient norm before clipping.
    pub grad_norm: f64,
    /// Wall time of the epoch.
    pub seconds: f64,
}

/// What the training loop reports as it goes, for a progress display.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// The run continues from the run directory's `last.ckpt`, after `epochs_done` epochs and
    /// `step` optimizer steps; the next epoch starts over from its beginning.
    Resumed {
        /// Epochs completed before.
        epochs_done: usize,
        /// Optimizer steps completed before.
        step: usize,
    },
    /// The baselines' validation figures, `(MSE, MAE)`, once before the first epoch: Repeat,
    /// and the seasonal naive forecast (with its period in rows) where the calendar has a day.
    Baselines {
        /// Repeat, the last value.
        repeat: (f64, f64),
        /// The value one day before, `(period, MSE, MAE)`.
        seasonal: Option<(usize, f64, f64)>,
    },
    /// The epochs are done; the kept model's quantiles are being fitted on validation.
    Calibrating,
    /// An epoch starts: `steps` optimizer steps over `windows` training windows.
    EpochStart {
        /// 1-based epoch.
        epoch: usize,
        /// Steps in it.
        steps: usize,
        /// Windows in it.
        windows: usize,
    },
    /// One optimizer step of the epoch done.
    Step {
        /// Steps done in this epoch.
        done: usize,
        /// The step's loss.
        loss: f64,
    },
    /// Validation after the steps is running.
    Validating,
    /// An epoch ended; `best` when its validation MSE is the best so far.
    EpochEnd {
        /// Its record.
        record: &'a EpochRecord,
        /// Whether it is the best epoch so far.
        best: bool,
    },
    /// Early stopping ends the run: no better validation MSE since `best_epoch`.
    EarlyStop {
        /// The best epoch.
        best_epoch: usize,
    },
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// Every epoch, resumed ones included.
    pub history: Vec<EpochRecord>,
    /// Epoch of the best validation loss.
    pub best_epoch: usize,
    /// Whether early stopping ended the run.
    pub stopped_early: bool,
    /// Validation MSE and MAE of Repeat.
    pub val_repeat: (f64, f64),
    /// Validation `(period, MSE, MAE)` of the seasonal naive forecast, where the calendar has a
    /// day.
    pub val_seasonal: Option<(usize, f64, f64)>,
    /// How much of the best epoch's correction of Repeat `best.ckpt` keeps (see [`Blend`]);
    /// `None` on every process but 0 of a run over several.
    pub blend: Option<Blend>,
    /// The quantile calibration `best.ckpt` holds; `None` on every process but 0.
    pub calibration: Option<Calibration>,
}

/// Metadata stored in `last.ckpt` and `best.ckpt`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunMeta {
    history: Vec<EpochRecord>,
    best_epoch: usize,
    best_val: f64,
    scaler: Scaler,
    train: TrainConfig,
    optim_file: Option<String>,
    /// The weight average's file and its updates, with `TrainConfig::ema`.
    #[serde(default)]
    ema_file: Option<String>,
    #[serde(default)]
    ema_updates: u64,
    /// The blend of the best epoch, which `best.ckpt` holds.
    #[serde(default)]
    blend: Option<Blend>,
}

/// Files of a run directory.
#[derive(Debug, Clone)]
pub struct RunDir(pub PathBuf);

impl RunDir {
    /// The best checkpoint (by validation MSE).
    pub fn best(&self) -> PathBuf {
        self.0.join("best.ckpt")
    }
    /// The checkpoint after the last completed epoch.
    pub fn last(&self) -> PathBuf {
        self.0.join("last.ckpt")
    }
    /// One JSON object per epoch.
    pub fn metrics(&self) -> PathBuf {
        self.0.join("metrics.jsonl")
    }
}

/// Sequences in windows `idx` of `w`: each window's targets that have all its values.
fn sequences(w: &Windows, idx: &[usize], targets: &[usize]) -> usize {
    if w.has_missing() {
        idx.iter().map(|&i| w.present_targets(i, targets).len()).sum()
    } else {
        idx.len() * targets.len()
    }
}

fn permutation(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    SplitMix64::new(seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03).permutation(n)
}

/// The training sequences of windows `idx` (each window's series), as tensors.
fn train_batch<B: Backend>(
    model: &Forecaster<B>,
    data: &Prepared,
    w: &Windows,
    idx: &[usize],
    (loss_from, every): (usize, usize),
    device: &B::Device,
) -> Batch<B> {
    let starts: Vec<usize> = idx.iter().map(|&i| w.starts[i]).collect();
    let present: Option<Vec<Vec<usize>>> = w.has_missing().then(|| idx.iter().map(|&i| w.present_targets(i, &data.targets)).collect());
    let span = w.lookback - loss_from.min(w.lookback - 1);
    model
        .feature_map()
        .build_present::<B::FloatElem>(
            &data.rows,
            &data.clock,
            &starts,
            present.as_deref(),
            w.lookback,
            span.div_ceil(every),
            every,
            Truth::Relative,
        )
        .into_device(w.horizon, device)
}

/// MSE and MAE of `model`'s forecast after each window of `w`, over all its targets and steps,
/// in batches of `batch_size` windows (dropping the last partial batch when `drop_last`, as the
/// protocol's test loader does). `clock` holds each row's calendar clock.
pub fn evaluate<B: Backend>(
    model: &Forecaster<B>,
    w: &Windows,
    clock: &[i64],
    batch_size: usize,
    drop_last: bool,
    device: &B::Device,
) -> Result<(f64, f64), TrainError> {
    Ok(evaluate_table(model, w, clock, batch_size, drop_last, device)?.total().mse_mae())
}

/// The errors of [`evaluate`] per target (in the order of the model's targets) and forecast
/// step, in the data's scaled units.
pub fn evaluate_table<B: Backend>(
    model: &Forecaster<B>,
    w: &Windows,
    clock: &[i64],
    batch_size: usize,
    drop_last: bool,
    device: &B::Device,
) -> Result<ErrorTable, TrainError> {
    let n = if drop_last { w.len() / batch_size * batch_size } else { w.len() };
    let mut table = ErrorTable::new(model.target_indices().len(), w.horizon);
    each_forecast(model, w, clock, n, batch_size, device, |_, t, _, p, y| table.add(t, p, y))?;
    Ok(table)
}

/// MSE and MAE of the forecasts that `stream` makes when it reads `rows` from the first row on:
/// the forecast after each row `r` in `range.0 + L - 1 .. range.1 - H` (the last rows of the
/// windows [`evaluate`] reads) from the state carried since row 0, instead of from a fresh
/// window of `L` rows.
pub fn evaluate_continuous<B: Backend>(
    model: &Forecaster<B>,
    rows: &[Vec<f64>],
    clock: &[i64],
    range: (usize, usize),
    device: &B::Device,
) -> Result<(f64, f64), TrainError> {
    let (l, h) = (model.spec().lookback, model.spec().horizon);
    let (first, end) = (range.0 + l - 1, range.1 - h);
    if end <= first {
        return Err(TrainError::Config { why: format!("rows {}..{} hold no window of lookback {l} and horizon {h}", range.0, range.1) });
    }
    // One history, rows 0..end, forecasts at its last end - first rows.
    let hb = model.feature_map().build::<B::FloatElem>(rows, clock, &[0], end, end - first, 1, Truth::Values);
    let truth = hb.truth.clone();
    let pred = mamba2_tensor::compare::to_f64_vec(model.forward(&hb.into_device(h, device))?);
    let mut sums = ErrorSums::default();
    sums.add(&pred, &truth);
    Ok(sums.mse_mae())
}

/// One optimizer step on `batch` (which must hold its truth): forward, the mean squared error
/// over every forecast position and step, backward, AdamW at `lr`. Returns the model after the
/// step, the loss before it, and the optimizer's report.
pub fn train_step<B: AutodiffBackend>(
    model: Forecaster<B>,
    optim: &mut AdamW<B>,
    batch: &Batch<B>,
    lr: f64,
    kind: Loss,
) -> Result<(Forecaster<B>, f64, StepReport), TrainError> {
    let device = batch.inputs.device();
    train_share(model, optim, Some(batch), lr, kind, 1.0, &Peer::alone(), &device)
}

/// One step of a data-parallel run: `batch` is this worker's share of the global batch (`None`
/// when the share is empty, as in a short last batch with many workers) and `weight` its part of
/// the global count, so that the workers' losses add up to the global mean; the gradients are
/// summed across the workers before the update, which every worker then applies alike. Returns
/// the global loss.
#[allow(clippy::too_many_arguments)]
fn train_share<B: AutodiffBackend>(
    model: Forecaster<B>,
    optim: &mut AdamW<B>,
    batch: Option<&Batch<B>>,
    lr: f64,
    kind: Loss,
    weight: f64,
    peer: &Peer,
    device: &B::Device,
) -> Result<(Forecaster<B>, f64, StepReport), TrainError> {
    let loss = match batch {
        Some(batch) => {
            if batch.truth.is_none() {
                return Err(TrainError::Config { why: "a training batch needs the values that follow it".into() });
            }
            // The workers of a process are threads, and Burn 0.21 loses gradients when one
            // thread's backward overlaps another's graph building (see mamba2_tensor::graph).
            let _building = mamba2_tensor::graph::recording();
            let loss = model.loss(batch, kind)?;
            Some(if weight == 1.0 { loss } else { loss.mul_scalar(weight) })
        }
        None => None,
    };
    // Every worker sees the same global value, so all of them stop here together when it is
    // not finite.
    let value = peer.sum_values::<B::InnerBackend>("summing the step's loss", &[loss.as_ref().map_or(0.0, loss_value)], device)?[0];
    if !value.is_finite() {
        return Err(TrainError::NonFinite { step: optim.steps(), what: format!("loss is {value}") });
    }
    // An empty share adds nothing: the sum takes zeros for every parameter it has no gradient of.
    let own = loss.map_or_else(GradientsParams::new, |loss| GradientsParams::from_grads(mamba2_tensor::graph::backward(loss), &model));
    let grads = peer.sum_grads(&model, own)?;
    let (next, report) = optim.step(lr, model, grads).map_err(|e| match e {
        OptimError::NonFinite { path, step } => TrainError::NonFinite { step, what: format!("gradient of {path}") },
        other => other.into(),
    })?;
    Ok((next, value, report))
}

/// This worker's own error, or, when another worker failed (`failures` > 0), an error that says
/// so: every worker leaves the run at the same point, none waits for the others forever.
fn stop_together<T>(peer: &Peer, outcome: Result<T, TrainError>, failures: f64) -> Result<T, TrainError> {
    match outcome {
        Err(e) => Err(e),
        Ok(_) if failures > 0.0 => Err(TrainError::Collective { rank: peer.rank, why: "stopped because worker 0 failed".into() }),
        Ok(v) => Ok(v),
    }
}

/// Worker 0's files after an epoch: the kept model (`best`) when the epoch is the best so far, the optimizer, the
/// weight average, `last.ckpt` (the commit point) and the metrics.
#[allow(clippy::too_many_arguments)]
fn save_epoch<B: AutodiffBackend>(
    config: &ForecasterConfig,
    dir: &RunDir,
    epoch: usize,
    best: Option<Forecaster<B::InnerBackend>>,
    model: &Forecaster<B>,
    optim: &AdamW<B>,
    ema: &Option<Ema<B::InnerBackend>>,
    meta: &mut RunMeta,
) -> Result<(), TrainError> {
    if let Some(kept) = best {
        save_checkpoint(&kept, config, &serde_json::to_value(&*meta).expect("serialisable"), &dir.best())?;
    }
    // The optimizer file is named by epoch and written first; last.ckpt, which names it, is the
    // commit point, so a kill at any moment leaves a consistent pair behind.
    let optim_file = format!("optim-{epoch}.safetensors");
    optim.save(&dir.0.join(&optim_file))?;
    let previous = meta.optim_file.replace(optim_file);
    let previous_ema = match ema {
        Some(e) => {
            let f = format!("ema-{epoch}.ckpt");
            save_checkpoint(&e.model, config, &serde_json::Value::Null, &dir.0.join(&f))?;
            meta.ema_updates = e.updates();
            meta.ema_file.replace(f)
        }
        None => None,
    };
    // last.ckpt holds the weights as trained (what a resumed run continues from).
    save_checkpoint(&model.valid(), config, &serde_json::to_value(&*meta).expect("serialisable"), &dir.last())?;
    for p in [previous, previous_ema].into_iter().flatten() {
        let _ = std::fs::remove_file(dir.0.join(p));
    }
    write_metrics(&dir.metrics(), &meta.history)
}

fn write_metrics(path: &Path, history: &[EpochRecord]) -> Result<(), TrainError> {
    let mut text = String::new();
    for r in history {
        text.push_str(&serde_json::to_string(r).expect("serialisable"));
        text.push('\n');
    }
    write_atomically(path, text.as_bytes()).map_err(TrainError::from)
}

/// Trains `config` on `data`, writing checkpoints and metrics into `dir`. With `resume`, a run
/// continues from `dir`'s last checkpoint and ends exactly as an uninterrupted run would.
pub fn train<B: AutodiffBackend>(
    config: &ForecasterConfig,
    tc: &TrainConfig,
    data: &Prepared,
    dir: &RunDir,
    resume: bool,
    device: &B::Device,
    report: impl FnMut(Progress),
) -> Result<TrainSummary, TrainError> {
    tc.validate()?;
    prepare_dir(dir)?;
    train_as::<B>(Peer::alone(), config, tc, data, dir, resume, device, report)
}

/// Makes the run directory and clears what a killed save left: once, before any worker starts,
/// so that no worker can fail on it while the others wait for it.
fn prepare_dir(dir: &RunDir) -> Result<(), TrainError> {
    std::fs::create_dir_all(&dir.0).map_err(|source| TrainError::Io { path: dir.0.display().to_string(), cause: source })?;
    // A kill during a save leaves its temporary file behind; the rename that would have used it
    // never happened, so it holds nothing a run needs.
    mamba2_model::remove_temporaries(&dir.0);
    Ok(())
}

/// [`train`] with `workers` data-parallel workers in this process, one thread each (see
/// [`Peer`]): the same run, to rounding, as one worker with the same global batch. Worker 0
/// validates, reports and writes `dir`; an error on any worker stops them all.
///
/// # Errors
/// As [`train_parallel`].
#[allow(clippy::too_many_arguments)]
pub fn train_workers<B: AutodiffBackend>(
    config: &ForecasterConfig,
    tc: &TrainConfig,
    data: &Prepared,
    dir: &RunDir,
    resume: bool,
    device: &B::Device,
    workers: usize,
    report: impl FnMut(Progress),
) -> Result<TrainSummary, TrainError>
where
    B::Device: Sync,
{
    train_parallel::<B>(config, tc, data, dir, resume, device, &Workers::threads(workers), report)
}

/// [`train`] as this process's part of a data-parallel run: `workers.threads` workers here, and
/// as many in each of the other processes of `workers.cluster`, all started with the same
/// settings. Process 0 validates, reports and writes `dir`; the others only read it, to resume
/// (on several machines, give them a shared or copied run directory). The first worker of each
/// process calls `report`.
///
/// # Errors
/// As [`train`]; [`TrainError::Config`] for a model with dropout (its masks would be drawn by
/// the workers of a process from one process-wide generator, in no fixed order), for more
/// workers than windows per batch, and for processes that would resume from different steps;
/// [`TrainError::Collective`] when the workers cannot exchange, or one of them stops, within
/// `workers.timeout`.
#[allow(clippy::too_many_arguments)]
pub fn train_parallel<B: AutodiffBackend>(
    config: &ForecasterConfig,
    tc: &TrainConfig,
    data: &Prepared,
    dir: &RunDir,
    resume: bool,
    device: &B::Device,
    workers: &Workers,
    report: impl FnMut(Progress),
) -> Result<TrainSummary, TrainError>
where
    B::Device: Sync,
{
    let world = workers.world();
    if world <= 1 {
        return train::<B>(config, tc, data, dir, resume, device, report);
    }
    tc.validate()?;
    if config.spec.dropout > 0.0 {
        return Err(TrainError::Config { why: format!("{world} data-parallel workers need dropout 0 (it is {})", config.spec.dropout) });
    }
    if world > tc.batch_size {
        return Err(TrainError::Config { why: format!("{world} data-parallel workers are more than the batch size {}", tc.batch_size) });
    }
    let mut peers = workers.peers().into_iter();
    let lead_peer = peers.next().expect("at least one thread");
    let rank = lead_peer.rank;
    if lead_peer.leads() {
        prepare_dir(dir)?;
    }
    std::thread::scope(|scope| {
        let others: Vec<_> =
            peers.map(|peer| scope.spawn(move || train_as::<B>(peer, config, tc, data, dir, resume, device, |_| {}))).collect();
        let lead = train_as::<B>(lead_peer, config, tc, data, dir, resume, device, report);
        // A worker that panicked is the cause of whatever the others report (they time out
        // waiting for it), so it is named first.
        let mut panicked = None;
        let mut first_error = None;
        for (thread, worker) in others.into_iter().enumerate() {
            match worker.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    panicked.get_or_insert(thread + 1);
                }
            }
        }
        match (lead, panicked, first_error) {
            (_, Some(thread), _) => Err(TrainError::Collective { rank, why: format!("worker {} of this process panicked", rank + thread) }),
            (Err(e), None, _) => Err(e),
            (Ok(_), None, Some(e)) => Err(e),
            (Ok(summary), None, None) => Ok(summary),
        }
    })
}

/// The model a run starts from: drawn from the backend's generator, which is one per process,
/// so workers take turns (each draws the same values from the same seed). Off the CPU the
/// weights are drawn on Flex and copied, so that a seed names the same model on every device
/// (and a run on a GPU can be checked against one on the CPU).
fn init_model<B: AutodiffBackend>(config: &ForecasterConfig, seed: u64, device: &B::Device) -> Result<Forecaster<B>, TrainError> {
    static DRAWING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = DRAWING.lock().unwrap_or_else(|e| e.into_inner());
    if mamba2_model::is_cpu_backend::<B>() {
        B::seed(device, seed);
        return Ok(config.init::<B>(device)?);
    }
    let host = Default::default();
    burn::backend::Flex::seed(&host, seed);
    let drawn = config.init::<burn::backend::Flex>(&host)?;
    Ok(mamba2_model::transfer_weights(&drawn, config.init::<B>(device)?, device)?)
}

/// [`train`] as worker `peer` of a data-parallel run, in a directory made ready and with
/// settings checked by the caller.
#[allow(clippy::too_many_arguments)]
fn train_as<B: AutodiffBackend>(
    peer: Peer,
    config: &ForecasterConfig,
    tc: &TrainConfig,
    data: &Prepared,
    dir: &RunDir,
    resume: bool,
    device: &B::Device,
    mut report: impl FnMut(Progress),
) -> Result<TrainSummary, TrainError> {
    let (l, h) = (config.spec.lookback, config.spec.horizon);
    let train_w = Windows::new(&data.rows, data.ranges[0], l, h, 1)?;
    let val_w = Windows::new(&data.rows, data.ranges[1], l, h, 1)?;
    let steps_per_epoch = train_w.len().div_ceil(tc.stride).div_ceil(tc.batch_size);
    let schedule = LrSchedule::WarmupCosine {
        peak: tc.lr,
        floor: tc.min_lr,
        warmup: tc.warmup_steps.min(steps_per_epoch * tc.epochs / 2),
        total: steps_per_epoch * tc.epochs,
    };
    let ocfg = AdamWConfig { weight_decay: tc.weight_decay, max_grad_norm: tc.max_grad_norm, ..AdamWConfig::default() };

    let (model, optim, meta, ema) = if resume && dir.last().exists() {
        let loaded = load_checkpoint::<B, Forecaster<B>, ForecasterConfig>(&dir.last(), device, |c, d| c.init(d))?;
        if &loaded.config != config {
            return Err(TrainError::Config {
                why: format!("{} was trained with another model config; use a new output directory", dir.last().display()),
            });
        }
        let meta: RunMeta =
            serde_json::from_value(loaded.meta).map_err(|e| TrainError::Config { why: format!("unreadable run metadata: {e}") })?;
        if meta.train != *tc {
            return Err(TrainError::Config { why: "the training settings differ from the run being resumed".into() });
        }
        let mut optim = AdamW::new(ocfg, &loaded.module)?;
        if let Some(f) = &meta.optim_file {
            optim.load(&dir.0.join(f), device)?;
        }
        let ema = match (tc.ema, &meta.ema_file) {
            (Some(decay), Some(f)) => {
                let avg =
                    load_checkpoint::<B::InnerBackend, Forecaster<B::InnerBackend>, ForecasterConfig>(&dir.0.join(f), device, |c, d| {
                        c.init(d)
                    })?;
                Some(Ema::resumed(avg.module, decay, meta.ema_updates))
            }
            (Some(decay), None) => Some(Ema::new(loaded.module.valid(), decay)),
            (None, _) => None,
        };
        report(Progress::Resumed { epochs_done: meta.history.len(), step: optim.steps() });
        (loaded.module, optim, meta, ema)
    } else {
        let model = init_model::<B>(config, tc.seed, device)?;
        let optim = AdamW::new(ocfg, &model)?;
        let meta = RunMeta {
            history: Vec::new(),
            best_epoch: 0,
            best_val: f64::INFINITY,
            scaler: data.scaler.clone(),
            train: tc.clone(),
            optim_file: None,
            ema_file: None,
            ema_updates: 0,
            blend: None,
        };
        let ema = tc.ema.map(|decay| Ema::new(model.valid(), decay));
        (model, optim, meta, ema)
    };

    peer.join::<B::InnerBackend>(device)?;
    let result = same_start::<B>(&peer, optim.steps(), device).and_then(|()| {
        epochs(peer.clone(), config, tc, data, dir, device, &train_w, &val_w, &schedule, (model, optim, meta, ema), &mut report)
    });
    // After a failed exchange the collective may still be waiting for the lost worker: leaving it
    // would wait too.
    let left = match &result {
        Err(TrainError::Collective { .. }) => Ok(()),
        _ => peer.leave::<B::InnerBackend>(),
    };
    let summary = result?;
    left?;
    Ok(summary)
}

/// Fails unless every worker starts from the same optimizer step: processes that resume need
/// the same run directory.
fn same_start<B: AutodiffBackend>(peer: &Peer, steps: usize, device: &B::Device) -> Result<(), TrainError> {
    let s = steps as f64;
    let sums = peer.sum_values::<B::InnerBackend>("comparing the starting step", &[s, s * s], device)?;
    // Equal counts exactly when the sum of squares is the square of the sum over the count.
    if (sums[1] * peer.world as f64 - sums[0] * sums[0]).abs() > 0.5 {
        return Err(TrainError::Config {
            why: format!(
                "worker {} starts at optimizer step {steps}, others do not (mean {:.1}): every process of a resumed run needs \
                 the run directory of process 0 (shared, or copied)",
                peer.rank,
                sums[0] / peer.world as f64
            ),
        });
    }
    Ok(())
}

/// The epochs of [`train_as`], from the given model, optimizer and run state on.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn epochs<B: AutodiffBackend>(
    peer: Peer,
    config: &ForecasterConfig,
    tc: &TrainConfig,
    data: &Prepared,
    dir: &RunDir,
    device: &B::Device,
    train_w: &Windows,
    val_w: &Windows,
    schedule: &LrSchedule,
    (mut model, mut optim, mut meta, mut ema): (Forecaster<B>, AdamW<B>, RunMeta, Option<Ema<B::InnerBackend>>),
    report: &mut impl FnMut(Progress),
) -> Result<TrainSummary, TrainError> {
    let per_epoch = |epoch: usize| -> Vec<usize> {
        // Window starts offset..len step stride, offset drawn per epoch: each epoch sees a
        // different 1/stride of the windows, in an order that is a function of (seed, epoch).
        let offset = permutation(tc.stride, tc.seed ^ 0x5EED, epoch)[0];
        let picked: Vec<usize> = (offset..train_w.len()).step_by(tc.stride).collect();
        permutation(picked.len(), tc.seed, epoch).into_iter().map(|i| picked[i]).collect()
    };
    let val_repeat = repeat_table(val_w, &data.targets, 1).total().mse_mae();
    let val_seasonal = config.spec.calendar.as_ref().and_then(|c| c.day()).map(|p| {
        let (m, a) = seasonal_table(val_w, &data.targets, p, 1).total().mse_mae();
        (p, m, a)
    });
    report(Progress::Baselines { repeat: val_repeat, seasonal: val_seasonal });
    let mut stopped_early = false;
    for epoch in meta.history.len() + 1..=tc.epochs {
        if stops_early(meta.history.len(), meta.best_epoch, tc.patience) {
            stopped_early = true;
            report(Progress::EarlyStop { best_epoch: meta.best_epoch });
            break;
        }
        let start = Instant::now();
        let order = per_epoch(epoch);
        report(Progress::EpochStart { epoch, steps: order.len().div_ceil(tc.batch_size), windows: order.len() });
        let (mut loss_sum, mut norm_sum, mut lr, mut steps) = (0.0, 0.0, 0.0, 0usize);
        for idx in order.chunks(tc.batch_size) {
            let shard = peer.shard(idx);
            let batch = (!shard.is_empty()).then(|| train_batch(&model, data, train_w, shard, (tc.loss_from, tc.loss_every), device));
            lr = schedule.lr_at(optim.steps());
            // Dropout draws from the backend's generator: seeded per step, so that a resumed run
            // draws what an uninterrupted one would.
            B::seed(device, tc.seed ^ (optim.steps() as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
            // The loss is a mean over sequences: a panel's windows hold different numbers of them.
            let weight = sequences(train_w, shard, &data.targets) as f64 / sequences(train_w, idx, &data.targets) as f64;
            let (next, value, step_report) = train_share(model, &mut optim, batch.as_ref(), lr, tc.loss, weight, &peer, device)?;
            model = next;
            if let Some(e) = ema.as_mut() {
                e.update(&model.valid());
            }
            loss_sum += value * idx.len() as f64;
            norm_sum += step_report.grad_norm;
            steps += 1;
            report(Progress::Step { done: steps, loss: value });
        }
        report(Progress::Validating);
        // What is evaluated and kept as best: the weight average where there is one. Worker 0
        // evaluates and hands the figures on, so that every worker's run state (history, best
        // epoch, hence early stopping) stays the same.
        let valid = ema.as_ref().map_or_else(|| model.valid(), |e| e.model.clone());
        let validated = if peer.leads() { score(&valid, val_w, &data.clock, tc.batch_size, device).map(Some) } else { Ok(None) };
        let (val_mse, val_mae) = validated.as_ref().ok().and_then(|v| v.as_ref()).map_or((0.0, 0.0), |v| v.model.total().mse_mae());
        let shared = peer.sum_values::<B::InnerBackend>(
            "sharing the validation figures",
            &[val_mse, val_mae, f64::from(u8::from(validated.is_err()))],
            device,
        )?;
        let scored = stop_together(&peer, validated, shared[2])?;
        let (val_mse, val_mae) = (shared[0], shared[1]);
        let record = EpochRecord {
            epoch,
            step: optim.steps(),
            train_loss: loss_sum / order.len() as f64,
            val_mse,
            val_mae,
            val_skill: mamba2_data::trade::skill(val_mse, val_repeat.0),
            lr,
            grad_norm: norm_sum / steps.max(1) as f64,
            seconds: start.elapsed().as_secs_f64(),
        };
        let best = val_mse < meta.best_val;
        report(Progress::EpochEnd { record: &record, best });
        meta.history.push(record);
        // The best epoch's model is kept as the blend with Repeat that validation supports.
        let kept = match (best, scored) {
            (true, Some(scored)) => {
                let blend = scored.choose_blend(tc.repeat_check);
                let kept = valid.clone().shrunk_toward_repeat(blend.alpha);
                meta.blend = Some(blend);
                Some(kept)
            }
            _ => None,
        };
        if best {
            meta.best_val = val_mse;
            meta.best_epoch = epoch;
        }
        let written = if peer.leads() { save_epoch(config, dir, epoch, kept, &model, &optim, &ema, &mut meta) } else { Ok(()) };
        let failed = peer.sum_values::<B::InnerBackend>(
            "sharing whether the checkpoint was written",
            &[f64::from(u8::from(written.is_err()))],
            device,
        )?;
        stop_together(&peer, written, failed[0])?;
    }
    // The kept model's errors on validation give its quantiles: written into best.ckpt once the
    // epochs are done (a resumed run that has none left to train does the same again).
    let calibration = if peer.leads() && dir.best().exists() {
        report(Progress::Calibrating);
        // Repeat kept (alpha 0) gets a random walk's intervals.
        let repeat_kept = meta.blend.as_ref().is_some_and(|b| b.alpha == 0.0);
        Some(calibrate_best::<B::InnerBackend>(config, dir, val_w, &data.clock, tc, repeat_kept, device)?)
    } else {
        None
    };
    Ok(TrainSummary {
        history: meta.history,
        best_epoch: meta.best_epoch,
        stopped_early,
        val_repeat,
        val_seasonal,
        blend: meta.blend,
        calibration,
    })
}

/// Fits the quantiles of `best.ckpt`'s forecasts on the validation windows and saves them in it
/// (atomically, beside what it held); `repeat_kept`: its blend is Repeat (`alpha` 0).
fn calibrate_best<B: Backend>(
    config: &ForecasterConfig,
    dir: &RunDir,
    val_w: &Windows,
    clock: &[i64],
    tc: &TrainConfig,
    repeat_kept: bool,
    device: &B::Device,
) -> Result<Calibration, TrainError> {
    let best = load_checkpoint::<B, Forecaster<B>, ForecasterConfig>(&dir.best(), device, |c, d| c.init(d))?;
    let c = calibrate(&best.module, val_w, clock, &tc.quantiles, tc.batch_size, repeat_kept, device)?;
    let mut meta = best.meta;
    meta["calibration"] = serde_json::to_value(&c).expect("serialisable");
    save_checkpoint(&best.module, config, &meta, &dir.best())?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the default epochs and patience, a run whose validation MSE is best after its first
    /// epoch stops after `1 + patience` epochs, before its last; one that improves every epoch
    /// runs them all. (With 4 epochs and patience 3, as before the defaults were chosen on the
    /// validation split, it could never stop early.)
    #[test]
    fn early_stopping_can_end_a_default_run() {
        let tc = TrainConfig::default();
        let stopped_after = (1..=tc.epochs).find(|&done| stops_early(done, 1, tc.patience));
        assert_eq!(stopped_after, Some(1 + tc.patience));
        assert!(1 + tc.patience < tc.epochs, "{} epochs with patience {} never stop early", tc.epochs, tc.patience);
        assert!((1..=tc.epochs).all(|done| !stops_early(done, done, tc.patience)));
        assert!(!stops_early(0, 0, tc.patience), "no epoch yet, nothing to stop on");
    }
}
