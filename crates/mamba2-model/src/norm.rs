use burn::module::Param;
use burn::prelude::*;
use mamba2_tensor::{rms_norm_gated, GateOrder};

/// RMS norm with a learned per-channel scale, named `weight` as in the checkpoints. Used as the
/// pre-norm of each block, as the final norm, and (grouped and gated) inside the mixer.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// Per-channel scale, `[d]`.
    pub weight: Param<Tensor<B, 1>>,
}

impl<B: Backend> RmsNorm<B> {
    /// A norm of `d` channels with unit scale.
    pub fn new(d: usize, device: &B::Device) -> Self {
        Self { weight: Param::from_tensor(Tensor::ones([d], device)) }
    }

    /// `x / sqrt(mean(x^2) + eps) * weight` over the last axis.
    ///
    /// # Shapes
    /// - `x`: `[..., d]`; output: `[..., d]`
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
        rms_norm_gated(x, None, self.weight.val(), 1, eps).expect("norm width is checked at construction")
    }

    /// Group-wise norm with a SiLU gate `z`, in the given order.
    ///
    /// # Shapes
    /// - `x`, `z`: `[..., d]`; output: `[..., d]`
    pub fn forward_gated<const D: usize>(
        &self,
        x: Tensor<B, D>,
        z: Tensor<B, D>,
        order: GateOrder,
        ngroups: usize,
        eps: f64,
    ) -> Tensor<B, D> {
        rms_norm_gated(x, Some((z, order)), self.weight.val(), ngroups, eps).expect("norm width and groups are checked at construction")
    }
}
