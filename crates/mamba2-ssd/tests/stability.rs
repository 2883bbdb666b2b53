//! Long sequences in f32 with strong and with vanishing decay: finite outputs and gradients,
//! padded positions included.

use crate::common::*;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use mamba2_ssd::{ssd_chunked, Skip, SsdInput};
use mamba2_tensor::compare::to_f64_vec;

/// Head 0 decays by `a * dt` down to -50 per step; head 1 by about -1e-7 (the state integrates
/// its whole history); `len` is not a multiple of the chunk, so padding is exercised.
fn long_sequence_is_finite<B: AutodiffBackend>(device: &B::Device, len: usize, chunk_size: usize) {
    let (h, p, g, n) = (2, 4, 1, 4);
    let mut rng = Rng::new(42);
    let x = Array::random(&mut rng, &[1, len, h, p], -1.0, 1.0);
    let dt = Array { values: (0..len).flat_map(|_| [rng.uniform(0.5, 1.0), rng.uniform(1e-4, 1e-3)]).collect(), shape: vec![1, len, h] };
    let a = Array { values: vec![-50.0, -1e-4], shape: vec![h] };
    let b = Array::random(&mut rng, &[1, len, g, n], -1.0, 1.0);
    let c = Array::random(&mut rng, &[1, len, g, n], -1.0, 1.0);
    let leaf4 = |arr: &Array| arr.tensor::<B, 4>(device).require_grad();
    let (xt, bt, ct) = (leaf4(&x), leaf4(&b), leaf4(&c));
    let dtt = dt.tensor::<B, 3>(device).require_grad();
    let at = a.tensor::<B, 1>(device).require_grad();
    let dd = Tensor::<B, 1>::ones([h], device).require_grad();
    let init = Tensor::<B, 4>::ones([1, h, p, n], device).require_grad();
    let input = SsdInput::new(xt.clone(), dtt.clone(), at.clone(), bt.clone(), ct.clone())
        .with_d(Skip::PerHead(dd.clone()))
        .with_initial_state(init.clone());
    let building = mamba2_tensor::graph::recording();
    let out = ssd_chunked(input, chunk_size).expect("valid input");
    drop(building);
    let y = to_f64_vec(out.y.clone());
    let state = to_f64_vec(out.final_state.clone());
    assert!(y.iter().all(|v| v.is_finite()), "non-finite output");
    assert!(state.iter().all(|v| v.is_finite()), "non-finite final state");
    let loss = {
        let _building = mamba2_tensor::graph::recording();
        out.y.powi_scalar(2).mean() + out.final_state.sum()
    };
    let grads = mamba2_tensor::graph::backward(loss);
    let checks: Vec<(&str, Vec<f64>)> = vec![
        ("x", to_f64_vec(xt.grad(&grads).unwrap())),
        ("dt", to_f64_vec(dtt.grad(&grads).unwrap())),
        ("a", to_f64_vec(at.grad(&grads).unwrap())),
        ("b", to_f64_vec(bt.grad(&grads).unwrap())),
        ("c", to_f64_vec(ct.grad(&grads).unwrap())),
        ("d", to_f64_vec(dd.grad(&grads).unwrap())),
        ("initial_state", to_f64_vec(init.grad(&grads).unwrap())),
    ];
    for (name, g) in checks {
        let bad = g.iter().position(|v| !v.is_finite());
        assert!(bad.is_none(), "gradient of {name} is non-finite at {bad:?} (L {len}, Q {chunk_size})");
    }
}

#[test]
fn length_100k_in_f32_is_finite_forward_and_backward() {
    for q in [64, 256] {
        long_sequence_is_finite::<FlexF32Grad>(&Default::default(), 100_000, q);
    }
}

#[test]
fn tiny_remainders_after_padding_are_finite() {
    // One real step in a chunk of 64: 63 padded positions.
    for len in [1, 65, 129] {
        long_sequence_is_finite::<FlexF32Grad>(&Default::default(), len, 64);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn length_100k_on_cuda_is_finite_forward_and_backward() {
    long_sequence_is_finite::<CudaF32Grad>(&Default::default(), 100_000, 256);
}
