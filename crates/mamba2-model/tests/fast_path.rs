//! The CPU kernel (the default on Flex and NdArray) against the generic tensor-op path
//! (`with_generic_path`): same outputs, same final state, same gradient for every parameter, the
//! input and both parts of the incoming state, over the config switches the kernel branches on;
//! for the mixer alone, inside its block (pre-norm and residual), as a one-layer stack (the
//! block and the final norm), which the kernel fuses, and as a two-layer stack whose output is
//! wanted at every third row alone (`forward_picked`: the kernel picks the rows inside its last
//! block, the generic path selects them from the whole output).

use crate::common::{normal, FlexF32Grad, NdF64Grad};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Distribution;
use mamba2_model::{
    named_grads, with_generic_path, Mamba2Block, Mamba2Config, Mamba2Mixer, Mamba2Stack, Mamba2State, MixerState, ModelError, Picks,
};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};

struct Case {
    name: &'static str,
    config: Mamba2Config,
    batch: usize,
    len: usize,
    with_state: bool,
    /// Whether the input is tracked: when not, the kernel skips the input's gradient (and, with
    /// the block's norm, takes the norm weight's gradient another way).
    track_u: bool,
}

fn cases() -> Vec<Case> {
    let base = || Mamba2Config::new(16, 1).with_d_state(8).with_headdim(8).with_chunk_size(16);
    let mut out = Vec::new();
    for (name, config) in [
        ("G1", base()),
        ("G2 bias", base().with_ngroups(2).with_bias(true)),
        ("D per channel, norm first", base().with_d_has_hdim(true).with_norm_before_gate(true)),
        ("dt limit, no conv bias", base().with_dt_limit_lo(0.01).with_dt_limit_hi(Some(0.05)).with_conv_bias(false)),
        // d_state 16, 48 and 80 take the AVX-512 loops for f32 as well (d_state 8 only for f64).
        // The reverse step walks d_state in blocks of up to 4 vectors, compiled per block size:
        // 16 is 1 vector of f32 (2 of f64), 48 is 3 (4 + 2), 80 is 4 + 1 (4 + 4 + 2).
        ("d_state 16", base().with_d_state(16)),
        ("d_state 48", base().with_d_state(48)),
        ("d_state 80, G2", base().with_d_state(80).with_headdim(4).with_ngroups(2)),
        // headdim 16 (8 for f64 above) takes the scan's grouped sums of 16 rows in f32.
        ("headdim 16, d_state 16", base().with_d_state(16).with_headdim(16)),
    ] {
        // 70 and 131 cross the kernel's 64-step segments (full, then partial).
        for (batch, len, with_state, track_u) in [(1, 1, false, true), (2, 5, true, false), (3, 70, false, true), (2, 131, true, false)] {
            out.push(Case { name, config: config.clone(), batch, len, with_state, track_u });
        }
    }
    out
}

/// What runs: a mixer, or a block (the mixer with the norm in front and the residual around).
enum Unit<B: Backend> {
    Mixer(Mamba2Mixer<B>),
    Block(Mamba2Block<B>),
    /// One layer, so that the state is that of one mixer.
    Stack(Mamba2Stack<B>),
    /// Two layers, each starting from the one mixer state given; the output at every third row
    /// (the last one last) and the second layer's state.
    Picked(Mamba2Stack<B>),
}

impl<B: AutodiffBackend> Unit<B> {
    fn forward(&self, u: Tensor<B, 3>, state: Option<MixerState<B>>) -> (Tensor<B, 3>, MixerState<B>) {
        match self {
            Unit::Mixer(m) => m.forward(u, state).unwrap(),
            Unit::Block(b) => b.forward(u, state).unwrap(),
            Unit::Stack(s) => {
                let (y, mut next) = s.forward(u, state.map(|m| Mamba2State { layers: vec![m] })).unwrap();
                (y, next.layers.remove(0))
            }
            Unit::Picked(s) => {
                let picks = Picks { n: u.dims()[1].div_ceil(3), every: 3 };
                let state = state.map(|m| Mamba2State { layers: vec![m.clone(), m] });
                let (y, mut next) = s.forward_picked(u, state, picks).unwrap();
                assert_eq!(y.dims()[1], picks.n);
                (y, next.layers.remove(1))
            }
        }
    }
    fn grads(&self, grads: &B::Gradients) -> Vec<(String, Option<Tensor<B::InnerBackend, 1>>)> {
        match self {
            Unit::Mixer(m) => named_grads(m, grads),
            Unit::Block(b) => named_grads(b, grads),
            Unit::Stack(s) | Unit::Picked(s) => named_grads(s, grads),
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Unit::Mixer(_) => "mixer",
            Unit::Block(_) => "block",
            Unit::Stack(_) => "stack",
            Unit::Picked(_) => "picked stack",
        }
    }
}

/// Output, final state (ssm and conv) and every gradient of one forward and backward.
fn run<B: AutodiffBackend>(unit: &Unit<B>, case: &Case, seed: u64) -> Vec<(String, Vec<f64>)> {
    let device = Default::default();
    let c = &case.config;
    let u = normal::<B, 3>([case.batch, case.len, c.d_model], seed, &device);
    let u = if case.track_u { u.require_grad() } else { u };
    let state = case.with_state.then(|| MixerState {
        conv: normal::<B, 3>([case.batch, c.d_conv - 1, c.conv_dim()], seed + 1, &device).require_grad(),
        ssm: normal::<B, 4>([case.batch, c.nheads(), c.headdim, c.d_state], seed + 2, &device).require_grad(),
    });
    // Random weights on every output make each gradient path carry a distinct signal.
    let building = mamba2_tensor::graph::recording();
    let (y, next) = unit.forward(u.clone(), state.clone());
    let wy = normal::<B, 3>(y.dims(), seed + 3, &device);
    let ws = normal::<B, 4>(next.ssm.dims(), seed + 4, &device);
    let wc = normal::<B, 3>(next.conv.dims(), seed + 5, &device);
    let loss = (y.clone() * wy).sum() + (next.ssm.clone() * ws).sum() + (next.conv.clone() * wc).sum();
    drop(building);
    let grads = mamba2_tensor::graph::backward(loss);
    let mut out = vec![
        ("y".to_string(), to_f64_vec(y)),
        ("final ssm".to_string(), to_f64_vec(next.ssm)),
        ("final conv".to_string(), to_f64_vec(next.conv)),
    ];
    match u.grad(&grads) {
        Some(g) => out.push(("grad u".to_string(), to_f64_vec(g))),
        None => assert!(!case.track_u, "u is tracked but got no gradient"),
    }
    if let Some(s) = state {
        out.push(("grad conv state".to_string(), to_f64_vec(s.conv.grad(&grads).expect("tracked"))));
        out.push(("grad ssm state".to_string(), to_f64_vec(s.ssm.grad(&grads).expect("tracked"))));
    }
    for (path, g) in unit.grads(&grads) {
        out.push((format!("grad {path}"), to_f64_vec(g.unwrap_or_else(|| panic!("{path} got no gradient")))));
    }
    out
}

fn compare<B: AutodiffBackend>(tolerance: f64) -> f64 {
    let device = Default::default();
    let mut worst = 0.0f64;
    for (i, case) in cases().iter().enumerate() {
        B::seed(&device, 100 + i as u64);
        let mixer = Unit::Mixer(Mamba2Mixer::<B>::init(&case.config, &device).unwrap());
        let mut block = Mamba2Block::<B>::init(&case.config, &device).unwrap();
        // A norm weight away from its initial ones, so that a weight used in the wrong place shows.
        let d = case.config.d_model;
        let norm_weight = || Param::from_tensor(Tensor::random([d], Distribution::Uniform(0.5, 1.5), &device));
        block.norm.weight = norm_weight();
        let mut stack = Mamba2Stack::<B>::init(&case.config, &device).unwrap();
        stack.layers[0].norm.weight = norm_weight();
        stack.norm_f.weight = norm_weight();
        let mut picked = Mamba2Stack::<B>::init(&Mamba2Config { n_layer: 2, ..case.config.clone() }, &device).unwrap();
        for layer in &mut picked.layers {
            layer.norm.weight = norm_weight();
        }
        picked.norm_f.weight = norm_weight();
        for unit in [mixer, Unit::Block(block), Unit::Stack(stack), Unit::Picked(picked)] {
            let fast = run(&unit, case, 7);
            let generic = with_generic_path(|| run(&unit, case, 7));
            assert_eq!(fast.len(), generic.len());
            for ((name, got), (_, want)) in fast.iter().zip(&generic) {
                let d = rel_diff(got, want);
                assert!(
                    d <= tolerance,
                    "{} {} (batch {}, L {}, state {}, u tracked {}): {name} differs by {d:e} (tolerance {tolerance:e})",
                    case.name,
                    unit.kind(),
                    case.batch,
                    case.len,
                    case.with_state,
                    case.track_u
                );
                worst = worst.max(d);
            }
        }
    }
    worst
}

#[test]
fn kernel_equals_generic_path_in_f64() {
    let worst = compare::<NdF64Grad>(1e-10);
    println!("f64 (NdArray): worst relative difference {worst:e} over every output and gradient");
}

#[test]
fn kernel_equals_generic_path_in_f32() {
    let worst = compare::<FlexF32Grad>(1e-4);
    println!("f32 (Flex): worst relative difference {worst:e} over every output and gradient");
}

#[test]
fn picks_that_are_not_rows_of_the_sequence_are_an_error() {
    let device = Default::default();
    let config = Mamba2Config::new(16, 1).with_d_state(8).with_headdim(8);
    let stack = Mamba2Stack::<NdF64Grad>::init(&config, &device).unwrap();
    let u = normal::<NdF64Grad, 3>([1, 5, 16], 1, &device);
    for picks in [Picks { n: 3, every: 3 }, Picks { n: 0, every: 1 }, Picks { n: 1, every: 0 }] {
        match stack.forward_picked(u.clone(), None, picks) {
            Err(e @ ModelError::Picks { .. }) => assert!(e.to_string().contains("a sequence of 5"), "{e}"),
            other => panic!("{picks:?}: {:?}", other.map(|(y, _)| y.dims())),
        }
    }
    // Rows 1 and 4 of 5 are.
    let (y, _) = stack.forward_picked(u, None, Picks { n: 2, every: 3 }).unwrap();
    assert_eq!(y.dims(), [1, 2, 16]);
}
