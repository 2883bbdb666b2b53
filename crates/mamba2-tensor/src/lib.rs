//! Tensor helpers for Mamba-2, generic over any Burn backend and differentiable through
//! Burn's autodiff.
//!
//! These are the pieces the selective scan and the model are written in:
//!
//! - [`segsum`]: stable segment sums, the log-decay matrix of a chunk;
//! - [`pad_to_multiple`]: zero padding of a sequence to a chunk multiple;
//! - [`rms_norm_gated`]: group-wise RMS norm with an optional SiLU gate, in either order;
//! - [`softplus`] (threshold 20), [`inverse_softplus`], and [`sigmoid`] / [`silu`] in the
//!   tensor's own precision (Burn's default sigmoid rounds through f32);
//! - [`causal_conv1d`]: causal depthwise convolution over time with an optional left context;
//! - [`repeat_interleave`]: groups to heads;
//! - [`linear_rows`]: a `Linear` over every row of a batch as one matrix product;
//! - [`compare`]: reading results back as `f64` and the relative difference used by all tests;
//!   [`from_f64_vec`], its inverse: host values into a tensor of the backend's float type;
//! - [`rng`]: a seeded host-side generator whose draws do not depend on a backend;
//! - [`graph`]: autodiff on several threads of one process without lost gradients (a
//!   recording while a graph is built, an exclusive backward).
//!
//! Shape mistakes are reported as a [`ShapeError`] that carries the offending sizes.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::prelude::*;
//! use mamba2_tensor::{compare::to_f64_vec, segsum};
//!
//! let device = Default::default();
//! let log_decay = Tensor::<NdArray<f64>, 2>::from_data([[-0.5, -1.0, -2.0]], &device);
//! // decay[i, j] = exp(a[j+1] + ... + a[i]) below the diagonal, 0 above it.
//! let decay = to_f64_vec(segsum(log_decay).exp());
//! assert_eq!(decay[3 * 2], (-3.0f64).exp());
//! assert_eq!(decay[1], 0.0);
//! ```

#![forbid(unsafe_code)]

mod activation;
pub mod compare;
mod conv;
mod error;
pub mod graph;
mod host;
mod linear;
mod norm;
mod pad;
mod reduce;
mod repeat;
pub mod rng;
mod segsum;

pub use activation::{inverse_softplus, sigmoid, silu, softplus, SOFTPLUS_THRESHOLD};
pub use conv::causal_conv1d;
pub use error::{expect_divides, expect_positive, expect_shape, ShapeError};
pub use host::from_f64_vec;
pub use linear::linear_rows;
pub use norm::{rms_norm_gated, GateOrder};
pub use pad::pad_to_multiple;
pub use reduce::{ordered_mean, ordered_sum, ORDERED_ABOVE};
pub use repeat::repeat_interleave;
pub use segsum::segsum;

#[cfg(test)]
mod test_util {
    pub type TestBackend = burn::backend::NdArray<f64>;
    pub type TestAutodiff = burn::backend::Autodiff<TestBackend>;
    pub use crate::compare::to_f64_vec as to_vec;

    /// Element-wise closeness with an absolute tolerance, naming the first index that fails.
    pub fn assert_close(got: &[f64], expected: &[f64], tol: f64) {
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!((g - e).abs() <= tol, "index {i}: got {g}, expected {e} (tol {tol})");
        }
    }
}
