//! Where the default forecaster's train step goes, phase by phase, beside the bare
//! `Mamba2Stack` step at the same shape, in alternating steps of one process.
//!
//! The criterion bench (`benches/forecast.rs`) times the two steps ten seconds apart, and on a
//! shared 2-core VM their ratio moves by 0.3 from one run to the next; here every round runs one
//! forecaster step, one bare step and one bare step whose input is tracked (as the forecaster's
//! stack input is, since its input projection is trained), so that each sees the same machine.
//!
//! `cargo run --release -p mamba2-train --example step_phases [rounds]` (Flex f32, the embedded
//! ETTh1 at L 96, H 96, batch 32: 224 sequences of 96 rows; default 30 rounds after 3 warm-up
//! rounds). Prints the mean of each phase in milliseconds and the ratios of the step times.

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use mamba2_forecast::features::Truth;
use mamba2_forecast::ForecasterConfig;
use mamba2_model::Mamba2Stack;
use mamba2_optim::{AdamW, AdamWConfig};
use mamba2_train::TrainConfig;

#[path = "../benches/common/etth1.rs"]
mod etth1;

use etth1::etth1;

type B = Autodiff<Flex>;

const PHASES: [&str; 11] = [
    "forecaster: build the batch",
    "forecaster: to tensors",
    "forecaster: forward and loss",
    "forecaster: backward",
    "forecaster: AdamW",
    "bare stack: forward and loss",
    "bare stack: backward",
    "bare stack: AdamW",
    "bare stack, tracked input: forward and loss",
    "bare stack, tracked input: backward",
    "bare stack, tracked input: AdamW",
];

fn main() {
    mamba2_train::keep_freed_memory();
    let rounds: usize = std::env::args().nth(1).map_or(30, |a| a.parse().expect("rounds: a whole number"));
    let data = etth1();
    let config = ForecasterConfig::defaults(96, 96, data.columns.clone(), data.columns.clone(), data.calendar.clone());
    let tc = TrainConfig::default();
    let device = Default::default();
    B::seed(&device, 0);
    let adamw = AdamWConfig { weight_decay: tc.weight_decay, max_grad_norm: tc.max_grad_norm, ..Default::default() };

    let model = config.init::<B>(&device).expect("the default config is valid");
    let mut optim = AdamW::new(adamw.clone(), &model).expect("a valid optimizer");
    let map = model.feature_map();
    let starts: Vec<usize> = (0..tc.batch_size).map(|i| 100 + 211 * i).collect();
    let n_pos = (96 - tc.loss_from).div_ceil(tc.loss_every);
    let mut forecaster = Some(model);

    let stack = Mamba2Stack::<B>::init(&config.backbone, &device).expect("the default stack is valid");
    let mut stack_optim = AdamW::new(adamw, &stack).expect("a valid optimizer");
    let mut stack = Some(stack);
    let x =
        Tensor::<B, 3>::random([starts.len() * data.columns.len(), 96, config.backbone.d_model], Distribution::Normal(0.0, 1.0), &device);

    let warm_up = 3;
    let mut total = [0f64; PHASES.len()];
    for round in 0..warm_up + rounds {
        let mut last = Instant::now();
        let mut lap = |phase: usize| {
            let now = Instant::now();
            if round >= warm_up {
                total[phase] += (now - last).as_secs_f64() * 1e3 / rounds as f64;
            }
            last = now;
        };
        let host = map.build::<f32>(&data.rows, &data.clock, &starts, 96, n_pos, tc.loss_every, Truth::Relative);
        lap(0);
        let batch = host.into_device(96, &device);
        lap(1);
        let m = forecaster.take().expect("put back each round");
        let loss = m.loss(&batch, tc.loss).expect("a batch with its truth");
        let _ = loss.clone().into_scalar();
        lap(2);
        let grads = loss.backward();
        lap(3);
        let grads = GradientsParams::from_grads(grads, &m);
        forecaster = Some(optim.step(1e-4, m, grads).expect("finite gradients").0);
        lap(4);
        for (first, tracked) in [(5, false), (8, true)] {
            let m = stack.take().expect("put back each round");
            let input = if tracked { x.clone().require_grad() } else { x.clone() };
            let (h, _) = m.forward(input, None).expect("the shapes agree");
            let loss = h.powi_scalar(2).mean();
            let _ = loss.clone().into_scalar();
            lap(first);
            let grads = loss.backward();
            lap(first + 1);
            let grads = GradientsParams::from_grads(grads, &m);
            stack = Some(stack_optim.step(1e-4, m, grads).expect("finite gradients").0);
            lap(first + 2);
        }
    }
    for (name, ms) in PHASES.iter().zip(total) {
        println!("{name:<44} {ms:8.2} ms");
    }
    let (f, s, t) = (total[..5].iter().sum::<f64>(), total[5..8].iter().sum::<f64>(), total[8..].iter().sum::<f64>());
    println!("step: forecaster {f:.2} ms, bare stack {s:.2} ms ({:.2}x), bare stack with tracked input {t:.2} ms ({:.2}x)", f / s, f / t);
}
