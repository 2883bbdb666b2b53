//! chunked = sequential = step by step, on outputs and final states, over lengths around the
//! chunk size, groups, batch sizes, with and without D and an initial state.

use crate::common::*;
use burn::prelude::*;
use mamba2_ssd::{ssd_chunked, ssd_sequential, ssd_step, SsdOutput};
use mamba2_tensor::compare::tensor_rel_diff;

fn step_by_step<B: Backend>(raw: &Raw, device: &B::Device) -> SsdOutput<B> {
    let full = raw.input::<B>(device);
    let [batch, len, h, p] = full.x.dims();
    let n = full.b.dims()[3];
    let mut state = full.initial_state.unwrap_or_else(|| Tensor::zeros([batch, h, p, n], device));
    let mut ys = Vec::with_capacity(len);
    for t in 0..len {
        let out = ssd_step(raw.step_input(t, state, device)).expect("valid step input");
        ys.push(out.y.unsqueeze_dim::<4>(1));
        state = out.state;
    }
    SsdOutput { y: Tensor::cat(ys, 1), final_state: state }
}

/// Runs the whole grid and returns the worst relative difference seen, naming its case.
fn worst_over_grid<B: Backend>(device: &B::Device, chunk_sizes: &[usize]) -> (f64, String) {
    let mut worst = (0.0f64, String::new());
    let mut seed = 0;
    for &q in chunk_sizes {
        for len in [1, 2, q - 1, q, q + 1, 3 * q + 5] {
            if len == 0 {
                continue;
            }
            for g in [1, 2] {
                for batch in [1, 3] {
                    for (d, init) in [
                        (DKind::None, false),
                        (DKind::Head, false),
                        (DKind::Channel, false),
                        (DKind::None, true),
                        (DKind::Head, true),
                        (DKind::Channel, true),
                    ] {
                        seed += 1;
                        let case = Case { batch, len, h: 4, p: 3, g, n: 5, d, init };
                        let raw = Raw::random(case, seed);
                        let chunked = ssd_chunked(raw.input::<B>(device), q).expect("valid input");
                        let reference = ssd_sequential(raw.input::<B>(device)).expect("valid input");
                        let stepped = step_by_step::<B>(&raw, device);
                        let diffs = [
                            tensor_rel_diff(chunked.y.clone(), reference.y.clone()),
                            tensor_rel_diff(chunked.final_state.clone(), reference.final_state.clone()),
                            tensor_rel_diff(stepped.y, reference.y),
                            tensor_rel_diff(stepped.final_state, reference.final_state),
                        ];
                        for diff in diffs {
                            // NaN must fail: compare so that NaN becomes the worst.
                            #[allow(clippy::neg_cmp_op_on_partial_ord)]
                            if !(diff <= worst.0) {
                                worst = (diff, format!("Q {q}, {case:?}"));
                            }
                        }
                    }
                }
            }
        }
    }
    worst
}

#[test]
fn chunked_sequential_and_step_agree_in_f64() {
    let (worst, case) = worst_over_grid::<NdF64>(&Default::default(), &[4, 16, 64]);
    println!("worst relative difference in f64: {worst:e} ({case})");
    assert!(worst <= 1e-12, "relative difference {worst:e} > 1e-12 at {case}");
}

#[test]
fn chunked_sequential_and_step_agree_in_f32_on_flex() {
    let (worst, case) = worst_over_grid::<FlexF32>(&Default::default(), &[4, 16]);
    println!("worst relative difference in f32: {worst:e} ({case})");
    assert!(worst <= 1e-5, "relative difference {worst:e} > 1e-5 at {case}");
}

#[cfg(feature = "cuda")]
#[test]
fn chunked_sequential_and_step_agree_on_cuda() {
    let (worst, case) = worst_over_grid::<CudaF32>(&Default::default(), &[4, 16, 64]);
    println!("worst relative difference on CUDA f32: {worst:e} ({case})");
    assert!(worst <= 1e-5, "relative difference {worst:e} > 1e-5 at {case}");
}

/// One chunk size only: every case's step-by-step run launches its own kernels, and on a software
/// Vulkan device each launch costs milliseconds.
#[cfg(feature = "wgpu")]
#[test]
fn chunked_sequential_and_step_agree_on_wgpu() {
    let (worst, case) = worst_over_grid::<WgpuF32>(&Default::default(), &[4]);
    println!("worst relative difference on Wgpu f32: {worst:e} ({case})");
    assert!(worst <= 1e-5, "relative difference {worst:e} > 1e-5 at {case}");
}
