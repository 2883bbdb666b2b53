use burn::nn::Linear;
use burn::prelude::*;

use crate::mixer::uniform_linear;
use crate::{Mamba2Config, Mamba2Stack, Mamba2State, ModelError};

/// A Mamba-2 for real-valued sequences: features in, outputs out, at every step.
#[derive(Config, Debug, PartialEq)]
pub struct TimeSeriesConfig {
    /// The stack.
    pub backbone: Mamba2Config,
    /// Features per input row.
    pub n_features: usize,
    /// Values predicted per row.
    pub n_outputs: usize,
}

/// `Linear(n_features -> d_model)`, the stack, `Linear(d_model -> n_outputs)`.
#[derive(Module, Debug)]
pub struct Mamba2TimeSeries<B: Backend> {
    /// Input projection.
    pub input_proj: Linear<B>,
    /// The stack.
    pub backbone: Mamba2Stack<B>,
    /// Output projection.
    pub output_proj: Linear<B>,
}

impl TimeSeriesConfig {
    /// A model with mamba_ssm's initialisation inside and PyTorch's Linear bounds outside.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Mamba2TimeSeries<B>, ModelError> {
        for (name, v) in [("n_features", self.n_features), ("n_outputs", self.n_outputs)] {
            if v == 0 {
                return Err(crate::ConfigError::Zero { name }.into());
            }
        }
        let d = self.backbone.d_model;
        Ok(Mamba2TimeSeries {
            input_proj: uniform_linear(self.n_features, d, 1.0 / (self.n_features as f64).sqrt(), true, device),
            backbone: Mamba2Stack::init(&self.backbone, device)?,
            output_proj: uniform_linear(d, self.n_outputs, 1.0 / (d as f64).sqrt(), true, device),
        })
    }
}

impl<B: Backend> Mamba2TimeSeries<B> {
    /// The stack's config.
    pub fn config(&self) -> &Mamba2Config {
        self.backbone.config()
    }

    /// Outputs at every step, continuing from `state`.
    ///
    /// # Shapes
    /// - `x`: `[batch, L, n_features]`; output: `[batch, L, n_outputs]`
    pub fn forward(&self, x: Tensor<B, 3>, state: Option<Mamba2State<B>>) -> Result<(Tensor<B, 3>, Mamba2State<B>), ModelError> {
        let (h, state) = self.backbone.forward(crate::linear_rows(&self.input_proj, x), state)?;
        Ok((crate::linear_rows(&self.output_proj, h), state))
    }

    /// The output for one new row per batch entry.
    ///
    /// # Shapes
    /// - `x`: `[batch, n_features]`; output: `[batch, n_outputs]`
    pub fn step(&self, x: Tensor<B, 2>, state: Mamba2State<B>) -> Result<(Tensor<B, 2>, Mamba2State<B>), ModelError> {
        let (h, state) = self.backbone.step(self.input_proj.forward(x), state)?;
        Ok((self.output_proj.forward(h), state))
    }

    /// A zero state for `batch` rows.
    pub fn zero_state(&self, batch: usize, device: &B::Device) -> Mamba2State<B> {
        Mamba2State::zeros(self.config(), batch, device)
    }
}
