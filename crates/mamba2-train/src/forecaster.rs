//! The forecasting model: optional per-window instance normalisation (RevIN), a Mamba-2 over
//! time, a head that reads the last position, and an optional linear skip over the lookback.

use burn::nn::Linear;
use burn::prelude::*;
use mamba2_model::{ConfigError, Mamba2Config, Mamba2State, Mamba2TimeSeries, ModelError, TimeSeriesConfig};
use serde::{Deserialize, Serialize};

/// What the forecaster reads and predicts, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecastSpec {
    /// Input rows per window, `L`.
    pub lookback: usize,
    /// Predicted rows, `H` (1 for next-step).
    pub horizon: usize,
    /// Names of the input columns, in order.
    pub features: Vec<String>,
    /// Names of the predicted columns (a subset of `features`), in order.
    pub targets: Vec<String>,
    /// Subtract each window's mean and divide by its std per channel, undo on the output.
    pub revin: bool,
    /// Add a linear map over the lookback (per target channel, shared) to the Mamba head.
    pub linear_skip: bool,
}

/// The full configuration saved with a forecaster checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecasterConfig {
    /// The data contract.
    pub spec: ForecastSpec,
    /// The Mamba-2 stack.
    pub backbone: Mamba2Config,
}

/// The forecaster. Output at the last position: `[batch, horizon, n_targets]`.
#[derive(Module, Debug)]
pub struct Forecaster<B: Backend> {
    /// Mamba-2 from features to `horizon * n_targets` values per position.
    pub mamba: Mamba2TimeSeries<B>,
    /// `Linear(lookback -> horizon)` over time, when `linear_skip`.
    pub skip: Option<Linear<B>>,
    #[module(skip)]
    spec: ForecastSpec,
    #[module(skip)]
    target_idx: Vec<usize>,
}

const REVIN_EPS: f64 = 1e-5;

impl ForecasterConfig {
    /// A fresh model.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Forecaster<B>, ModelError> {
        let s = &self.spec;
        let target_idx = s
            .targets
            .iter()
            .map(|t| {
                s.features.iter().position(|f| f == t).ok_or_else(|| {
                    ModelError::Config(ConfigError::Invalid {
                        name: "targets",
                        value: t.clone(),
                        why: "each target must be one of the features",
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mamba = TimeSeriesConfig::new(self.backbone.clone(), s.features.len(), s.horizon * s.targets.len()).init(device)?;
        let skip = s.linear_skip.then(|| burn::nn::LinearConfig::new(s.lookback, s.horizon).init(device));
        Ok(Forecaster { mamba, skip, spec: s.clone(), target_idx })
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

    fn targets_of(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let idx = Tensor::<B, 1, Int>::from_data(
            TensorData::new(self.target_idx.iter().map(|&i| i as i64).collect::<Vec<_>>(), [self.target_idx.len()]),
            &x.device(),
        );
        x.select(2, idx)
    }

    /// The forecast after each window.
    ///
    /// # Shapes
    /// - `x`: `[batch, L, n_features]`; output: `[batch, horizon, n_targets]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError> {
        let [batch, len, _] = x.dims();
        let (h, t) = (self.spec.horizon, self.target_idx.len());
        let (x, stats) = if self.spec.revin {
            let mean = x.clone().mean_dim(1);
            let centered = x - mean.clone();
            let std = centered.clone().powi_scalar(2).mean_dim(1).add_scalar(REVIN_EPS).sqrt();
            (centered / std.clone(), Some((mean, std)))
        } else {
            (x, None)
        };
        let (out, _) = self.mamba.forward(x.clone(), None)?;
        let mut y = out.narrow(1, len - 1, 1).reshape([batch, h, t]);
        if let Some(skip) = &self.skip {
            // [batch, L, T] -> [batch, T, L] -> Linear over time -> [batch, T, H] -> [batch, H, T]
            y = y + skip.forward(self.targets_of(x).swap_dims(1, 2)).swap_dims(1, 2);
        }
        Ok(match stats {
            Some((mean, std)) => y * self.targets_of(std) + self.targets_of(mean),
            None => y,
        })
    }

    /// Online use (only for models without RevIN and without the linear skip, whose output
    /// depends on the whole recurrent history and nothing else): the forecast after one more
    /// row, and the state after it.
    ///
    /// # Shapes
    /// - `x`: `[batch, n_features]`; output: `[batch, horizon, n_targets]`
    pub fn step(&self, x: Tensor<B, 2>, state: Mamba2State<B>) -> Result<(Tensor<B, 3>, Mamba2State<B>), ModelError> {
        let [batch, _] = x.dims();
        let (y, state) = self.mamba.step(x, state)?;
        Ok((y.reshape([batch, self.spec.horizon, self.target_idx.len()]), state))
    }

    /// The forecast after the last of all rows given, run from a zero state: what
    /// [`step`](Self::step) gives after the same rows.
    ///
    /// # Shapes
    /// - `x`: `[batch, rows, n_features]`; output: `[batch, horizon, n_targets]`
    pub fn forward_history(&self, x: Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError> {
        let [batch, len, _] = x.dims();
        let (out, _) = self.mamba.forward(x, None)?;
        Ok(out.narrow(1, len - 1, 1).reshape([batch, self.spec.horizon, self.target_idx.len()]))
    }

    /// Whether [`step`](Self::step) applies (no per-window normalisation, no window skip).
    pub fn streamable(&self) -> bool {
        !self.spec.revin && !self.spec.linear_skip
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    /// A target that is not among the features is a config error that names it, not a panic
    /// and not another kind of error.
    #[test]
    fn a_target_outside_the_features_is_a_config_error() {
        let spec = ForecastSpec {
            lookback: 8,
            horizon: 2,
            features: vec!["a".into(), "b".into()],
            targets: vec!["b".into(), "OT".into()],
            revin: true,
            linear_skip: false,
        };
        let config = ForecasterConfig { spec, backbone: Mamba2Config::new(16, 1).with_d_state(8).with_headdim(8) };
        match config.init::<NdArray<f32>>(&Default::default()) {
            Err(e @ ModelError::Config(ConfigError::Invalid { name: "targets", .. })) => {
                assert!(e.to_string().contains("OT"), "{e}");
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a forecaster with an unknown target was built"),
        }
    }
}
