use burn::prelude::*;

use crate::Mamba2Config;

/// The recurrent state of one mixer: what it needs to continue a sequence where it stopped.
///
/// It is an ordinary value: gradients flow through it into the call that produced it (truncated
/// backpropagation through time cuts them with [`detach`](Self::detach)), and it is sized by the
/// batch it was made for, not by the model.
///
/// # Shapes
/// - `conv`: `[batch, d_conv - 1, conv_dim]`, the last `d_conv - 1` pre-convolution `xBC`
///   rows, oldest first (zeros before the sequence started)
/// - `ssm`: `[batch, nheads, headdim, d_state]`
#[derive(Debug, Clone)]
pub struct MixerState<B: Backend> {
    /// The convolution tail.
    pub conv: Tensor<B, 3>,
    /// The SSM state.
    pub ssm: Tensor<B, 4>,
}

impl<B: Backend> MixerState<B> {
    /// The state before any input: zeros.
    pub fn zeros(config: &Mamba2Config, batch: usize, device: &B::Device) -> Self {
        Self {
            conv: Tensor::zeros([batch, config.d_conv - 1, config.conv_dim()], device),
            ssm: Tensor::zeros([batch, config.nheads(), config.headdim, config.d_state], device),
        }
    }

    /// The same values, cut from the autodiff graph.
    pub fn detach(self) -> Self {
        Self { conv: self.conv.detach(), ssm: self.ssm.detach() }
    }

    /// The batch size this state was made for.
    pub fn batch(&self) -> usize {
        self.ssm.dims()[0]
    }
}

/// The recurrent state of a whole stack: one [`MixerState`] per layer.
#[derive(Debug, Clone)]
pub struct Mamba2State<B: Backend> {
    /// One state per layer, first layer first.
    pub layers: Vec<MixerState<B>>,
}

impl<B: Backend> Mamba2State<B> {
    /// Zeros for every layer.
    pub fn zeros(config: &Mamba2Config, batch: usize, device: &B::Device) -> Self {
        Self { layers: (0..config.n_layer).map(|_| MixerState::zeros(config, batch, device)).collect() }
    }

    /// The same values, cut from the autodiff graph (truncated BPTT).
    pub fn detach(self) -> Self {
        Self { layers: self.layers.into_iter().map(MixerState::detach).collect() }
    }

    /// The batch size this state was made for.
    pub fn batch(&self) -> usize {
        self.layers.first().map_or(0, MixerState::batch)
    }
}
