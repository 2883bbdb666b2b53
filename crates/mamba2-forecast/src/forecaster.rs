//! The forecasting model: each predicted series is a sequence of its own (channel
//! independence, weights shared), normalised by statistics of its own past only
//! ([`features`](crate::features)), read by a Mamba-2 over time; at every row a linear head
//! forecasts the next `H` values relative to the last one, in units of the rolling standard
//! deviation, plus an optional learned daily (or weekly) cycle of each series.
//!
//! Because nothing in it looks at a whole window at once, the forecast after a row depends on
//! the recurrent state and on the rolling statistics alone, so the model runs tick by tick
//! ([`ForecastStream`](crate::ForecastStream)) with the same numbers as over a whole history.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::prelude::*;
use burn::tensor::Element;
use mamba2_model::{linear_rows, ConfigError, Mamba2Config, Mamba2TimeSeries, ModelError, Picks, TimeSeriesConfig};
use mamba2_tensor::ordered_mean;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::features::{FeatureMap, HostBatch, Truth};
pub use crate::truth::RelativeTruth;
use mamba2_data::calendar::Calendar;

/// The training loss over every forecast position and step, in the data's scaled units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Loss {
    /// Mean squared error.
    Mse,
    /// Mean absolute error: the default (`docs/forecasting.md`: equal validation MSE, lower
    /// MAE than the sum of the two at H 96 and H 720).
    #[default]
    Mae,
    /// The sum of the two.
    MseMae,
}

impl Loss {
    /// The weights of the mean squared and the mean absolute error in the loss.
    pub fn weights(self) -> (f64, f64) {
        match self {
            Loss::Mse => (1.0, 0.0),
            Loss::Mae => (0.0, 1.0),
            Loss::MseMae => (1.0, 1.0),
        }
    }
}

/// What the forecaster reads and predicts, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecastSpec {
    /// Rows of history per training and evaluation window, `L`.
    pub lookback: usize,
    /// Predicted rows, `H` (1 for next-step).
    pub horizon: usize,
    /// Names of the input columns, in order.
    pub features: Vec<String>,
    /// Names of the predicted columns (a subset of `features`), in order. The other features
    /// are covariates that every predicted series reads.
    pub targets: Vec<String>,
    /// Rows of the past that the rolling mean and standard deviation cover.
    pub norm_window: usize,
    /// Divide each series by its rolling standard deviation (and forecast in those units).
    pub scale: bool,
    /// Values of its own past that each row's input holds (1: the row's value alone).
    pub patch: usize,
    /// A linear map from each row's inputs (the patch, the calendar, the series' code) to the
    /// forecast, beside the Mamba's head.
    pub direct: bool,
    /// The data's calendar, when its date column gave one: its cycles become inputs.
    pub calendar: Option<Calendar>,
    /// Length in rows of a learned additive cycle per series (CycleNet's recurrent cycle): the
    /// forecast adds `Q[phase ahead] - Q[phase now]`, phases on the calendar's clock. 0: none.
    pub cycle: usize,
    /// A learned vector per series added to its inputs (through a one-hot code in the inputs),
    /// so the shared model can tell the series apart.
    pub series_embedding: bool,
    /// Dropout probability on the stack's output before the head, in training.
    #[serde(default)]
    pub dropout: f64,
    /// Every series also reads every predicted series' current normalised value (channel
    /// mixing at the input), not only the covariates.
    #[serde(default)]
    pub mix: bool,
    /// Covariates known ahead (a subset of the features that are not targets): at each row the
    /// model also reads their values at the `H` rows it forecasts. `predict` and `stream` must
    /// then be given those values for the rows after the last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub future: Vec<String>,
    /// Trained on a panel in long format: the features and targets are its series' ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panel: Option<PanelSpec>,
    /// Static covariates: fixed inputs of each series (its sector, its market), which every row
    /// of it reads. `None`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statics: Option<StaticSpec>,
}

/// Static covariates as a model reads them ([`mamba2_data::statics`]): each series' inputs,
/// encoded from its row of a static table when the model was trained, and kept here so that
/// `predict` and `stream` need no table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaticSpec {
    /// The static table's columns.
    pub columns: Vec<String>,
    /// The inputs they make (`sector=energy` for a category, `cap` for a number), in order.
    pub inputs: Vec<String>,
    /// Each target's inputs, in the targets' order.
    pub values: Vec<Vec<f64>>,
}

/// How a panel in long format was read ([`mamba2_data::panel`]): one row per series id and date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PanelSpec {
    /// The column naming each row's series.
    pub id_column: String,
    /// The column of the series' values.
    pub value_column: String,
    /// Columns of each row read as covariates of its id (each id's own, named among the
    /// features [`covariate_column`](mamba2_data::panel::covariate_column) of the id and the
    /// column; those known ahead are in [`ForecastSpec::future`] by that name). Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covariates: Vec<String>,
}

impl ForecastSpec {
    /// The names of the future covariates as a series alone reads them (its rows hold its value
    /// and then its covariates): a panel's covariates known ahead, or [`future`](Self::future).
    pub fn series_future(&self) -> Vec<String> {
        match (&self.panel, self.targets.first()) {
            (Some(p), Some(t)) => {
                p.covariates.iter().filter(|c| self.future.contains(&mamba2_data::panel::covariate_column(t, c))).cloned().collect()
            }
            _ => self.future.clone(),
        }
    }

    /// The learned cycle's length in rows, 0 when there is none.
    pub fn cycle_period(&self) -> usize {
        if self.calendar.is_some() {
            self.cycle
        } else {
            0
        }
    }
}

/// Values of its own past each row's input holds, by default (fewer when the lookback is
/// shorter). It is a fixed size, not the lookback: the work per row must not grow with `L`.
pub const DEFAULT_PATCH: usize = 96;

/// The default stack: `d_model` 32, one block, `d_state` 16, `headdim` 16, `expand` 2, chunks
/// of 32 rows.
pub fn default_backbone() -> Mamba2Config {
    Mamba2Config::new(32, 1).with_d_state(16).with_headdim(16).with_expand(2).with_chunk_size(32)
}

/// The full configuration saved with a forecaster checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecasterConfig {
    /// The data contract.
    pub spec: ForecastSpec,
    /// The Mamba-2 stack.
    pub backbone: Mamba2Config,
}

/// The forecaster; see the module documentation.
#[derive(Module, Debug)]
pub struct Forecaster<B: Backend> {
    /// `Linear(inputs -> d_model)`, the stack, and the head `Linear(d_model -> H)`.
    pub mamba: Mamba2TimeSeries<B>,
    /// Dropout before the head (a no-op outside training).
    pub dropout: Dropout,
    /// `Linear(n_feat -> H)` over the row's own inputs, when `direct`.
    pub direct: Option<Linear<B>>,
    /// `[n_targets * period]`, the learned cycle of each series, when `cycle`.
    pub cycle: Option<Param<Tensor<B, 1>>>,
    #[module(skip)]
    spec: ForecastSpec,
    #[module(skip)]
    target_idx: Vec<usize>,
    #[module(skip)]
    covariate_idx: Vec<usize>,
}

impl ForecasterConfig {
    /// The default forecaster for a task (what `mamba2 train` builds without flags): see
    /// `docs/forecasting.md` for how each value was chosen on the validation split.
    pub fn defaults(lookback: usize, horizon: usize, features: Vec<String>, targets: Vec<String>, calendar: Option<Calendar>) -> Self {
        ForecasterConfig {
            spec: ForecastSpec {
                lookback,
                horizon,
                features,
                targets,
                norm_window: (lookback / 2).max(1),
                scale: false,
                patch: DEFAULT_PATCH.min(lookback).max(1),
                direct: true,
                cycle: calendar.as_ref().map_or(0, |c| c.periods[0]),
                calendar,
                series_embedding: true,
                dropout: 0.0,
                mix: false,
                future: Vec::new(),
                panel: None,
                statics: None,
            },
            backbone: default_backbone(),
        }
    }

    /// Checks what a user (or a checkpoint's header) can get wrong, before anything is built;
    /// returns each target's column among the features.
    pub fn validate(&self) -> Result<Vec<usize>, ModelError> {
        let s = &self.spec;
        let invalid = |name: &'static str, value: String, why: &'static str| ModelError::Config(ConfigError::Invalid { name, value, why });
        for (name, v, max) in [
            ("lookback", s.lookback, 1 << 24),
            ("horizon", s.horizon, 1 << 20),
            ("patch", s.patch, 1 << 16),
            ("norm_window", s.norm_window, 1 << 24),
            ("cycle", s.cycle.max(1), 1 << 20),
            ("features", s.features.len().max(1), 1 << 16),
        ] {
            if v == 0 {
                return Err(ModelError::Config(ConfigError::Zero { name }));
            }
            // Bounds far above any real task, checked before memory is reserved: a checkpoint
            // from someone else must not make the program ask for terabytes.
            if v > max {
                return Err(ModelError::Config(ConfigError::TooLarge { name, value: v, max }));
            }
        }
        if let Some(c) = &s.calendar {
            if c.interval <= 0 || c.periods.is_empty() || c.periods.iter().any(|&p| !(2..=1 << 20).contains(&p)) {
                return Err(invalid("calendar", format!("{c:?}"), "needs a positive interval and periods of 2 to 2^20 rows"));
            }
        }
        if let Some(st) = &s.statics {
            let n = st.inputs.len();
            if n > mamba2_data::statics::MAX_STATIC_INPUTS {
                return Err(ModelError::Config(ConfigError::TooLarge {
                    name: "static inputs",
                    value: n,
                    max: mamba2_data::statics::MAX_STATIC_INPUTS,
                }));
            }
            if st.values.len() != s.targets.len() || st.values.iter().any(|v| v.len() != n || v.iter().any(|x| !x.is_finite())) {
                return Err(invalid(
                    "statics",
                    format!("{} series' values for {} targets", st.values.len(), s.targets.len()),
                    "each target has one finite value per static input",
                ));
            }
        }
        let statics = s.statics.as_ref().map_or(0, |st| st.inputs.len());
        let inputs = (s.patch + 2 * s.features.len() + 64 + statics).saturating_add(s.future.len().saturating_mul(s.horizon));
        let width = self.backbone.d_model.max(s.horizon);
        if inputs.saturating_mul(width) > 1 << 30 || s.targets.len().saturating_mul(s.cycle) > 1 << 30 {
            return Err(ModelError::Config(ConfigError::TooLarge {
                name: "head weights",
                value: inputs.saturating_mul(width).max(s.targets.len().saturating_mul(s.cycle)),
                max: 1 << 30,
            }));
        }
        if s.cycle == 1 {
            return Err(invalid("cycle", "1".into(), "a cycle is at least 2 rows long (0: none)"));
        }
        if !(0.0..1.0).contains(&s.dropout) {
            return Err(invalid("dropout", s.dropout.to_string(), "a dropout probability is at least 0 and below 1"));
        }
        if s.targets.is_empty() {
            return Err(invalid("targets", String::new(), "at least one column is predicted"));
        }
        for f in &s.future {
            if s.targets.contains(f) || !s.features.contains(f) {
                return Err(invalid("future", f.clone(), "a future covariate is one of the features and not a target"));
            }
        }
        if let Some(p) = &s.panel {
            // Every id reads the same covariates, each known ahead for all ids or for none.
            for t in &s.targets {
                for c in &p.covariates {
                    let name = mamba2_data::panel::covariate_column(t, c);
                    let first = mamba2_data::panel::covariate_column(&s.targets[0], c);
                    if !s.features.contains(&name) || s.future.contains(&name) != s.future.contains(&first) {
                        return Err(invalid("panel", name, "each id of a panel reads each covariate, known ahead for all ids or none"));
                    }
                }
            }
        }
        for (list, name) in [(&s.features, "features"), (&s.targets, "targets"), (&s.future, "future")] {
            if let Some((_, c)) = list.iter().enumerate().find(|(i, c)| list[..*i].contains(c)) {
                return Err(invalid(name, c.clone(), "each column may appear only once"));
            }
        }
        self.backbone.validate()?;
        s.targets
            .iter()
            .map(|t| {
                s.features
                    .iter()
                    .position(|f| f == t)
                    .ok_or_else(|| invalid("targets", t.clone(), "each target must be one of the features"))
            })
            .collect()
    }

    /// The validated config's target columns, covariate columns and inputs per row: what
    /// [`init`](Self::init) builds from and [`min_weights`](Self::min_weights) counts.
    fn columns(&self) -> Result<(Vec<usize>, Vec<usize>, usize), ModelError> {
        let s = &self.spec;
        let target_idx = self.validate()?;
        let own: Vec<usize> = own_columns(s, &target_idx).into_iter().flatten().collect();
        let covariate_idx = (0..s.features.len()).filter(|j| (s.mix || !target_idx.contains(j)) && !own.contains(j)).collect::<Vec<_>>();
        let n_feat = map_of(s, &target_idx, &covariate_idx).n_feat();
        Ok((target_idx, covariate_idx, n_feat))
    }

    /// A lower bound on the weights [`init`](Self::init) creates (the blocks' projections, the
    /// input projection, the head, the direct map and the cycle table): a checkpoint whose file
    /// is smaller than 8 bytes per weight (they are stored as f64) cannot hold this config's
    /// weights, and is refused before any memory is reserved for them.
    pub fn min_weights(&self) -> Result<usize, ModelError> {
        let s = &self.spec;
        let (_, _, n_feat) = self.columns()?;
        let b = &self.backbone;
        let blocks = b.n_layer.saturating_mul(b.d_model).saturating_mul(b.d_in_proj().saturating_add(b.d_inner()));
        let head = n_feat.saturating_add(s.horizon).saturating_mul(b.d_model);
        let direct = if s.direct { n_feat.saturating_mul(s.horizon) } else { 0 };
        let cycle = s.targets.len().saturating_mul(s.cycle_period());
        Ok(blocks.saturating_add(head).saturating_add(direct).saturating_add(cycle))
    }

    /// A fresh model. Its head starts at zero, so an untrained model forecasts Repeat.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Forecaster<B>, ModelError> {
        let s = &self.spec;
        let (target_idx, covariate_idx, n_feat) = self.columns()?;
        let mut mamba = TimeSeriesConfig::new(self.backbone.clone(), n_feat, s.horizon).init(device)?;
        mamba.output_proj = zero_linear(self.backbone.d_model, s.horizon, device);
        if s.series_embedding {
            // The one-hot code's rows of the input projection are the embedding and take the
            // bias's place (their sum is 1 on every row), without a broadcast over the rows.
            mamba.input_proj.bias = None;
        }
        let cycle = (s.cycle_period() > 0).then(|| Param::from_tensor(Tensor::zeros([s.targets.len() * s.cycle_period()], device)));
        let direct = s.direct.then(|| zero_linear(n_feat, s.horizon, device));
        let dropout = DropoutConfig::new(s.dropout).init();
        Ok(Forecaster { mamba, dropout, direct, cycle, spec: s.clone(), target_idx, covariate_idx })
    }
}

fn zero_linear<B: Backend>(d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
    // No bias: the last value and the cycle give the forecast its offset, and a bias would be a
    // broadcast over every forecast position.
    Linear { weight: Param::from_tensor(Tensor::zeros([d_in, d_out], device)), bias: None }
}

/// Each target's own covariate columns: a panel's ids' columns ([`PanelSpec::covariates`]);
/// empty for other models.
fn own_columns(s: &ForecastSpec, targets: &[usize]) -> Vec<Vec<usize>> {
    match &s.panel {
        Some(p) if !p.covariates.is_empty() => targets
            .iter()
            .map(|&t| {
                p.covariates
                    .iter()
                    .filter_map(|c| {
                        let name = mamba2_data::panel::covariate_column(&s.features[t], c);
                        s.features.iter().position(|f| *f == name)
                    })
                    .collect()
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn map_of(s: &ForecastSpec, targets: &[usize], covariates: &[usize]) -> FeatureMap {
    FeatureMap {
        own: own_columns(s, targets),
        statics: s.statics.as_ref().map_or(Vec::new(), |st| st.values.clone()),
        targets: targets.to_vec(),
        covariates: covariates.to_vec(),
        future: s.future.iter().filter_map(|f| s.features.iter().position(|x| x == f)).collect(),
        norm_window: s.norm_window,
        patch: s.patch,
        scale: s.scale,
        calendar: s.calendar.clone(),
        cycle_period: s.cycle_period(),
        horizon: s.horizon,
        series_code: s.series_embedding,
        series: (0..targets.len()).collect(),
        n_series: targets.len(),
    }
}

/// A [`HostBatch`] on a device.
#[derive(Debug, Clone)]
pub struct Batch<B: Backend> {
    /// `[n_seq, len, n_feat]`.
    pub inputs: Tensor<B, 3>,
    /// `[n_seq, n_pos, 1]`: the last value at each forecast position.
    pub level: Tensor<B, 3>,
    /// `[n_seq, n_pos, H]`: the rolling standard deviation, repeated over the forecast steps
    /// (Burn's CPU backends run a broadcast several times slower than an elementwise
    /// operation); `None` where it is 1 everywhere (a model without scaling).
    pub scale: Option<Tensor<B, 3>>,
    /// `[n_seq * n_pos]`: the row `series * period + phase` of each forecast position in the
    /// cycle's step table, when the model has a cycle.
    pub cycle_now: Option<Tensor<B, 1, Int>>,
    /// What followed each forecast position minus its last value, when known: the target of
    /// [`Forecaster::forward_relative`], kept on the host as the batch holds it.
    pub truth: Option<Arc<RelativeTruth>>,
    /// Forecast positions per sequence.
    pub n_pos: usize,
    /// `[n_pos]`, the rows of the forecast positions, when they are not the last `n_pos` rows.
    pub positions: Option<Tensor<B, 1, Int>>,
    /// Rows between forecast positions: they are the last row and every `every`-th before it.
    pub every: usize,
}

impl<B: Backend> Batch<B> {
    /// The forecast positions as the rows the stack's output is wanted at.
    pub fn picks(&self) -> Picks {
        Picks { n: self.n_pos, every: self.every }
    }
}

fn int_tensor<B: Backend>(v: &[i64], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
}

impl<E: Element> HostBatch<E> {
    /// The batch as tensors on `device` (best built with `E` the backend's float type, which
    /// then needs no conversion).
    pub fn into_device<B: Backend>(self, horizon: usize, device: &B::Device) -> Batch<B> {
        let (n, p, h) = (self.n_seq, self.n_pos, horizon);
        let tensor = |v: Vec<E>, shape: [usize; 3]| Tensor::<B, 3>::from_data(TensorData::new(v, shape), device);
        let scaled = self.scale.iter().any(|&s| s != 1.0);
        // A million values each at the default shape: written in parallel, in place.
        let per_position = |fill: &(dyn Fn(usize, &mut [E]) + Sync)| {
            let mut out = vec![E::from_elem(0.0); self.level.len() * h];
            out.par_chunks_mut(h.max(1)).enumerate().for_each(|(q, o)| fill(q, o));
            out
        };
        let repeat = |v: &[f64]| per_position(&|q, o| o.fill(E::from_elem(v[q])));
        let picks = Picks { n: p, every: self.every.max(1) };
        let positions: Vec<usize> = (0..p).map(|j| picks.row(self.len, j)).collect();
        let truth = if !self.ahead.is_empty() {
            Some((self.ahead, self.len + h - 1, positions.clone()))
        } else {
            (!self.truth.is_empty()).then(|| (self.truth, p * h, (0..p).map(|j| j * h).collect()))
        };
        Batch {
            inputs: tensor(self.inputs, [n, self.len, self.n_feat]),
            level: tensor(self.level.iter().map(|&v| E::from_elem(v)).collect(), [n, p, 1]),
            scale: scaled.then(|| tensor(repeat(&self.scale), [n, p, h])),
            cycle_now: (!self.cycle_now.is_empty()).then(|| int_tensor::<B>(&self.cycle_now, device)),
            truth: truth
                .map(|(values, seq_stride, starts)| Arc::new(RelativeTruth { values, seq_stride, starts, level: self.level, horizon: h })),
            n_pos: p,
            positions: (self.every > 1).then(|| int_tensor::<B>(&positions.iter().map(|&r| r as i64).collect::<Vec<_>>(), device)),
            every: self.every.max(1),
        }
    }
}

impl<B: Backend> Forecaster<B> {
    /// The data contract.
    pub fn spec(&self) -> &ForecastSpec {
        &self.spec
    }

    /// The column of each target among the features, in the order of `spec().targets`.
    pub fn target_indices(&self) -> &[usize] {
        &self.target_idx
    }

    /// How this model's inputs are made from rows.
    pub fn feature_map(&self) -> FeatureMap {
        map_of(&self.spec, &self.target_idx, &self.covariate_idx)
    }

    /// The forecasts at a batch's forecast positions, in the scaled units of the data: the last
    /// value plus [`forward_relative`](Self::forward_relative).
    ///
    /// # Shapes
    /// - output: `[n_seq, n_pos, H]`
    pub fn forward(&self, batch: &Batch<B>) -> Result<Tensor<B, 3>, ModelError> {
        Ok(self.forward_relative(batch)? + batch.level.clone())
    }

    /// The forecasts minus the last value: the heads' output (times the rolling standard
    /// deviation, with scaling) plus the learned cycle's steps. Training fits this to
    /// [`Batch::truth`], so that the last value is never added and taken away again over
    /// every forecast position.
    ///
    /// # Shapes
    /// - output: `[n_seq, n_pos, H]`
    pub fn forward_relative(&self, batch: &Batch<B>) -> Result<Tensor<B, 3>, ModelError> {
        let [n, len, _] = batch.inputs.dims();
        let (p, h) = (batch.n_pos, self.spec.horizon);
        let last = |t: Tensor<B, 3>| match &batch.positions {
            Some(rows) => t.select(1, rows.clone()),
            None if p == len => t,
            None => t.narrow(1, len - p, p),
        };
        let (hidden, _) =
            self.mamba.backbone.forward_picked(linear_rows(&self.mamba.input_proj, batch.inputs.clone()), None, batch.picks())?;
        let mut out = linear_rows(&self.mamba.output_proj, self.dropout.forward(hidden));
        if let Some(d) = &self.direct {
            out = out + linear_rows(d, last(batch.inputs.clone()));
        }
        if let Some(scale) = &batch.scale {
            out = out * scale.clone();
        }
        if let (Some(q), Some(now)) = (&self.cycle, &batch.cycle_now) {
            out = out + self.cycle_steps(q.val()).select(0, now.clone()).reshape([n, p, h]);
        }
        Ok(out)
    }

    /// The training loss of a batch (which must hold its truth): `kind` over every forecast
    /// position and step of [`forward_relative`](Self::forward_relative) against
    /// [`Batch::truth`], in the data's scaled units.
    ///
    /// On the CPU backends the head, the direct map, the cycle and the loss run as one node
    /// (`mamba2_cpu::readout`); elsewhere, with dropout in training, and inside
    /// `mamba2_model::with_generic_path` as the tensor operations of `forward_relative`.
    ///
    /// # Shapes
    /// - output: `[1]`
    pub fn loss(&self, batch: &Batch<B>, kind: Loss) -> Result<Tensor<B, 1>, ModelError> {
        let truth = batch.truth.clone().ok_or_else(|| {
            ModelError::Config(ConfigError::Invalid { name: "batch", value: "no truth".into(), why: "a loss needs the values that follow" })
        })?;
        let dropping = B::ad_enabled(&batch.inputs.device()) && self.spec.dropout > 0.0;
        let biased = self.mamba.output_proj.bias.is_some() || self.direct.as_ref().is_some_and(|d| d.bias.is_some());
        if !mamba2_model::runs_on_host::<B>() || dropping || biased {
            let err = self.forward_relative(batch)? - truth.tensor::<B>(&batch.inputs.device());
            let (mse, mae) = kind.weights();
            return Ok(match (mse > 0.0, mae > 0.0) {
                (true, true) => ordered_mean(err.clone().powi_scalar(2)).mul_scalar(mse) + ordered_mean(err.abs()).mul_scalar(mae),
                (true, false) => ordered_mean(err.powi_scalar(2)).mul_scalar(mse),
                _ => ordered_mean(err.abs()).mul_scalar(mae),
            });
        }
        let [n, len, n_feat] = batch.inputs.dims();
        let (p, h, d) = (batch.n_pos, self.spec.horizon, self.mamba.output_proj.weight.dims()[0]);
        let (hidden, _) =
            self.mamba.backbone.forward_picked(linear_rows(&self.mamba.input_proj, batch.inputs.clone()), None, batch.picks())?;
        let flat = |t: Tensor<B, 2>| {
            let n = t.shape().num_elements();
            t.reshape([n])
        };
        let cycle = match (&self.cycle, &batch.cycle_now) {
            (Some(_), Some(now)) => {
                Some((now.clone().into_data().convert::<i64>().into_vec::<i64>().expect("i64 after convert"), self.spec.cycle_period()))
            }
            _ => None,
        };
        let (mse, mae) = kind.weights();
        let op = crate::readout::Readout {
            dims: mamba2_cpu::readout::ReadoutDims {
                n_seq: n,
                len,
                n_pos: p,
                every: batch.every,
                d_model: d,
                n_feat: if self.direct.is_some() { n_feat } else { 0 },
                horizon: h,
            },
            cycle,
            truth,
            loss: mamba2_cpu::readout::LossWeights { mse, mae },
        };
        let mut inputs: [Option<Tensor<B, 1>>; crate::readout::PARENTS] = Default::default();
        inputs[crate::readout::HIDDEN] = Some(hidden.reshape([n * p * d]));
        inputs[crate::readout::HEAD] = Some(flat(self.mamba.output_proj.weight.val()));
        if let Some(direct) = &self.direct {
            inputs[crate::readout::DIRECT] = Some(flat(direct.weight.val()));
            inputs[crate::readout::INPUTS] = Some(batch.inputs.clone().reshape([n * len * n_feat]));
        }
        if op.cycle.is_some() {
            inputs[crate::readout::CYCLE] = self.cycle.as_ref().map(|q| q.val());
        }
        inputs[crate::readout::SCALE] = batch.scale.clone().map(|s| s.reshape([n * p * h]));
        Ok(mamba2_model::host_op(op, inputs))
    }

    /// The learned cycle's step table `[T * period, H]`, when the model has a cycle: row
    /// `c * period + phase` holds what the cycle adds to series `c`'s forecast `k = 1..=H` steps
    /// after a row at that phase.
    pub fn cycle_table(&self) -> Option<Tensor<B, 2>> {
        self.cycle.as_ref().map(|q| self.cycle_steps(q.val()))
    }

    /// The cycle's step table `[T * period, H]`: row `c * period + phase` holds
    /// `Q[c, phase + k] - Q[c, phase]` for `k = 1..=H` (phases modulo the period). Selecting
    /// whole rows keeps the gradient's scatter to one row per forecast position.
    fn cycle_steps(&self, q: Tensor<B, 1>) -> Tensor<B, 2> {
        let (t, per, h) = (self.target_idx.len(), self.spec.cycle_period(), self.spec.horizon);
        let ahead: Vec<i64> = (0..t * per).flat_map(|r| (1..=h).map(move |k| ((r / per) * per + (r % per + k) % per) as i64)).collect();
        let now: Vec<i64> = (0..t * per).flat_map(|r| std::iter::repeat_n(r as i64, h)).collect();
        let device = q.device();
        let steps = q.clone().select(0, int_tensor(&ahead, &device)) - q.select(0, int_tensor(&now, &device));
        steps.reshape([t * per, h])
    }

    /// The model whose forecast is `last + alpha * (this model's forecast - last)`: a blend of
    /// this model (`alpha` 1) and Repeat (`alpha` 0). Every part of the forecast relative to the
    /// last value is linear in the head, the direct map and the cycle, so scaling their weights
    /// by `alpha` is the blend, and `predict`, `stream` and checkpoints need nothing new.
    pub fn shrunk_toward_repeat(mut self, alpha: f64) -> Self {
        let scale = |p: Param<Tensor<B, 2>>| p.map(|t| t.mul_scalar(alpha));
        let scale1 = |p: Param<Tensor<B, 1>>| p.map(|t| t.mul_scalar(alpha));
        self.mamba.output_proj.weight = scale(self.mamba.output_proj.weight);
        self.mamba.output_proj.bias = self.mamba.output_proj.bias.map(scale1);
        if let Some(d) = self.direct.as_mut() {
            d.weight = scale(d.weight.clone());
            d.bias = d.bias.clone().map(scale1);
        }
        self.cycle = self.cycle.map(scale1);
        self
    }

    /// The forecast of the model's target at position `t` alone after the last row of its own
    /// history, `rows` holding just its value each (a panel's series, with the dates it has rows
    /// for): `H` values in the scaled units. What
    /// [`ForecastStream::of_series`](crate::ForecastStream::of_series) gives after the same rows.
    ///
    /// # Errors
    /// [`ModelError::State`] when the model reads covariates (a series' rows would lack them)
    /// or `t` is not one of its targets.
    pub fn forecast_series(&self, rows: &[Vec<f64>], clock: &[i64], t: usize, device: &B::Device) -> Result<Vec<f64>, ModelError> {
        self.forecast_series_ahead(rows, &[], clock, t, device)
    }

    /// [`forecast_series`](Self::forecast_series) for a panel whose ids have covariates known
    /// ahead ([`PanelSpec::covariates`]): each row holds the series' value and then its
    /// covariates, and `ahead` the `H` rows after the history (their values may be NaN). What
    /// [`ForecastStream::of_series`](crate::ForecastStream::of_series) gives after the same rows,
    /// announced ahead.
    ///
    /// # Errors
    /// As [`forecast_series`](Self::forecast_series), and [`ModelError::Input`] when `ahead`
    /// lacks a value the model reads.
    pub fn forecast_series_ahead(
        &self,
        rows: &[Vec<f64>],
        ahead: &[Vec<f64>],
        clock: &[i64],
        t: usize,
        device: &B::Device,
    ) -> Result<Vec<f64>, ModelError> {
        self.forecast_after(&self.feature_map().alone(t)?, &self.spec.series_future(), rows, ahead, clock, device)
    }

    /// The forecast of `map`'s targets after the history `rows` (series-major, `[T, H]`),
    /// reading the rows `ahead` where the map has future covariates (named `names`).
    fn forecast_after(
        &self,
        map: &FeatureMap,
        names: &[String],
        rows: &[Vec<f64>],
        ahead: &[Vec<f64>],
        clock: &[i64],
        device: &B::Device,
    ) -> Result<Vec<f64>, ModelError> {
        check_ahead(map, names, ahead)?;
        let h = self.spec.horizon;
        let hb = if map.future.is_empty() {
            map.build::<B::FloatElem>(rows, clock, &[0], rows.len(), 1, 1, Truth::Values)
        } else {
            let all: Vec<Vec<f64>> = rows.iter().chain(&ahead[..h]).cloned().collect();
            map.build::<B::FloatElem>(&all, clock, &[0], rows.len(), 1, 1, Truth::Values)
        };
        Ok(mamba2_tensor::compare::to_f64_vec(self.forward(&hb.into_device(h, device))?))
    }

    /// The forecast after the last row of a history, `[horizon, n_targets]` row-major, in the
    /// scaled units of the data: what [`ForecastStream`](crate::ForecastStream) gives after
    /// the same rows. `clock` holds each row's calendar clock (ignored without a calendar).
    ///
    /// # Errors
    /// [`ModelError::Input`] when the model reads future covariates: use
    /// [`forecast_history_ahead`](Self::forecast_history_ahead).
    pub fn forecast_history(&self, rows: &[Vec<f64>], clock: &[i64], device: &B::Device) -> Result<Vec<f64>, ModelError> {
        self.forecast_history_ahead(rows, &[], clock, device)
    }

    /// [`forecast_history`](Self::forecast_history) for a model that reads future covariates
    /// ([`ForecastSpec::future`]): `ahead` holds the `H` rows after the history (more are
    /// ignored), where only the future columns are read (the others may be NaN). What
    /// [`ForecastStream::push_ahead`](crate::ForecastStream::push_ahead) gives after the same
    /// rows.
    ///
    /// # Errors
    /// [`ModelError::Input`] when the model reads future covariates and `ahead` holds fewer
    /// than `H` rows, or one of their future values is not finite.
    pub fn forecast_history_ahead(
        &self,
        rows: &[Vec<f64>],
        ahead: &[Vec<f64>],
        clock: &[i64],
        device: &B::Device,
    ) -> Result<Vec<f64>, ModelError> {
        let y = self.forecast_after(&self.feature_map(), &self.spec.future, rows, ahead, clock, device)?;
        Ok(series_major_to_rows(&y, self.target_idx.len(), self.spec.horizon))
    }
}

/// Whether `ahead` gives what a forecast of `map` needs after its last row: the `H` rows ahead
/// with a finite value in each future column (named `names`), when it reads future covariates.
pub(crate) fn check_ahead(map: &FeatureMap, names: &[String], ahead: &[Vec<f64>]) -> Result<(), ModelError> {
    if map.future.is_empty() {
        return Ok(());
    }
    let h = map.horizon;
    if ahead.len() < h {
        return Err(ModelError::Input {
            why: format!(
                "the model reads the future covariates ({}) at the {h} rows it forecasts; {} rows ahead were given",
                names.join(", "),
                ahead.len()
            ),
        });
    }
    for (k, row) in ahead[..h].iter().enumerate() {
        for (&j, name) in map.future.iter().zip(names) {
            if !row.get(j).is_some_and(|v| v.is_finite()) {
                return Err(ModelError::Input { why: format!("row {} ahead has no value of the future covariate `{name}`", k + 1) });
            }
        }
    }
    Ok(())
}

/// `[T, H]` (one forecast per series) to `[H, T]` (one row per forecast step).
pub fn series_major_to_rows(y: &[f64], t: usize, h: usize) -> Vec<f64> {
    (0..h).flat_map(|k| (0..t).map(move |c| y[c * h + k])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    fn spec(targets: &[&str]) -> ForecastSpec {
        ForecastSpec {
            lookback: 8,
            horizon: 2,
            features: vec!["a".into(), "b".into()],
            targets: targets.iter().map(|t| t.to_string()).collect(),
            norm_window: 8,
            patch: 3,
            direct: true,
            scale: true,
            calendar: Some(Calendar { interval: 3600, periods: vec![24, 168] }),
            cycle: 24,
            series_embedding: true,
            dropout: 0.0,
            mix: false,
            future: vec![],
            panel: None,
            statics: None,
        }
    }

    /// A target that is not among the features is a config error that names it, not a panic
    /// and not another kind of error.
    #[test]
    fn a_target_outside_the_features_is_a_config_error() {
        let config = ForecasterConfig { spec: spec(&["b", "OT"]), backbone: Mamba2Config::new(16, 1).with_d_state(8).with_headdim(8) };
        match config.init::<NdArray<f32>>(&Default::default()) {
            Err(e @ ModelError::Config(ConfigError::Invalid { name: "targets", .. })) => {
                assert!(e.to_string().contains("OT"), "{e}");
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a forecaster with an unknown target was built"),
        }
    }

    /// An untrained model forecasts Repeat: the head and the cycle start at zero.
    #[test]
    fn an_untrained_model_forecasts_repeat() {
        let config = ForecasterConfig { spec: spec(&["b"]), backbone: Mamba2Config::new(16, 1).with_d_state(8).with_headdim(8) };
        let model = config.init::<NdArray<f64>>(&Default::default()).unwrap();
        let rows: Vec<Vec<f64>> = (0..20).map(|t| vec![t as f64, (t as f64 * 0.7).cos()]).collect();
        let clock: Vec<i64> = (100..120).collect();
        let y = model.forecast_history(&rows, &clock, &Default::default()).unwrap();
        assert_eq!(y, vec![rows[19][1]; 2]);
    }

    /// A model shrunk toward Repeat by `alpha` forecasts `last + alpha * (forecast - last)`, with
    /// every part of the correction (head, direct map, biases, cycle) non-zero; `alpha` 0 is
    /// Repeat exactly.
    #[test]
    fn shrinking_blends_the_forecast_with_repeat() {
        type B = NdArray<f64>;
        let device = Default::default();
        let config = ForecasterConfig { spec: spec(&["a", "b"]), backbone: Mamba2Config::new(16, 1).with_d_state(8).with_headdim(8) };
        let mut model = config.init::<B>(&device).unwrap();
        let noise =
            |dims: [usize; 2]| Param::from_tensor(Tensor::<B, 2>::random(dims, burn::tensor::Distribution::Normal(0.0, 0.3), &device));
        let noise1 = |n: usize| Param::from_tensor(Tensor::<B, 1>::random([n], burn::tensor::Distribution::Normal(0.0, 0.3), &device));
        model.mamba.output_proj.weight = noise(model.mamba.output_proj.weight.dims());
        model.mamba.output_proj.bias = Some(noise1(2));
        let d = model.direct.as_mut().unwrap();
        d.weight = noise(d.weight.dims());
        d.bias = Some(noise1(2));
        model.cycle = Some(noise1(2 * 24));
        let rows: Vec<Vec<f64>> = (0..30).map(|t| vec![(t as f64 * 0.3).sin(), (t as f64 * 0.7).cos()]).collect();
        let clock: Vec<i64> = (100..130).collect();
        let full = model.forecast_history(&rows, &clock, &device).unwrap();
        let last = [rows[29][0], rows[29][1]];
        for alpha in [0.0, 0.35, 1.0] {
            let y = model.clone().shrunk_toward_repeat(alpha).forecast_history(&rows, &clock, &device).unwrap();
            for (i, (v, f)) in y.iter().zip(&full).enumerate() {
                let want = last[i % 2] + alpha * (f - last[i % 2]);
                assert!((v - want).abs() < 1e-12, "alpha {alpha}, value {i}: {v} vs {want}");
            }
            assert!(alpha > 0.0 || y == vec![last[0], last[1], last[0], last[1]], "alpha 0 is not Repeat exactly: {y:?}");
        }
        assert!(full.iter().zip(last.iter().cycle()).all(|(f, l)| (f - l).abs() > 1e-6), "the correction is zero somewhere: {full:?}");
    }

    /// `min_weights`, which bounds a checkpoint's config by its file's length, never exceeds
    /// the weights a model really has (else a true checkpoint would be refused), and is most
    /// of them (else it would bound nothing).
    #[test]
    fn min_weights_is_a_close_lower_bound() {
        let cal = mamba2_data::calendar::Calendar { interval: 3600, periods: vec![24, 168] };
        let features: Vec<String> = (0..7).map(|i| format!("c{i}")).collect();
        for (l, h, targets, direct, layers) in [(96, 96, 7, true, 1), (96, 720, 7, true, 2), (48, 1, 3, false, 1), (512, 24, 1, true, 3)] {
            let mut c = ForecasterConfig::defaults(l, h, features.clone(), features[..targets].to_vec(), Some(cal.clone()));
            c.spec.direct = direct;
            c.backbone.n_layer = layers;
            let real = burn::module::Module::num_params(&c.init::<NdArray<f64>>(&Default::default()).unwrap());
            let bound = c.min_weights().unwrap();
            assert!(bound <= real && bound * 10 >= real * 8, "L {l} H {h}: bound {bound}, real {real}");
        }
    }
}
