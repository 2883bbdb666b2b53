//! The optimizer for Mamba-2 models: AdamW with Mamba's parameter groups, global-norm gradient
//! clipping, learning-rate schedules, and state that saves and resumes exactly.
//!
//! - [`AdamW`]: `torch.optim.AdamW` step for step, in f64 arithmetic for its scalars; `A_log`,
//!   `D`, `dt_bias`, norm weights and biases take no weight decay by default.
//! - Clipping by the L2 norm of all gradients together (`clip_grad_norm_`), reporting the norm
//!   before clipping; a non-finite gradient stops the step and names its parameter.
//! - [`LrSchedule`]: constant, or linear warmup then cosine decay to a floor.
//! - [`loss_value`]: a scalar loss read back as f64 without passing through f32.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::optim::GradientsParams;
//! use burn::prelude::*;
//! use mamba2_model::{Mamba2Config, TimeSeriesConfig};
//! use mamba2_optim::{loss_value, AdamW, AdamWConfig, LrSchedule};
//!
//! type B = Autodiff<NdArray<f64>>;
//! let device = Default::default();
//! let config = TimeSeriesConfig::new(Mamba2Config::new(8, 1).with_d_state(4).with_headdim(4), 2, 1);
//! let mut model = config.init::<B>(&device).unwrap();
//! let mut optim = AdamW::new(AdamWConfig::default(), &model).unwrap();
//! let schedule = LrSchedule::Constant { lr: 1e-3 };
//! let x = Tensor::<B, 3>::ones([2, 5, 2], &device);
//! let (y, _) = model.forward(x, None).unwrap();
//! let loss = y.powi_scalar(2).mean();
//! let value: f64 = loss_value(&loss);
//! let grads = GradientsParams::from_grads(loss.backward(), &model);
//! let (next, report) = optim.step(schedule.lr_at(optim.steps()), model, grads).unwrap();
//! model = next;
//! assert!(value.is_finite() && report.grad_norm > 0.0);
//! assert!(optim.no_decay_paths().iter().any(|p| p.ends_with("mixer.a_log")));
//! ```

#![forbid(unsafe_code)]

mod adamw;
mod schedule;

use burn::prelude::*;

pub use adamw::{matches_pattern, AdamW, AdamWConfig, StepReport};
pub use schedule::LrSchedule;

/// Errors of the optimizer.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A hyper-parameter is out of range.
    #[error("optimizer config: {name} = {value} is out of range")]
    Config {
        /// The field.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// A gradient holds NaN or infinity.
    #[error("non-finite gradient in {path} at optimizer step {step}")]
    NonFinite {
        /// The first parameter (in module order) whose gradient is not finite.
        path: String,
        /// Steps completed before this one.
        step: usize,
    },
    /// Saved optimizer state cannot be written or does not fit.
    #[error("optimizer state {path}: {why}")]
    State {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// A scalar (one-element) tensor's value as f64, converted from the backend's own float type
/// directly: an f64 loss keeps every bit.
pub fn loss_value<B: Backend, const D: usize>(loss: &Tensor<B, D>) -> f64 {
    loss.clone().into_data().convert::<f64>().to_vec::<f64>().expect("f64 data")[0]
}
