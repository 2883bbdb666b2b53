//! The Mamba-2 selective scan (SSD), generic over any Burn backend and differentiable through
//! Burn's autodiff with respect to every input, the initial state included.
//!
//! Three entry points compute the same thing:
//!
//! - [`ssd_chunked`]: the chunked state-space-duality algorithm, mostly matrix products; use it
//!   for training and prefill;
//! - [`ssd_sequential`]: the plain recurrence, one step at a time; the reference;
//! - [`ssd_step`]: a single step from a given state, for decoding and streaming.
//!
//! This crate knows nothing about modules, configs or files: it takes tensors and returns
//! tensors. `dt` arrives already positive and `a` already negative; the model computes them.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::prelude::*;
//! use mamba2_ssd::{ssd_chunked, ssd_sequential, SsdInput};
//! use mamba2_tensor::compare::tensor_rel_diff;
//!
//! type B = NdArray<f64>;
//! let device = Default::default();
//! let (batch, len, h, p, g, n) = (2, 10, 4, 3, 2, 5);
//! let x = Tensor::<B, 4>::ones([batch, len, h, p], &device);
//! let dt = Tensor::<B, 3>::full([batch, len, h], 0.1, &device);
//! let a = Tensor::<B, 1>::from_data([-1.0, -2.0, -0.5, -4.0], &device);
//! let b = Tensor::<B, 4>::full([batch, len, g, n], 0.3, &device);
//! let c = Tensor::<B, 4>::full([batch, len, g, n], -0.2, &device);
//! let input = SsdInput::new(x, dt, a, b, c);
//!
//! let fast = ssd_chunked(input.clone(), 4).unwrap(); // 10 is not a multiple of 4: fine
//! let slow = ssd_sequential(input).unwrap();
//! assert!(tensor_rel_diff(fast.y, slow.y) < 1e-12);
//! assert!(tensor_rel_diff(fast.final_state, slow.final_state) < 1e-12);
//! ```

#![forbid(unsafe_code)]

mod chunked;
mod error;
mod input;
mod sequential;
mod step;

pub use chunked::ssd_chunked;
pub use error::SsdError;
pub use input::{Skip, SsdDims, SsdInput, SsdOutput, StepInput, StepOutput};
pub use sequential::ssd_sequential;
pub use step::ssd_step;
