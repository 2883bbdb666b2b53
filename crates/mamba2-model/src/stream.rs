//! A dedicated inference path for tick-by-tick use: [`StreamingStack`] copies a stack's weights
//! into `mamba2-cpu`'s [`Streaming`] form, which advances a preallocated [`StreamingState`] one
//! row at a time, with no tensors, no autodiff and no allocation per step.
//!
//! It computes what [`Mamba2Stack::step`] computes (`tests/streaming.rs` checks the two against
//! each other over many steps); use the stack's own `step` for gradients or for GPU backends.

use burn::prelude::*;
use mamba2_cpu::{BlockParams, LayerWeights, Linear, Streaming, StreamingState};

use crate::bridge::{kernel_dims, HostFloat};
use crate::{Mamba2Config, Mamba2Stack, Mamba2State, MixerState, ModelError};

/// A [`Mamba2Stack`]'s weights on the host, for [`StreamingStack::step`].
#[derive(Debug, Clone)]
pub struct StreamingStack<T: HostFloat> {
    config: Mamba2Config,
    host: Streaming<T>,
}

pub(crate) fn host<B: Backend, T: HostFloat, const D: usize>(t: Tensor<B, D>) -> Vec<T> {
    t.into_data().convert::<T>().into_vec::<T>().expect("converted to the host type")
}

fn linear<B: Backend, T: HostFloat>(l: &burn::nn::Linear<B>) -> Linear<T> {
    let [d_in, d_out] = l.weight.dims();
    Linear::new(host(l.weight.val()), d_in, d_out, l.bias.as_ref().map(|b| host(b.val())))
}

impl<T: HostFloat> StreamingStack<T> {
    /// Copies the stack's weights to the host.
    pub fn new<B: Backend>(stack: &Mamba2Stack<B>) -> Self {
        let config = stack.config().clone();
        let dims = kernel_dims(&config, 1, 1);
        let layers = stack
            .layers
            .iter()
            .map(|block| {
                let m = &block.mixer;
                let params = BlockParams {
                    norm: host(block.norm.weight.val()),
                    in_proj: linear(&m.in_proj),
                    conv_w: host(m.conv1d.weight.val().reshape([config.conv_dim(), config.d_conv])),
                    conv_b: m.conv1d.bias.as_ref().map(|b| host(b.val())),
                    dt_bias: host(m.dt_bias.val()),
                    a_log: host(m.a_log.val()),
                    d: host(m.d.val()),
                    gated_norm: host(m.norm.weight.val()),
                    out_proj: linear(&m.out_proj),
                };
                LayerWeights::new(&dims, params)
            })
            .collect();
        Self { host: Streaming::new(dims, layers, host(stack.norm_f.weight.val())), config }
    }

    /// The same stack with its projections' weights stored in bf16 and widened to `T` as each
    /// step reads them (f32 or f64 arithmetic throughout): about half the bytes a step reads
    /// in f32, for steps bound by memory (large stacks, text decoding). Outputs move by the
    /// weights' rounding (bf16 keeps 8 bits of mantissa); a checkpoint stored in bf16 loses
    /// nothing.
    pub fn with_bf16_weights(self) -> Self {
        Self { host: self.host.into_bf16(), config: self.config }
    }

    /// The config of the copied stack.
    pub fn config(&self) -> &Mamba2Config {
        &self.config
    }

    /// A zero state for `batch` streams (with a helper thread where the weights outgrow a
    /// core's cache, see [`StreamingState::with_helper`]).
    pub fn zero_state(&self, batch: usize) -> StreamingState<T> {
        self.host.zero_state(batch)
    }

    /// The state of a tensor model (after a prefill with `forward`, say), copied to the host.
    ///
    /// # Errors
    /// [`ModelError::State`] when the state's layers or shapes do not fit this stack.
    pub fn state_from<B: Backend>(&self, state: &Mamba2State<B>) -> Result<StreamingState<T>, ModelError> {
        if state.layers.len() != self.host.n_layer() {
            return Err(ModelError::State { why: format!("state has {} layers, the model {}", state.layers.len(), self.host.n_layer()) });
        }
        let mut out = self.zero_state(state.batch());
        for (i, MixerState { conv, ssm }) in state.layers.iter().enumerate() {
            let (conv, ssm): (Vec<T>, Vec<T>) = (host(conv.clone()), host(ssm.clone()));
            if conv.len() != out.conv(i).len() || ssm.len() != out.ssm(i).len() {
                return Err(ModelError::State { why: format!("layer {i}'s state does not fit the model's sizes") });
            }
            out.conv_mut(i).copy_from_slice(&conv);
            out.ssm_mut(i).copy_from_slice(&ssm);
        }
        Ok(out)
    }

    /// The state as tensors, to continue with the tensor model.
    pub fn state_to<B: Backend>(&self, state: &StreamingState<T>, device: &B::Device) -> Mamba2State<B> {
        let c = &self.config;
        let b = state.batch();
        let layers = (0..self.host.n_layer())
            .map(|i| MixerState {
                conv: Tensor::from_data(TensorData::new(state.conv(i).to_vec(), [b, c.d_conv - 1, c.conv_dim()]), device),
                ssm: Tensor::from_data(TensorData::new(state.ssm(i).to_vec(), [b, c.nheads(), c.headdim, c.d_state]), device),
            })
            .collect();
        Mamba2State { layers }
    }

    /// One step: `u` is one row per stream (`[batch, d_model]`, row-major), `out` receives the
    /// stack's output for it (after the final norm), and `state` advances.
    ///
    /// # Errors
    /// [`ModelError::State`] when the slices do not have `batch * d_model` entries.
    pub fn step(&self, state: &mut StreamingState<T>, u: &[T], out: &mut [T]) -> Result<(), ModelError> {
        self.host.step(state, u, out).map_err(|e| ModelError::State { why: e.to_string() })
    }
}
