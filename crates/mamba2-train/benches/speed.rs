//! The performance issue's side-by-side configs, Rust side: a full train step (forward,
//! backward, AdamW), a forward, and the streaming step, on Flex (f32) and NdArray (f64).
//!
//! `cargo bench -p mamba2-train --bench speed` (criterion; ids `speed/<backend>/<what>`), or
//! `python3 tools/reference/bench_compare.py`, which runs this bench and HF transformers' torch
//! path on the same configs in one go and prints tokens/s for both and their ratio.
//!
//! `MAMBA2_SWEEP_OUT=file cargo bench -p mamba2-train --bench speed` runs only the length sweep,
//! round-robin over the lengths ([`interleaved_sweep`]), and writes its figures to `file`.
//! `MAMBA2_TRAIN_ROUND=small|medium|wide [MAMBA2_MIN_TIME=3] [MAMBA2_BENCH_DEVICE=cpu|cuda|wgpu]
//! cargo bench ...` runs only one round of train steps at that size and prints its time as JSON
//! ([`train_round`]; `wide` is the 130m checkpoint's width, for a GPU): what
//! `bench_compare.py` alternates with HF's rounds. `MAMBA2_TRAIN_ROUND=streaming` runs one round
//! of host streaming steps instead ([`stream_round`]), for before/after comparisons.
//!
//! The model is [`Mamba2Stack`] fed `[batch, L, d_model]` directly, like HF's `Mamba2Model` with
//! `inputs_embeds`; the loss is `mean(h^2)` of its output.

use std::time::Duration;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Distribution;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use mamba2_model::{with_generic_path, HostFloat, Mamba2Config, Mamba2Stack, StreamingStack};
use mamba2_optim::{AdamW, AdamWConfig};

struct Size {
    name: &'static str,
    config: Mamba2Config,
    batch: usize,
    len: usize,
}

fn sizes() -> [Size; 2] {
    [
        Size { name: "small", config: Mamba2Config::new(64, 2).with_d_state(16).with_headdim(16).with_chunk_size(64), batch: 8, len: 256 },
        Size {
            name: "medium",
            config: Mamba2Config::new(256, 4).with_d_state(64).with_headdim(32).with_chunk_size(64),
            batch: 8,
            len: 512,
        },
    ]
}

/// The width and depth of the published 130m checkpoint, for GPU rounds only
/// (`MAMBA2_TRAIN_ROUND=wide`): a CPU step at this size takes tens of seconds.
fn wide() -> Size {
    Size { name: "wide", config: Mamba2Config::new(768, 24).with_d_state(128).with_headdim(64).with_chunk_size(256), batch: 8, len: 512 }
}

fn streaming_config() -> Mamba2Config {
    Mamba2Config::new(256, 1).with_d_state(64).with_headdim(64)
}

/// Forward lengths of the per-token sweep (medium width, batch 1).
const SWEEP: [usize; 6] = [512, 1024, 2048, 4096, 8192, 16384];

fn train_and_forward<B: AutodiffBackend>(c: &mut Criterion, backend: &str, generic_too: bool) {
    let device = Default::default();
    let mut group = c.benchmark_group(format!("speed/{backend}"));
    group.sample_size(10).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    for size in sizes() {
        B::seed(&device, 0);
        let model = Mamba2Stack::<B>::init(&size.config, &device).unwrap();
        let x = Tensor::<B, 3>::random([size.batch, size.len, size.config.d_model], Distribution::Normal(0.0, 1.0), &device);
        group.throughput(Throughput::Elements((size.batch * size.len) as u64));
        let mut paths = vec![("kernel", false)];
        // The generic path only at the small size: at the medium size it takes seconds a step.
        if generic_too && size.name == "small" {
            paths.push(("generic", true));
        }
        for (path, generic) in paths {
            let mut run = train_step(&model, x.clone());
            group.bench_function(BenchmarkId::new(format!("train_{path}"), size.name), |b| {
                b.iter(|| if generic { with_generic_path(&mut run) } else { run() })
            });
            let inner = model.clone().valid();
            let xi = x.clone().inner();
            let fwd = || criterion::black_box(inner.forward(xi.clone(), None).unwrap().0.sum().into_data());
            group.bench_function(BenchmarkId::new(format!("forward_{path}"), size.name), |b| {
                b.iter(|| if generic { with_generic_path(fwd) } else { fwd() })
            });
        }
    }
    group.finish();
}

/// One train step (forward, backward, AdamW) of `model` on `x` per call, the loss `mean(h^2)`.
fn train_step<B: AutodiffBackend>(model: &Mamba2Stack<B>, x: Tensor<B, 3>) -> impl FnMut() {
    let mut opt = AdamW::new(AdamWConfig { weight_decay: 0.1, max_grad_norm: None, ..Default::default() }, model).unwrap();
    let mut slot = Some(model.clone());
    move || {
        let m = slot.take().expect("the model is put back after each step");
        let (h, _) = m.forward(x.clone(), None).unwrap();
        let loss = h.powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        let (m, _) = opt.step(1e-4, m, grads).unwrap();
        slot = Some(m);
    }
}

/// One round of the paired comparison (`bench_compare.py --rounds`): train steps of the size
/// named `name` (f32, on `device`: Flex, or CUDA and WebGPU in builds with their feature) timed
/// as `bench_torch.py` times HF's, one warm-up step and then the mean over at least `min_time`
/// seconds and 3 steps, each step waited for on the device; prints one JSON line.
fn train_round<B: AutodiffBackend>(name: &str, device_name: &str, min_time: f64) {
    let device = Default::default();
    let size = sizes().into_iter().chain([wide()]).find(|s| s.name == name).unwrap_or_else(|| panic!("no size named {name}"));
    B::seed(&device, 0);
    let model = Mamba2Stack::<B>::init(&size.config, &device).unwrap();
    let x = Tensor::random([size.batch, size.len, size.config.d_model], Distribution::Normal(0.0, 1.0), &device);
    let mut run = train_step(&model, x);
    let mut step = || {
        run();
        B::sync(&device).expect("the device finishes the step");
    };
    step();
    let (mut n, start) = (0, std::time::Instant::now());
    while n < 3 || start.elapsed().as_secs_f64() < min_time {
        step();
        n += 1;
    }
    let s = start.elapsed().as_secs_f64() / n as f64;
    let tokens = (size.batch * size.len) as f64;
    println!(
        "{{\"side\": \"rust\", \"what\": \"train\", \"config\": \"{name}\", \"device\": \"{device_name}\", \"dtype\": \"f32\", \"s_per_iter\": {s}, \"tokens_per_s\": {}}}",
        tokens / s
    );
}

/// One round of streaming steps (`MAMBA2_TRAIN_ROUND=streaming`): the host streaming step at
/// the streaming size, f32, one stream, after 1,000 warm-up steps, the mean over at least
/// `min_time` seconds; prints one JSON line. For before/after comparisons in alternating rounds.
fn stream_round(min_time: f64) {
    let device = Default::default();
    let config = streaming_config();
    <Flex as Backend>::seed(&device, 0);
    let host = StreamingStack::<f32>::new(&Mamba2Stack::<Flex>::init(&config, &device).unwrap());
    let mut state = host.zero_state(1);
    let u: Vec<f32> = (0..config.d_model).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut out = vec![0.0; config.d_model];
    for _ in 0..1000 {
        host.step(&mut state, &u, &mut out).unwrap();
    }
    let (mut n, start) = (0u64, std::time::Instant::now());
    while n < 1000 || start.elapsed().as_secs_f64() < min_time {
        host.step(&mut state, &u, &mut out).unwrap();
        n += 1;
    }
    let s = start.elapsed().as_secs_f64() / n as f64;
    println!("{{\"side\": \"rust\", \"what\": \"stream\", \"config\": \"streaming\", \"dtype\": \"f32\", \"s_per_iter\": {s}, \"tokens_per_s\": {}}}", 1.0 / s);
}

fn streaming<B: Backend, T: HostFloat>(c: &mut Criterion, backend: &str) {
    let device = Default::default();
    let config = streaming_config();
    B::seed(&device, 0);
    let stack = Mamba2Stack::<B>::init(&config, &device).unwrap();
    let mut group = c.benchmark_group(format!("speed/{backend}"));
    group.sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(1));

    let host = StreamingStack::<T>::new(&stack);
    let mut state = host.zero_state(1);
    let u: Vec<T> = (0..config.d_model).map(|i| T::from((i as f64 * 0.37).sin()).unwrap()).collect();
    let mut out = vec![T::zero(); config.d_model];
    group.bench_function("step_host/streaming", |b| b.iter(|| host.step(&mut state, &u, &mut out).unwrap()));

    let row = Tensor::<B, 2>::random([1, config.d_model], Distribution::Normal(0.0, 1.0), &device);
    let mut tensor_state = Some(mamba2_model::Mamba2State::zeros(&config, 1, &device));
    group.bench_function("step_tensor/streaming", |b| {
        b.iter(|| {
            let (y, s) = stack.step(row.clone(), tensor_state.take().unwrap()).unwrap();
            tensor_state = Some(s);
            criterion::black_box(y.into_data())
        })
    });
    group.finish();
}

fn length_sweep<B: Backend>(c: &mut Criterion, backend: &str) {
    let device = Default::default();
    let config = sizes()[1].config.clone();
    B::seed(&device, 0);
    let stack = Mamba2Stack::<B>::init(&config, &device).unwrap();
    let mut group = c.benchmark_group(format!("speed/{backend}"));
    group.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for len in SWEEP {
        let x = Tensor::<B, 3>::random([1, len, config.d_model], Distribution::Normal(0.0, 1.0), &device);
        group.throughput(Throughput::Elements(len as u64));
        group.bench_function(BenchmarkId::new("forward_len", len), |b| {
            b.iter(|| criterion::black_box(stack.forward(x.clone(), None).unwrap().0.sum().into_data()))
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    train_and_forward::<Autodiff<Flex>>(c, "flex_f32", true);
    train_and_forward::<Autodiff<NdArray<f64>>>(c, "ndarray_f64", false);
    streaming::<Flex, f32>(c, "flex_f32");
    streaming::<NdArray<f64>, f64>(c, "ndarray_f64");
    length_sweep::<Flex>(c, "flex_f32");
}

/// Rounds of [`interleaved_sweep`], after one warm-up round.
const ROUNDS: usize = 36;

/// The length sweep measured round-robin: each round runs every length once, so that this VM's
/// drifts in speed (up to 2x over minutes) fall on every length alike instead of on whichever
/// length criterion happened to be measuring. Writes the median and the fastest seconds per
/// forward for each length, and every round's time sorted, as JSON to `out`.
fn interleaved_sweep(out: &str) {
    let device = Default::default();
    let config = sizes()[1].config.clone();
    <Flex as Backend>::seed(&device, 0);
    let stack = Mamba2Stack::<Flex>::init(&config, &device).unwrap();
    let xs: Vec<Tensor<Flex, 3>> =
        SWEEP.iter().map(|&len| Tensor::random([1, len, config.d_model], Distribution::Normal(0.0, 1.0), &device)).collect();
    let mut times = vec![Vec::with_capacity(ROUNDS); SWEEP.len()];
    for round in 0..=ROUNDS {
        // Each round starts at another length, so that none is always the one after the longest.
        for i in (0..SWEEP.len()).map(|i| (i + round) % SWEEP.len()) {
            let start = std::time::Instant::now();
            criterion::black_box(stack.forward(xs[i].clone(), None).unwrap().0.sum().into_data());
            if round > 0 {
                times[i].push(start.elapsed().as_secs_f64());
            }
        }
    }
    let rows: Vec<String> = SWEEP
        .iter()
        .zip(times.iter_mut())
        .map(|(len, t)| {
            t.sort_by(f64::total_cmp);
            let all: Vec<String> = t.iter().map(|v| format!("{v:.6}")).collect();
            format!("{{\"len\": {len}, \"median_s\": {}, \"min_s\": {}, \"sorted_s\": [{}]}}", t[t.len() / 2], t[0], all.join(", "))
        })
        .collect();
    std::fs::write(out, format!("[{}]\n", rows.join(", "))).expect("the sweep's output file is writable");
}

criterion_group!(speed, benches);

/// `criterion_main!`, or the interleaved sweep alone when `MAMBA2_SWEEP_OUT` names a file, or
/// one train round when `MAMBA2_TRAIN_ROUND` names a size (or one streaming round for `streaming`); after [`mamba2_train::keep_freed_memory`].
fn main() {
    // As the `mamba2` command does: no fresh page mapping per large buffer (a no-op off glibc).
    mamba2_train::keep_freed_memory();
    if let Ok(out) = std::env::var("MAMBA2_SWEEP_OUT") {
        interleaved_sweep(&out);
        return;
    }
    if let Ok(name) = std::env::var("MAMBA2_TRAIN_ROUND") {
        let min_time = std::env::var("MAMBA2_MIN_TIME").ok().and_then(|v| v.parse().ok()).unwrap_or(3.0);
        let device = std::env::var("MAMBA2_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
        match (name.as_str(), device.as_str()) {
            ("streaming", _) => stream_round(min_time),
            (_, "cpu") => train_round::<Autodiff<Flex>>(&name, "cpu", min_time),
            #[cfg(feature = "cuda")]
            (_, "cuda") => train_round::<Autodiff<burn::backend::Cuda>>(&name, "cuda", min_time),
            #[cfg(feature = "wgpu")]
            (_, "wgpu") => train_round::<Autodiff<burn_wgpu::Wgpu>>(&name, "wgpu", min_time),
            (_, other) => panic!(
                "MAMBA2_BENCH_DEVICE={other}: this build has cpu{}{}",
                if cfg!(feature = "cuda") { ", cuda" } else { "" },
                if cfg!(feature = "wgpu") { ", wgpu" } else { "" }
            ),
        }
        return;
    }
    speed();
    Criterion::default().configure_from_args().final_summary();
}
