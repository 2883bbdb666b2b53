//! Forward, forward+backward and the streaming step of the time-series model, on Flex (f32)
//! and NdArray (f64).
//!
//! `cargo bench -p mamba2-model --bench model`; figures are recorded in `docs/benchmarks.md`.
//! Config: d_model 64, d_state 16, headdim 16, expand 2, 2 layers, batch 8, L 256 (the "small"
//! config of the performance issue); the step runs at batch 1.
//!
//! `lm_decode_130m`: one token of text generation on the host streaming path
//! ([`StreamingLm::step`]: embedding row, 24 blocks, final norm, tied head over 50,280 tokens)
//! at the 130m shape (d_model 768, d_state 128, headdim 64, expand 2), random weights, f32
//! arithmetic with the weights stored in f32 and in bf16. Run
//! it alone with `cargo bench -p mamba2-model --bench model -- lm_decode`.

use std::time::Duration;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Distribution;
use criterion::{criterion_group, criterion_main, Criterion};
use mamba2_model::{LmConfig, Mamba2Config, Mamba2TimeSeries, StreamingLm, TimeSeriesConfig};

const BATCH: usize = 8;
const LEN: usize = 256;
const FEATURES: usize = 7;

fn config() -> TimeSeriesConfig {
    TimeSeriesConfig::new(Mamba2Config::new(64, 2).with_d_state(16).with_headdim(16).with_chunk_size(64), FEATURES, FEATURES)
}

fn bench_backend<B: AutodiffBackend>(c: &mut Criterion, name: &str) {
    let device = Default::default();
    let model: Mamba2TimeSeries<B> = config().init(&device).unwrap();
    let x = Tensor::<B, 3>::random([BATCH, LEN, FEATURES], Distribution::Normal(0.0, 1.0), &device);
    let inner = model.clone().valid();
    let x_inner = x.clone().inner();

    let mut group = c.benchmark_group(format!("model/{name}"));
    group.sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    group.bench_function("forward_b8_l256", |b| {
        b.iter(|| {
            let (y, _) = inner.forward(x_inner.clone(), None).unwrap();
            criterion::black_box(y.sum().into_data())
        })
    });
    group.bench_function("forward_backward_b8_l256", |b| {
        b.iter(|| {
            let (y, _) = model.forward(x.clone(), None).unwrap();
            criterion::black_box(y.powi_scalar(2).mean().backward())
        })
    });
    let state = inner.zero_state(1, &device);
    let row = x_inner.clone().narrow(0, 0, 1).narrow(1, 0, 1).reshape([1, FEATURES]);
    group.bench_function("step_b1", |b| {
        b.iter(|| {
            let (y, s) = inner.step(row.clone(), state.clone()).unwrap();
            criterion::black_box((y.into_data(), s))
        })
    });
    group.finish();
}

fn lm_decode(c: &mut Criterion) {
    let backbone = Mamba2Config::new(768, 24).with_d_state(128).with_headdim(64).with_chunk_size(256);
    let lm = LmConfig::new(backbone, 50_280).init::<Flex>(&Default::default()).unwrap();
    let full = StreamingLm::<f32>::new(&lm);
    drop(lm);
    let mut group = c.benchmark_group("model/lm_decode_130m");
    group.sample_size(20).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(2));
    for (name, host) in [("token_f32", full.clone()), ("token_bf16_weights", full.with_bf16_weights())] {
        let mut state = host.zero_state();
        let mut token = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                // Tokens vary so that no embedding row stays in cache.
                token = (token + 7919) % 50_280;
                host.step(&mut state, token).unwrap();
                criterion::black_box(state.logits[token])
            })
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_backend::<Autodiff<Flex>>(c, "flex_f32");
    bench_backend::<Autodiff<NdArray<f64>>>(c, "ndarray_f64");
    lm_decode(c);
}

criterion_group!(model, benches);
criterion_main!(model);
