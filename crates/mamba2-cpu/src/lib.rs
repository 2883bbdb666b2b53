//! The Mamba-2 layer on the host: forward and backward of a whole block (RMS norm, `in_proj`,
//! causal convolution, selective scan, gated norm, `out_proj`, residual) over row-major slices in
//! `f32` or `f64`, and the streaming step that advances a stack one row at a time. It knows
//! nothing about tensors or autodiff: `mamba2-model`'s bridge moves Burn tensors in and out and
//! registers the backward with Burn, and the model's generic tensor path stays the reference that
//! both are tested against.
//!
//! - [`layer::forward`] / [`layer::backward`]: one layer given a [`LayerPlan`] of slices (its
//!   input, optional state and weights); the output is packed `[y | final state | conv tail]`.
//! - [`Streaming`] and [`StreamingState`]: the per-row step, with no allocation per step.
//! - [`Dims`]: the sizes, and the layout of a mixer's columns that every pass reads through.
//! - [`linear`]: a linear layer over the rows of a batch and its gradients, its weight's
//!   gradient summed in shares of the rows on the thread pool.
//! - [`readout`]: a forecaster's linear heads and training loss over the scored rows, and their
//!   gradients, in one pass (the forecaster in `mamba2-train` calls it).
//!
//! The hot loops have a plain body and copies compiled for AVX2 and AVX-512, chosen at run time;
//! the scan's step and the streaming products also have hand-written AVX-512 versions
//! (`avx512.rs`), and the sigmoid an AVX2 one for CPUs without AVX-512 (`avx2.rs`), tested
//! against the plain loops directly.
//!
//! ```
//! use mamba2_cpu::{layer, Dims, LayerPlan};
//!
//! let dims = Dims {
//!     batch: 1, len: 6, d_model: 4, nheads: 2, headdim: 2, ngroups: 1, d_state: 4, d_conv: 4,
//!     d_per_channel: false, dt_lo: 0.0, dt_hi: f64::INFINITY, gate_first: true, eps: 1e-5,
//! };
//! let wave = |n: usize, f: f64| (0..n).map(|i| (i as f64 * f).sin() * 0.5).collect::<Vec<f64>>();
//! let (u, in_w, conv_w) = (wave(6 * 4, 0.7), wave(4 * dims.width(), 0.3), wave(dims.conv_dim() * 4, 0.9));
//! let (dt_bias, a_log, d, norm_w, out_w) = (wave(2, 1.1), vec![0.5; 2], vec![1.0; 2], vec![1.0; 4], wave(4 * 4, 0.5));
//! let plan = |dims: Dims, u: &[f64], state: Option<(&[f64], &[f64])>| {
//!     let (y, _) = layer::forward(&LayerPlan {
//!         dims, u, in_w: &in_w, in_b: None, tail: state.map(|s| s.0), h0: state.map(|s| s.1),
//!         conv_w: &conv_w, conv_b: None, dt_bias: &dt_bias, a_log: &a_log, d: &d, norm_w: &norm_w,
//!         out_w: &out_w, out_b: None, pre_w: None, post_w: None, picks: None,
//!     }, false);
//!     y
//! };
//! // Six rows at once equal four rows, then two rows from the state the first call handed on.
//! let whole = plan(dims, &u, None);
//! let first = plan(Dims { len: 4, ..dims }, &u[..16], None);
//! let [ny, ns, _] = layer::packed_parts(&Dims { len: 4, ..dims }, None);
//! let (h0, tail) = (&first[ny..ny + ns], &first[ny + ns..]);
//! let rest = plan(Dims { len: 2, ..dims }, &u[16..], Some((tail, h0)));
//! for (a, b) in whole[..24].iter().zip(first[..16].iter().chain(&rest[..8])) {
//!     assert!((a - b).abs() < 1e-12);
//! }
//! ```

#![warn(missing_docs)]
// Every `unsafe` block states why it is sound, and clippy holds it to that.
#![warn(clippy::undocumented_unsafe_blocks)]

mod avx2;
mod avx512;
mod backward;
mod buffers;
mod conv;
mod core_data;
mod float;
mod forward;
mod guard;
mod helper;
pub mod layer;
mod layout;
pub mod linear;
mod matmul;
mod norm;
pub mod readout;
mod scan;
pub mod streaming;
#[cfg(all(test, target_arch = "x86_64"))]
mod vector_tests;

pub use float::HostFloat;
pub use guard::catch_panic;
pub use layer::{LayerGrads, LayerPlan, LayerSaved};
pub use layout::{Dims, Picks};
pub use streaming::{BlockParams, LayerWeights, Linear, StepSizeError, Streaming, StreamingState, HELPER_ABOVE_BYTES};
