//! Inputs built from plain `f64` vectors, so that the same numbers reach every backend and a
//! finite-difference check can move one entry at a time.
#![allow(dead_code)]

use burn::prelude::*;
use mamba2_ssd::{Skip, SsdInput, StepInput};

pub type NdF64 = burn::backend::NdArray<f64>;
pub type NdF64Grad = burn::backend::Autodiff<NdF64>;
pub type FlexF32 = burn::backend::Flex;
pub type FlexF32Grad = burn::backend::Autodiff<FlexF32>;
#[cfg(feature = "cuda")]
pub type CudaF32 = burn::backend::Cuda;
#[cfg(feature = "cuda")]
pub type CudaF32Grad = burn::backend::Autodiff<CudaF32>;
/// CubeCL through WebGPU; on a machine without a GPU, Mesa's lavapipe (software Vulkan) runs it.
#[cfg(feature = "wgpu")]
pub type WgpuF32 = burn_wgpu::Wgpu;
#[cfg(feature = "wgpu")]
pub type WgpuF32Grad = burn::backend::Autodiff<WgpuF32>;

/// A tiny, fixed generator, so that fixtures in tests never depend on a backend's RNG.
pub use mamba2_tensor::rng::SplitMix64 as Rng;

/// A host-side array: values and shape.
#[derive(Debug, Clone)]
pub struct Array {
    pub values: Vec<f64>,
    pub shape: Vec<usize>,
}

impl Array {
    pub fn random(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Self {
        Self { values: rng.uniform_vec(shape.iter().product(), lo, hi), shape: shape.to_vec() }
    }

    pub fn tensor<B: Backend, const D: usize>(&self, device: &B::Device) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(self.values.clone(), self.shape.clone()), device)
    }
}

/// How the skip connection is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DKind {
    None,
    Head,
    Channel,
}

/// The sizes of one test case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub batch: usize,
    pub len: usize,
    pub h: usize,
    pub p: usize,
    pub g: usize,
    pub n: usize,
    pub d: DKind,
    pub init: bool,
}

/// The raw inputs of one scan. `dt` is drawn positive and `a` negative, as the model makes them.
#[derive(Debug, Clone)]
pub struct Raw {
    pub x: Array,
    pub dt: Array,
    pub a: Array,
    pub b: Array,
    pub c: Array,
    pub d: Option<Array>,
    pub init: Option<Array>,
}

/// The names of the inputs, in the order `Raw::arrays_mut` yields them.
pub const INPUT_NAMES: [&str; 7] = ["x", "dt", "a", "b", "c", "d", "initial_state"];

impl Raw {
    pub fn random(case: Case, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let Case { batch, len, h, p, g, n, d, init } = case;
        Self {
            x: Array::random(&mut rng, &[batch, len, h, p], -1.0, 1.0),
            dt: Array::random(&mut rng, &[batch, len, h], 0.01, 0.5),
            a: Array::random(&mut rng, &[h], -2.0, -0.25),
            b: Array::random(&mut rng, &[batch, len, g, n], -1.0, 1.0),
            c: Array::random(&mut rng, &[batch, len, g, n], -1.0, 1.0),
            d: match d {
                DKind::None => None,
                DKind::Head => Some(Array::random(&mut rng, &[h], -1.0, 1.0)),
                DKind::Channel => Some(Array::random(&mut rng, &[h, p], -1.0, 1.0)),
            },
            init: init.then(|| Array::random(&mut rng, &[batch, h, p, n], -1.0, 1.0)),
        }
    }

    /// Every input that is present, with its name.
    pub fn arrays_mut(&mut self) -> Vec<(&'static str, &mut Array)> {
        let mut out: Vec<(&'static str, &mut Array)> =
            vec![("x", &mut self.x), ("dt", &mut self.dt), ("a", &mut self.a), ("b", &mut self.b), ("c", &mut self.c)];
        if let Some(d) = self.d.as_mut() {
            out.push(("d", d));
        }
        if let Some(s) = self.init.as_mut() {
            out.push(("initial_state", s));
        }
        out
    }

    pub fn skip<B: Backend>(&self, device: &B::Device) -> Option<Skip<B>> {
        self.d.as_ref().map(|d| match d.shape.len() {
            1 => Skip::PerHead(d.tensor(device)),
            _ => Skip::PerChannel(d.tensor(device)),
        })
    }

    pub fn input<B: Backend>(&self, device: &B::Device) -> SsdInput<B> {
        SsdInput {
            x: self.x.tensor(device),
            dt: self.dt.tensor(device),
            a: self.a.tensor(device),
            b: self.b.tensor(device),
            c: self.c.tensor(device),
            d: self.skip(device),
            initial_state: self.init.as_ref().map(|s| s.tensor(device)),
        }
    }

    /// The step inputs at time `t`, continuing from `state`.
    pub fn step_input<B: Backend>(&self, t: usize, state: Tensor<B, 4>, device: &B::Device) -> StepInput<B> {
        let full = self.input::<B>(device);
        let [batch, _, h, p] = full.x.dims();
        let [_, _, g, n] = full.b.dims();
        StepInput {
            x: full.x.narrow(1, t, 1).reshape([batch, h, p]),
            dt: full.dt.narrow(1, t, 1).reshape([batch, h]),
            a: full.a,
            b: full.b.narrow(1, t, 1).reshape([batch, g, n]),
            c: full.c.narrow(1, t, 1).reshape([batch, g, n]),
            d: full.d,
            state,
        }
    }
}

/// Fixed random weights for the scalar loss `sum(y * w_y) + sum(final * w_state)`: a loss with
/// a different weight on every output entry, so that no gradient is trivially symmetric.
pub struct LossWeights {
    pub w_y: Array,
    pub w_state: Array,
}

impl LossWeights {
    pub fn random(case: Case, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0xABCD);
        Self {
            w_y: Array::random(&mut rng, &[case.batch, case.len, case.h, case.p], -1.0, 1.0),
            w_state: Array::random(&mut rng, &[case.batch, case.h, case.p, case.n], -1.0, 1.0),
        }
    }

    pub fn loss<B: Backend>(&self, y: Tensor<B, 4>, state: Tensor<B, 4>, device: &B::Device) -> Tensor<B, 1> {
        (y * self.w_y.tensor::<B, 4>(device)).sum() + (state * self.w_state.tensor::<B, 4>(device)).sum()
    }
}
