//! Every parameter receives a finite, non-zero gradient, and gradients match central finite
//! differences in f64.

use crate::common::*;
use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use mamba2_model::{named_grads, named_params, Mamba2LM, Mamba2TimeSeries};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};

/// Fails naming every parameter whose gradient is missing, non-finite or all zero.
fn assert_every_param_learns<B: AutodiffBackend, M: Module<B>>(what: &str, model: &M, grads: &B::Gradients) {
    let mut bad = Vec::new();
    let all = named_grads(model, grads);
    assert!(!all.is_empty());
    for (path, grad) in all {
        match grad.map(to_f64_vec) {
            None => bad.push(format!("{path}: no gradient")),
            Some(g) if g.iter().any(|v| !v.is_finite()) => bad.push(format!("{path}: non-finite gradient")),
            Some(g) if g.iter().all(|v| *v == 0.0) => bad.push(format!("{path}: all-zero gradient")),
            Some(_) => {}
        }
    }
    assert!(bad.is_empty(), "{what}: parameters that would not train: {bad:#?}");
}

fn time_series_params_all_learn<B: AutodiffBackend>(device: &B::Device) {
    for g in [1, 2] {
        let model: Mamba2TimeSeries<B> = tiny_ts(g).init(device).unwrap();
        let x = wave::<B>(3, 9, 3, device).require_grad();
        let building = mamba2_tensor::graph::recording();
        let (y, _) = model.forward(x.clone(), None).unwrap();
        let target = wave::<B>(3, 9, 2, device).mul_scalar(0.5);
        let loss = (y - target).powi_scalar(2).mean();
        drop(building);
        let grads = mamba2_tensor::graph::backward(loss);
        assert_every_param_learns(&format!("time series, ngroups {g}"), &model, &grads);
        let gx = to_f64_vec(x.grad(&grads).expect("the input is not detached"));
        assert!(gx.iter().all(|v| v.is_finite()) && gx.iter().any(|v| *v != 0.0));
    }
}

fn lm_params_all_learn<B: AutodiffBackend>(device: &B::Device) {
    let model: Mamba2LM<B> = tiny_lm(2).init(device).unwrap();
    let ids = Tensor::<B, 2, Int>::from_data([[1, 5, 7, 2, 9, 10, 3], [4, 4, 0, 8, 6, 1, 2]], device);
    let building = mamba2_tensor::graph::recording();
    let out = model.forward(ids, None).unwrap();
    let w = wave::<B>(2, 7, 11, device);
    let loss = (out.logits * w).sum();
    drop(building);
    let grads = mamba2_tensor::graph::backward(loss);
    assert_every_param_learns("language model", &model, &grads);
}

#[test]
fn every_time_series_parameter_gets_a_gradient_f64() {
    time_series_params_all_learn::<NdF64Grad>(&Default::default());
}

#[test]
fn every_time_series_parameter_gets_a_gradient_f32() {
    time_series_params_all_learn::<FlexF32Grad>(&Default::default());
}

#[test]
fn every_lm_parameter_gets_a_gradient() {
    lm_params_all_learn::<NdF64Grad>(&Default::default());
    lm_params_all_learn::<FlexF32Grad>(&Default::default());
}

#[cfg(feature = "cuda")]
#[test]
fn every_parameter_gets_a_gradient_on_cuda() {
    time_series_params_all_learn::<CudaF32Grad>(&Default::default());
    lm_params_all_learn::<CudaF32Grad>(&Default::default());
}

#[cfg(feature = "wgpu")]
#[test]
fn every_parameter_gets_a_gradient_on_wgpu() {
    time_series_params_all_learn::<WgpuF32Grad>(&Default::default());
    lm_params_all_learn::<WgpuF32Grad>(&Default::default());
}

/// Adds `delta` to entry `index` of the parameter with id `target`.
struct Nudge {
    target: burn::module::ParamId,
    index: usize,
    delta: f64,
}

impl<B: Backend> ModuleMapper<B> for Nudge {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if param.id != self.target {
            return param;
        }
        param.map(|t| {
            let dims = t.dims();
            let mut flat = to_f64_vec(t.clone());
            flat[self.index] += self.delta;
            Tensor::from_data(TensorData::new(flat, dims), &t.device())
        })
    }
}

#[test]
fn gradients_match_finite_differences_for_every_parameter_f64() {
    let device = Default::default();
    // Reproducible when this test runs alone; beside other tests of this binary, which draw from
    // the same process-wide generator, the initial weights vary from run to run.
    NdF64Grad::seed(&device, 5);
    // L 7 with chunk 4: two chunks, one padded; ngroups 2; biases on.
    let model: Mamba2TimeSeries<NdF64Grad> = tiny_ts(2).init(&device).unwrap();
    let x = wave::<NdF64>(2, 7, 3, &device);
    let target = wave::<NdF64>(2, 7, 2, &device).mul_scalar(0.3);
    let loss_of = |m: &Mamba2TimeSeries<NdF64>| -> f64 {
        let (y, state) = m.forward(x.clone(), None).unwrap();
        // The final state is part of the loss so that its gradient path is checked too.
        let s = state.layers.iter().map(|l| l.ssm.clone().sum().into_scalar() * 0.1).sum::<f64>();
        to_f64_vec((y - target.clone()).powi_scalar(2).mean())[0] + s
    };
    let building = mamba2_tensor::graph::recording();
    let (y, state) = model.forward(Tensor::from_inner(x.clone()), None).unwrap();
    let mut loss = (y - Tensor::from_inner(target.clone())).powi_scalar(2).mean();
    for l in &state.layers {
        loss = loss + l.ssm.clone().sum().mul_scalar(0.1);
    }
    drop(building);
    let grads = mamba2_tensor::graph::backward(loss);
    let analytic = named_grads(&model, &grads);
    let inner = model.valid();
    let h = 1e-6;
    // A central difference of an f64 loss carries a rounding error of a few eps * |loss| / h
    // (2.2e-10 |loss| per unit; 1.5e-10 to 2.8e-10 seen here): gradients below ~1e-4 (a_log's can be
    // ~1e-6) would fail a purely relative tolerance on that noise alone. The check allows twenty
    // units of it (4.4e-9 for a loss of order one), far below any gradient it checks.
    let noise = 20.0 * f64::EPSILON * loss_of(&inner).abs().max(1.0) / h;
    let params = named_params(&inner);
    assert_eq!(params.len(), analytic.len());
    for (p, (path, grad)) in params.iter().zip(analytic) {
        assert_eq!(p.path, path);
        let grad = to_f64_vec(grad.expect("gradient present"));
        let n = grad.len();
        let picks: Vec<usize> = if n <= 4 { (0..n).collect() } else { (0..4).map(|j| j * (n - 1) / 3).collect() };
        let mut fd = Vec::new();
        let mut ad = Vec::new();
        for &i in &picks {
            let up = inner.clone().map(&mut Nudge { target: p.id, index: i, delta: h });
            let down = inner.clone().map(&mut Nudge { target: p.id, index: i, delta: -h });
            fd.push((loss_of(&up) - loss_of(&down)) / (2.0 * h));
            ad.push(grad[i]);
        }
        let diff = rel_diff(&ad, &fd);
        let abs = ad.iter().zip(&fd).map(|(a, f)| (a - f).abs()).fold(0.0, f64::max);
        let scale = fd.iter().map(|f| f.abs()).fold(0.0, f64::max);
        println!("{path}: relative difference to finite differences {diff:.2e} (absolute {abs:.1e}) at {picks:?}");
        assert!(
            !diff.is_nan() && abs <= 1e-6 * scale + noise,
            "{path}: gradient off finite differences by {diff:e} relative, {abs:e} absolute \
             (tolerance 1e-6 relative + {noise:.1e}; ad {ad:?}, fd {fd:?})"
        );
    }
}
