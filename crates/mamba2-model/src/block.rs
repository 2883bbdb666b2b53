use burn::prelude::*;

use crate::mixer::Mamba2Mixer;
use crate::norm::RmsNorm;
use crate::{Mamba2Config, MixerState, ModelError};

/// One residual block: `h + mixer(RMSNorm(h))`.
#[derive(Module, Debug)]
pub struct Mamba2Block<B: Backend> {
    /// The pre-norm, `[d_model]`.
    pub norm: RmsNorm<B>,
    /// The mixer.
    pub mixer: Mamba2Mixer<B>,
}

impl<B: Backend> Mamba2Block<B> {
    /// A block with mamba_ssm's initialisation.
    pub fn init(config: &Mamba2Config, device: &B::Device) -> Result<Self, ModelError> {
        Ok(Self { norm: RmsNorm::new(config.d_model, device), mixer: Mamba2Mixer::init(config, device)? })
    }

    /// # Shapes
    /// - `h`: `[batch, L, d_model]`; output: `[batch, L, d_model]`
    pub fn forward(&self, h: Tensor<B, 3>, state: Option<MixerState<B>>) -> Result<(Tensor<B, 3>, MixerState<B>), ModelError> {
        let eps = self.mixer.config().norm_eps;
        let (mixed, state) = self.mixer.forward(self.norm.forward(h.clone(), eps), state)?;
        Ok((h + mixed, state))
    }

    /// # Shapes
    /// - `h`: `[batch, d_model]`; output: `[batch, d_model]`
    pub fn step(&self, h: Tensor<B, 2>, state: MixerState<B>) -> Result<(Tensor<B, 2>, MixerState<B>), ModelError> {
        let eps = self.mixer.config().norm_eps;
        let (mixed, state) = self.mixer.step(self.norm.forward(h.clone(), eps), state)?;
        Ok((h + mixed, state))
    }
}
