#![allow(dead_code)]

use std::path::PathBuf;

use burn::prelude::*;
use mamba2_model::{LmConfig, Mamba2Config, TimeSeriesConfig};
use mamba2_tensor::rng::SplitMix64;
use safetensors::SafeTensors;

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

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

/// Reads one tensor of a safetensors file as f64 (from f32, f64 or i64) with its shape.
pub fn read_tensor(bytes: &[u8], key: &str) -> (Vec<f64>, Vec<usize>) {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let view = st.tensor(key).unwrap_or_else(|_| panic!("fixture lacks {key}"));
    let d = view.data();
    let values = match view.dtype() {
        safetensors::Dtype::F32 => d.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).collect(),
        safetensors::Dtype::F64 => d.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect(),
        safetensors::Dtype::I64 => d.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64).collect(),
        other => panic!("unexpected dtype {other:?} for {key}"),
    };
    (values, view.shape().to_vec())
}

/// A tiny config that still has several heads, two groups, a chunk shorter than the tests'
/// sequences, and every optional parameter switched on.
pub fn tiny_config(ngroups: usize) -> Mamba2Config {
    Mamba2Config::new(8, 2).with_d_state(4).with_headdim(4).with_ngroups(ngroups).with_chunk_size(4).with_bias(true)
}

pub fn tiny_ts(ngroups: usize) -> TimeSeriesConfig {
    TimeSeriesConfig::new(tiny_config(ngroups), 3, 2)
}

pub fn tiny_lm(ngroups: usize) -> LmConfig {
    LmConfig::new(tiny_config(ngroups), 11)
}

/// Standard normal values from a generator of the caller's own ([`SplitMix64`]), seeded by
/// `seed`. The backends' generators are process-wide, and every test in this binary runs in the
/// same process, in parallel: a test that seeds one and then draws twice, expecting the same
/// values, could see another test's draw in between.
pub fn normal_values(len: usize, seed: u64) -> Vec<f64> {
    SplitMix64::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x9E37_79B9_7F4A_7C15).normal_vec(len)
}

/// A tensor of standard normal values from [`normal_values`].
pub fn normal<B: Backend, const D: usize>(shape: [usize; D], seed: u64, device: &B::Device) -> Tensor<B, D> {
    let values = normal_values(shape.iter().product(), seed);
    Tensor::from_data(TensorData::new(values, shape).convert::<B::FloatElem>(), device)
}

/// A deterministic input that is not constant over time or features.
pub fn wave<B: Backend>(batch: usize, len: usize, features: usize, device: &B::Device) -> Tensor<B, 3> {
    let values: Vec<f64> = (0..batch * len * features)
        .map(|i| {
            let (b, rest) = (i / (len * features), i % (len * features));
            let (t, f) = (rest / features, rest % features);
            ((t as f64) * 0.37 + (f as f64) * 1.3 + (b as f64) * 0.71).sin() + 0.1 * (f as f64)
        })
        .collect();
    Tensor::from_data(TensorData::new(values, [batch, len, features]).convert::<B::FloatElem>(), device)
}
