//! Gradients of a scalar loss with respect to every input: chunked against sequential, and
//! chunked against central finite differences.

use crate::common::*;
use burn::tensor::backend::AutodiffBackend;
use mamba2_ssd::{ssd_chunked, ssd_sequential, Skip, SsdError, SsdInput, SsdOutput};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};

type Scan<B> = fn(SsdInput<B>) -> Result<SsdOutput<B>, SsdError>;

/// The loss and the gradient of every present input, by name.
fn loss_and_grads<B: AutodiffBackend>(
    raw: &Raw,
    weights: &LossWeights,
    scan: impl Fn(SsdInput<B>) -> Result<SsdOutput<B>, SsdError>,
    device: &B::Device,
) -> (f64, Vec<(&'static str, Vec<f64>)>) {
    let x = raw.x.tensor::<B, 4>(device).require_grad();
    let dt = raw.dt.tensor::<B, 3>(device).require_grad();
    let a = raw.a.tensor::<B, 1>(device).require_grad();
    let b = raw.b.tensor::<B, 4>(device).require_grad();
    let c = raw.c.tensor::<B, 4>(device).require_grad();
    let d = raw.skip::<B>(device).map(|d| match d {
        Skip::PerHead(t) => Skip::PerHead(t.require_grad()),
        Skip::PerChannel(t) => Skip::PerChannel(t.require_grad()),
    });
    let init = raw.init.as_ref().map(|s| s.tensor::<B, 4>(device).require_grad());
    let input =
        SsdInput { x: x.clone(), dt: dt.clone(), a: a.clone(), b: b.clone(), c: c.clone(), d: d.clone(), initial_state: init.clone() };
    let building = mamba2_tensor::graph::recording();
    let out = scan(input).expect("valid input");
    let loss = weights.loss(out.y, out.final_state, device);
    drop(building);
    let value = to_f64_vec(loss.clone())[0];
    let grads = mamba2_tensor::graph::backward(loss);
    let missing = |name: &str| -> ! { panic!("no gradient reached {name}") };
    let mut out = vec![
        ("x", to_f64_vec(x.grad(&grads).unwrap_or_else(|| missing("x")))),
        ("dt", to_f64_vec(dt.grad(&grads).unwrap_or_else(|| missing("dt")))),
        ("a", to_f64_vec(a.grad(&grads).unwrap_or_else(|| missing("a")))),
        ("b", to_f64_vec(b.grad(&grads).unwrap_or_else(|| missing("b")))),
        ("c", to_f64_vec(c.grad(&grads).unwrap_or_else(|| missing("c")))),
    ];
    match d {
        Some(Skip::PerHead(t)) => out.push(("d", to_f64_vec(t.grad(&grads).unwrap_or_else(|| missing("d"))))),
        Some(Skip::PerChannel(t)) => out.push(("d", to_f64_vec(t.grad(&grads).unwrap_or_else(|| missing("d"))))),
        None => {}
    }
    if let Some(s) = init {
        out.push(("initial_state", to_f64_vec(s.grad(&grads).unwrap_or_else(|| missing("initial_state")))));
    }
    (value, out)
}

const GRAD_CASES: [(Case, usize); 4] = [
    (Case { batch: 2, len: 11, h: 4, p: 3, g: 1, n: 5, d: DKind::Head, init: true }, 4),
    (Case { batch: 1, len: 9, h: 4, p: 2, g: 2, n: 3, d: DKind::Channel, init: true }, 16),
    (Case { batch: 3, len: 16, h: 2, p: 2, g: 2, n: 4, d: DKind::None, init: false }, 4),
    (Case { batch: 1, len: 23, h: 2, p: 3, g: 1, n: 2, d: DKind::Head, init: true }, 5),
];

fn chunked_grads_match_sequential<B: AutodiffBackend>(device: &B::Device, tol: f64) {
    for (i, (case, q)) in GRAD_CASES.into_iter().enumerate() {
        let raw = Raw::random(case, 100 + i as u64);
        let weights = LossWeights::random(case, i as u64);
        let (_, chunked) = loss_and_grads::<B>(&raw, &weights, |inp| ssd_chunked(inp, q), device);
        let (_, reference) = loss_and_grads::<B>(&raw, &weights, ssd_sequential as Scan<B>, device);
        assert_eq!(chunked.len(), reference.len());
        for ((name, got), (_, want)) in chunked.iter().zip(&reference) {
            let diff = rel_diff(got, want);
            println!("case {i} (Q {q}): d loss / d {name}: relative difference {diff:e}");
            assert!(diff <= tol, "case {i} {case:?}: gradient of {name} differs by {diff:e} > {tol:e}");
        }
    }
}

#[test]
fn chunked_gradients_match_sequential_in_f64() {
    chunked_grads_match_sequential::<NdF64Grad>(&Default::default(), 1e-10);
}

#[test]
fn chunked_gradients_match_sequential_in_f32_on_flex() {
    chunked_grads_match_sequential::<FlexF32Grad>(&Default::default(), 1e-4);
}

#[cfg(feature = "cuda")]
#[test]
fn chunked_gradients_match_sequential_on_cuda() {
    chunked_grads_match_sequential::<CudaF32Grad>(&Default::default(), 1e-4);
}

#[cfg(feature = "wgpu")]
#[test]
fn chunked_gradients_match_sequential_on_wgpu() {
    chunked_grads_match_sequential::<WgpuF32Grad>(&Default::default(), 1e-4);
}

/// Central differences `(f(v + h) - f(v - h)) / 2h` on sampled entries of every input.
#[test]
fn chunked_gradients_match_finite_differences_in_f64() {
    let device = Default::default();
    let cases = [
        (Case { batch: 1, len: 5, h: 2, p: 2, g: 1, n: 3, d: DKind::Head, init: true }, 2),
        (Case { batch: 2, len: 7, h: 4, p: 2, g: 2, n: 2, d: DKind::Channel, init: true }, 3),
    ];
    let loss_at = |raw: &Raw, weights: &LossWeights, q: usize| -> f64 {
        let out = ssd_chunked(raw.input::<NdF64>(&device), q).expect("valid input");
        to_f64_vec(weights.loss(out.y, out.final_state, &device))[0]
    };
    let h = 1e-5;
    for (i, (case, q)) in cases.into_iter().enumerate() {
        let raw = Raw::random(case, 500 + i as u64);
        let weights = LossWeights::random(case, 7 + i as u64);
        let (_, analytic) = loss_and_grads::<NdF64Grad>(&raw, &weights, |inp| ssd_chunked(inp, q), &device);
        let mut probe = raw.clone();
        let names: Vec<&'static str> = probe.arrays_mut().into_iter().map(|(n, _)| n).collect();
        for (k, name) in names.iter().enumerate() {
            let len = probe.arrays_mut()[k].1.values.len();
            // Up to 6 entries spread over the array, the first and the last included.
            let picks: Vec<usize> = if len <= 6 { (0..len).collect() } else { (0..6).map(|j| j * (len - 1) / 5).collect() };
            let mut fd = Vec::new();
            let mut ad = Vec::new();
            for &e in &picks {
                let original = probe.arrays_mut()[k].1.values[e];
                probe.arrays_mut()[k].1.values[e] = original + h;
                let up = loss_at(&probe, &weights, q);
                probe.arrays_mut()[k].1.values[e] = original - h;
                let down = loss_at(&probe, &weights, q);
                probe.arrays_mut()[k].1.values[e] = original;
                fd.push((up - down) / (2.0 * h));
                ad.push(analytic[k].1[e]);
            }
            assert_eq!(analytic[k].0, *name);
            let diff = rel_diff(&ad, &fd);
            println!("case {i}: d loss / d {name} at {picks:?}: relative difference to finite differences {diff:e}");
            assert!(diff <= 1e-6, "case {i}: gradient of {name} off finite differences by {diff:e}");
        }
    }
}
