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
use mamba2_optim::{loss_value, AdamW, AdamWConfig, LrSchedule, OptimError};
use mamba2_tensor::from_f64_vec;
use mamba2_tensor::rng::SplitMix64;
use serde::{Deserialize, Serialize};

use crate::data::{ErrorSums, Scaler, Windows};
use crate::forecaster::{Forecaster, ForecasterConfig};
use crate::TrainError;

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
    /// Step between training window starts.
    pub stride: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 4,
            batch_size: 32,
            lr: 1e-3,
            min_lr: 1e-5,
            warmup_steps: 100,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            patience: 3,
            seed: 0,
            stride: 1,
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
    /// Learning rate of the last step.
    pub lr: f64,
    /// Mean gradient norm before clipping.
    pub grad_norm: f64,
    /// Wall time of the epoch.
    pub seconds: f64,
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

fn permutation(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    SplitMix64::new(seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03).permutation(n)
}

/// A batch of windows as tensors.
pub fn batch_tensors<B: Backend>(w: &Windows, idx: &[usize], targets: &[usize], device: &B::Device) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let (x, y) = w.gather(idx, targets);
    let c = w.rows[0].len();
    (from_f64_vec(x, [idx.len(), w.lookback, c], device), from_f64_vec(y, [idx.len(), w.horizon, targets.len()], device))
}

/// MSE and MAE of `model` over `windows` in batches of `batch_size` (dropping the last partial
/// batch when `drop_last`, as the protocol's test loader does).
pub fn evaluate<B: Backend>(
    model: &Forecaster<B>,
    w: &Windows,
    targets: &[usize],
    batch_size: usize,
    drop_last: bool,
    device: &B::Device,
) -> Result<(f64, f64), TrainError> {
    let n = if drop_last { w.len() / batch_size * batch_size } else { w.len() };
    let mut sums = ErrorSums::default();
    let idx: Vec<usize> = (0..n).collect();
    for chunk in idx.chunks(batch_size) {
        let (x, y) = batch_tensors::<B>(w, chunk, targets, device);
        let pred = model.forward(x)?;
        sums.add(&mamba2_tensor::compare::to_f64_vec(pred), &mamba2_tensor::compare::to_f64_vec(y));
    }
    Ok(sums.mse_mae())
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
    mut log: impl FnMut(&str),
) -> Result<TrainSummary, TrainError> {
    tc.validate()?;
    std::fs::create_dir_all(&dir.0).map_err(|source| TrainError::Io { path: dir.0.display().to_string(), cause: source })?;
    let (l, h) = (config.spec.lookback, config.spec.horizon);
    let train_w = Windows::new(&data.rows, data.ranges[0], l, h, tc.stride)?;
    let val_w = Windows::new(&data.rows, data.ranges[1], l, h, 1)?;
    let steps_per_epoch = train_w.len().div_ceil(tc.batch_size);
    let schedule = LrSchedule::WarmupCosine {
        peak: tc.lr,
        floor: tc.min_lr,
        warmup: tc.warmup_steps.min(steps_per_epoch * tc.epochs / 2),
        total: steps_per_epoch * tc.epochs,
    };
    let ocfg = AdamWConfig { weight_decay: tc.weight_decay, max_grad_norm: tc.max_grad_norm, ..AdamWConfig::default() };

    let (mut model, mut optim, mut meta) = if resume && dir.last().exists() {
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
        log(&format!("resuming after epoch {} (step {})", meta.history.len(), optim.steps()));
        (loaded.module, optim, meta)
    } else {
        B::seed(device, tc.seed);
        let model = config.init::<B>(device)?;
        let optim = AdamW::new(ocfg, &model)?;
        let meta = RunMeta {
            history: Vec::new(),
            best_epoch: 0,
            best_val: f64::INFINITY,
            scaler: data.scaler.clone(),
            train: tc.clone(),
            optim_file: None,
        };
        (model, optim, meta)
    };

    let mut stopped_early = false;
    for epoch in meta.history.len() + 1..=tc.epochs {
        if meta.history.len() >= meta.best_epoch + tc.patience && meta.best_epoch > 0 {
            stopped_early = true;
            break;
        }
        let start = Instant::now();
        let order = permutation(train_w.len(), tc.seed, epoch);
        let (mut loss_sum, mut norm_sum, mut lr) = (0.0, 0.0, 0.0);
        for idx in order.chunks(tc.batch_size) {
            let (x, y) = batch_tensors::<B>(&train_w, idx, &data.targets, device);
            let pred = model.forward(x)?;
            let loss = (pred - y).powi_scalar(2).mean();
            let value = loss_value(&loss);
            if !value.is_finite() {
                return Err(TrainError::NonFinite { step: optim.steps(), what: format!("loss is {value}") });
            }
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            lr = schedule.lr_at(optim.steps());
            let (next, report) = optim.step(lr, model, grads).map_err(|e| match e {
                OptimError::NonFinite { path, step } => TrainError::NonFinite { step, what: format!("gradient of {path}") },
                other => other.into(),
            })?;
            model = next;
            loss_sum += value * idx.len() as f64;
            norm_sum += report.grad_norm;
        }
        let valid = model.valid();
        let (val_mse, val_mae) = evaluate(&valid, &val_w, &data.targets, tc.batch_size, false, device)?;
        let record = EpochRecord {
            epoch,
            step: optim.steps(),
            train_loss: loss_sum / train_w.len() as f64,
            val_mse,
            val_mae,
            lr,
            grad_norm: norm_sum / steps_per_epoch as f64,
            seconds: start.elapsed().as_secs_f64(),
        };
        log(&serde_json::to_string(&record).expect("serialisable"));
        meta.history.push(record);
        if val_mse < meta.best_val {
            meta.best_val = val_mse;
            meta.best_epoch = epoch;
            save_checkpoint(&valid, config, &serde_json::to_value(&meta).expect("serialisable"), &dir.best())?;
        }
        // The optimizer file is named by epoch and written first; last.ckpt, which names it, is
        // the commit point, so a kill at any moment leaves a consistent pair behind.
        let optim_file = format!("optim-{epoch}.safetensors");
        optim.save(&dir.0.join(&optim_file))?;
        let previous = meta.optim_file.replace(optim_file);
        save_checkpoint(&valid, config, &serde_json::to_value(&meta).expect("serialisable"), &dir.last())?;
        if let Some(p) = previous {
            let _ = std::fs::remove_file(dir.0.join(p));
        }
        write_metrics(&dir.metrics(), &meta.history)?;
    }
    Ok(TrainSummary { history: meta.history, best_epoch: meta.best_epoch, stopped_early })
}
