//! The Mamba-2 model: mixer, block, stack, a time-series head and a language-model head, generic
//! over any Burn backend, with the recurrent state as an ordinary, differentiable value.
//!
//! - [`Mamba2Config`]: the reference hyper-parameters; derived sizes are methods.
//! - [`Mamba2Mixer`], [`Mamba2Block`], [`Mamba2Stack`]: the layers, exactly per the recipe.
//! - [`Mamba2TimeSeries`]: `[batch, L, features] -> [batch, L, outputs]`, for forecasting.
//! - [`Mamba2LM`]: embedding, stack and a head tied to the embedding or of its own; logits from
//!   token ids or from embeddings, with or without a state; greedy generation.
//! - [`StreamingLm`] and [`Sampler`]: text generation on the host streaming path, greedy or
//!   sampled (temperature, top-k, top-p) from a seed.
//! - [`Mamba2State`]: what a model needs to continue a sequence; `forward(x, Some(state))`
//!   continues exactly where an earlier call stopped, and `step` advances one row at a time.
//! - [`load_hf_lm`]: HF-format checkpoints (HF's or mamba_ssm's `config.json`, one file or
//!   shards, f32/bf16/f16 weights read one tensor at a time); [`save_checkpoint`] /
//!   [`load_checkpoint`]: ours (weights, config and metadata in one atomically written file).
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::prelude::*;
//! use mamba2_model::{Mamba2Config, TimeSeriesConfig};
//! use mamba2_tensor::compare::tensor_rel_diff;
//!
//! type B = NdArray<f64>;
//! let device = Default::default();
//! let backbone = Mamba2Config::new(16, 2).with_d_state(8).with_headdim(8).with_chunk_size(4);
//! let model = TimeSeriesConfig::new(backbone, 3, 1).init::<B>(&device).unwrap();
//! let x = Tensor::<B, 3>::ones([2, 10, 3], &device);
//!
//! // One call over 10 rows equals 6 rows then 4 rows from the returned state.
//! let (whole, _) = model.forward(x.clone(), None).unwrap();
//! let (first, state) = model.forward(x.clone().narrow(1, 0, 6), None).unwrap();
//! let (rest, _) = model.forward(x.narrow(1, 6, 4), Some(state)).unwrap();
//! assert!(tensor_rel_diff(Tensor::cat(vec![first, rest], 1), whole) < 1e-12);
//! ```

// The host kernels' `unsafe` lives in `mamba2-cpu`; none is needed here.
#![forbid(unsafe_code)]

mod block;
mod bridge;
mod checkpoint;
mod config;
mod decode;
mod error;
mod hf;
mod host_op;
mod linear;
mod lm;
mod mixer;
mod norm;
mod params;
mod sampling;
mod stack;
mod state;
mod stream;
mod timeseries;

pub use block::Mamba2Block;
pub use bridge::{is_cpu_backend, with_generic_path, HostFloat};
pub use checkpoint::{
    fnv1a64_continue, load_checkpoint, read_checkpoint_header, remove_temporaries, remove_temporaries_of, save_checkpoint,
    transfer_weights, write_atomically, Loaded, FNV1A64_START,
};
pub use config::{ConfigError, HfExtras, Mamba2Config};
pub use decode::{LmState, StreamingLm};
pub use error::ModelError;
pub use hf::{lm_from_hf_bytes, load_hf_lm};
pub use host_op::{host_op, runs_on_host, HostOp};
pub use linear::linear_rows;
pub use lm::{LmConfig, LmOutput, Mamba2LM};
pub use mamba2_cpu::catch_panic;
pub use mamba2_cpu::{Picks, StreamingState, HELPER_ABOVE_BYTES};
pub use mixer::{DepthwiseConv, Mamba2Mixer, MAX_PIECE};
pub use norm::RmsNorm;
pub use params::{hf_name, named_grads, named_params, NamedParam};
pub use sampling::{Sampler, Sampling, SamplingError};
pub use stack::Mamba2Stack;
pub use state::{Mamba2State, MixerState};
pub use stream::StreamingStack;
pub use timeseries::{Mamba2TimeSeries, TimeSeriesConfig};
