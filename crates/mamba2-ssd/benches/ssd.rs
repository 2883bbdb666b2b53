//! Chunked against sequential scan, forward and forward+backward, at batch 8, L 512, H 16, P 32,
//! N 64, G 1, on Flex (f32) and NdArray (f64).
//!
//! `cargo bench -p mamba2-ssd --bench ssd`; figures are recorded in `docs/benchmarks.md`.

use std::time::Duration;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Distribution;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mamba2_ssd::{ssd_chunked, ssd_sequential, Skip, SsdInput};

const BATCH: usize = 8;
const LEN: usize = 512;
const H: usize = 16;
const P: usize = 32;
const N: usize = 64;
const G: usize = 1;

fn input<B: Backend>(device: &B::Device) -> SsdInput<B> {
    let u = |lo: f64, hi: f64| Distribution::Uniform(lo, hi);
    SsdInput::new(
        Tensor::random([BATCH, LEN, H, P], u(-1.0, 1.0), device),
        Tensor::random([BATCH, LEN, H], u(0.001, 0.1), device),
        Tensor::random([H], u(-16.0, -1.0), device),
        Tensor::random([BATCH, LEN, G, N], u(-1.0, 1.0), device),
        Tensor::random([BATCH, LEN, G, N], u(-1.0, 1.0), device),
    )
    .with_d(Skip::PerHead(Tensor::ones([H], device)))
}

/// Everything an input carries becomes a leaf that wants a gradient.
fn with_grad<B: AutodiffBackend>(inp: SsdInput<B>) -> SsdInput<B> {
    SsdInput {
        x: inp.x.require_grad(),
        dt: inp.dt.require_grad(),
        a: inp.a.require_grad(),
        b: inp.b.require_grad(),
        c: inp.c.require_grad(),
        d: inp.d.map(|d| match d {
            Skip::PerHead(t) => Skip::PerHead(t.require_grad()),
            Skip::PerChannel(t) => Skip::PerChannel(t.require_grad()),
        }),
        initial_state: inp.initial_state,
    }
}

/// Forces the backend to finish: lazy backends otherwise time nothing.
fn sync<B: Backend, const D: usize>(t: Tensor<B, D>) {
    criterion::black_box(t.sum().into_data());
}

fn bench_backend<B: AutodiffBackend>(c: &mut Criterion, name: &str) {
    let device = Default::default();
    let inner = input::<B::InnerBackend>(&device);
    let mut group = c.benchmark_group(format!("ssd_forward/{name}"));
    group.sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    for q in [64, 256] {
        group.bench_function(BenchmarkId::new("chunked", q), |bch| bch.iter(|| sync(ssd_chunked(inner.clone(), q).unwrap().y)));
    }
    group.bench_function("sequential", |bch| bch.iter(|| sync(ssd_sequential(inner.clone()).unwrap().y)));
    group.finish();

    let diff = input::<B>(&device);
    let mut group = c.benchmark_group(format!("ssd_forward_backward/{name}"));
    group.sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    for q in [64, 256] {
        group.bench_function(BenchmarkId::new("chunked", q), |bch| {
            bch.iter(|| {
                let out = ssd_chunked(with_grad(diff.clone()), q).unwrap();
                criterion::black_box((out.y.sum() + out.final_state.sum()).backward());
            })
        });
    }
    group.bench_function("sequential", |bch| {
        bch.iter(|| {
            let out = ssd_sequential(with_grad(diff.clone())).unwrap();
            criterion::black_box((out.y.sum() + out.final_state.sum()).backward());
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_backend::<Autodiff<Flex>>(c, "flex_f32");
    bench_backend::<Autodiff<NdArray<f64>>>(c, "ndarray_f64");
}

criterion_group!(ssd, benches);
criterion_main!(ssd);
