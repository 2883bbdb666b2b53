//! The default forecaster's costs, on the embedded ETTh1 (L 96, H 96, all 7 series), Flex f32:
//!
//! - `forecast/train_step/forecaster`: one optimizer step of the trainer (batch of 32 windows,
//!   each of its 7 series a sequence: 224 sequences of 96 rows), batch building included;
//! - `forecast/train_step/stack`: the bare `Mamba2Stack` train step at the same shape
//!   (`[224, 96, d_model]`, loss `mean(h^2)`), the floor the forecaster's step is measured against.
//!   Each measured step of either benchmark alternates with an unmeasured step of the other, so
//!   that the two figures come from the same conditions of the machine;
//! - `forecast/stream_row/L`: one incoming row through `ForecastStream` (f32, one thread) for a
//!   model trained with lookback `L` = 96 and 512, after a history of 2,000 rows: the time per
//!   row does not depend on `L`, since the recurrent state carries the history.
//! - `forecast/stream_row_quantiles/S`: the same row at `L` = 96 on a stream that also keeps
//!   calibrated intervals (levels 0.1, 0.5, 0.9) and returns their quantiles after every row,
//!   against `plain`, the same push without them. `S` names the local scale: `abs_change_96`,
//!   `level_std_336` (the longest window any candidate reads, the costliest, and what
//!   validation chooses on ETTh1 H 96), and `change_std_96` (a kept Repeat's random walk).
//!   Each measured row alternates with an unmeasured row of the other stream, as for the train
//!   steps.
//!
//! - `forecast/bank_row/N`: one incoming row of one of N = 1,000 series, interleaved round
//!   robin, through a `StreamBank` (f32, one thread) of the default single-series model (L 96,
//!   H 96, ETTh1's `OT` column's shape) with intervals scaled by the std of the last 336 values,
//!   the quantiles taken after every row; each series has had 700 rows first. `N` = 1 is the
//!   same model with one series, measured alternately with it. The bytes of state per series
//!   are printed beside it.
//!
//! - `forecast/workers/W`: one epoch of 16 default train steps (batch 32, the embedded ETTh1,
//!   validation on 16 windows) through `train_workers` with W = 1 and 2 data-parallel workers in
//!   this process: the cost of splitting each step and summing the gradients. On two cores no
//!   speed-up is expected; the figure shows the overhead.
//!
//! `cargo bench -p mamba2-train --bench forecast`

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use criterion::{criterion_group, BenchmarkId, Criterion};
use mamba2_data::quantile::{Intervals, ScaleKind};
use mamba2_forecast::features::Truth;
use mamba2_forecast::{ForecastStream, ForecasterConfig, StreamBank};
use mamba2_model::Mamba2Stack;
use mamba2_optim::{AdamW, AdamWConfig};
use mamba2_train::{train_step, train_workers, Prepared, RunDir, TrainConfig};

#[path = "common/etth1.rs"]
mod etth1;

use etth1::{etth1, Data};

type B = Autodiff<Flex>;

fn config(data: &Data, lookback: usize) -> ForecasterConfig {
    ForecasterConfig::defaults(lookback, 96, data.columns.clone(), data.columns.clone(), data.calendar.clone())
}

/// The two steps being compared, each run by the closures below.
struct Steps {
    forecaster: Box<dyn FnMut()>,
    stack: Box<dyn FnMut()>,
}

fn steps(data: &Data) -> Steps {
    let device = Default::default();
    let config = config(data, 96);
    let tc = TrainConfig::default();
    let adamw = AdamWConfig { weight_decay: tc.weight_decay, max_grad_norm: tc.max_grad_norm, ..Default::default() };
    B::seed(&device, 0);
    let model = config.init::<B>(&device).unwrap();
    let mut optim = AdamW::new(adamw.clone(), &model).unwrap();
    let map = model.feature_map();
    let starts: Vec<usize> = (0..tc.batch_size).map(|i| 100 + 211 * i).collect();
    let (rows, clock) = (data.rows.clone(), data.clock.clone());
    let mut slot = Some(model);
    let forecaster = move || {
        let n_pos = (96 - tc.loss_from).div_ceil(tc.loss_every);
        let batch = map.build::<f32>(&rows, &clock, &starts, 96, n_pos, tc.loss_every, Truth::Relative).into_device(96, &device);
        let (next, _, _) = train_step(slot.take().unwrap(), &mut optim, &batch, 1e-4, tc.loss).unwrap();
        slot = Some(next);
    };

    let stack = Mamba2Stack::<B>::init(&config.backbone, &device).unwrap();
    let x =
        Tensor::<B, 3>::random([tc.batch_size * data.columns.len(), 96, config.backbone.d_model], Distribution::Normal(0.0, 1.0), &device);
    let mut opt = AdamW::new(adamw, &stack).unwrap();
    let mut slot = Some(stack);
    let stack = move || {
        let m = slot.take().unwrap();
        let (h, _) = m.forward(x.clone(), None).unwrap();
        let loss = h.powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        slot = Some(opt.step(1e-4, m, grads).unwrap().0);
    };
    Steps { forecaster: Box::new(forecaster), stack: Box::new(stack) }
}

/// The time of `iters` calls of `step(true)`, each followed by an unmeasured `step(false)`.
fn alternately(iters: u64, mut step: impl FnMut(bool)) -> Duration {
    let mut measured = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        step(true);
        measured += start.elapsed();
        step(false);
    }
    measured
}

fn train_steps(c: &mut Criterion) {
    let data = etth1();
    let mut group = c.benchmark_group("forecast/train_step");
    group.sample_size(20).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(2));
    let mut s = steps(&data);
    // Each measured step is followed by one of the other kind, unmeasured: both benchmarks then
    // sample the machine in the same conditions, step by step. Timed ten seconds apart instead,
    // their ratio moved by 0.1-0.3 from one run to the next on a shared 2-core VM.
    let mut alternate = |b: &mut criterion::Bencher, forecaster: bool| {
        b.iter_custom(|iters| alternately(iters, |measured| if measured == forecaster { (s.forecaster)() } else { (s.stack)() }))
    };
    group.bench_function("forecaster", |b| alternate(b, true));
    group.bench_function("stack", |b| alternate(b, false));
    group.finish();
}

fn stream_rows(c: &mut Criterion) {
    let data = etth1();
    let device = Default::default();
    let mut group = c.benchmark_group("forecast/stream_row");
    group.sample_size(30).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    for lookback in [96, 512] {
        <Flex as Backend>::seed(&device, 0);
        let model = config(&data, lookback).init::<Flex>(&device).unwrap();
        let mut stream = ForecastStream::<f32>::new(&model);
        for r in 0..2000 {
            stream.push(&data.rows[r], data.clock[r]).unwrap();
        }
        let mut r = 2000;
        group.bench_function(BenchmarkId::from_parameter(lookback), |b| {
            b.iter(|| {
                r = if r + 1 < data.rows.len() { r + 1 } else { 2000 };
                criterion::black_box(stream.push(&data.rows[r], data.clock[r]).unwrap())
            })
        });
    }
    group.finish();
}

/// Intervals of the shape `calibrate` writes, with made-up but sorted `z`: the cost does not
/// depend on their values.
fn intervals(scale: ScaleKind, window: usize, targets: usize, horizon: usize) -> Intervals {
    let z = (0..horizon).flat_map(|k| [-1.3 - 0.01 * k as f64, 0.0, 1.3 + 0.01 * k as f64]).collect();
    Intervals {
        levels: vec![0.1, 0.5, 0.9],
        scale,
        window,
        per_target: false,
        floor: 1e-3,
        typical: vec![0.1; targets],
        targets,
        horizon,
        z,
    }
}

fn stream_rows_quantiles(c: &mut Criterion) {
    let data = etth1();
    let device = Default::default();
    let mut group = c.benchmark_group("forecast/stream_row_quantiles");
    group.sample_size(30).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    <Flex as Backend>::seed(&device, 0);
    let model = config(&data, 96).init::<Flex>(&device).unwrap();
    let t_n = data.columns.len();
    let warm = |s: &mut ForecastStream<f32>| {
        for r in 0..2000 {
            s.push(&data.rows[r], data.clock[r]).unwrap();
        }
    };
    for (name, scale, window) in [
        ("abs_change_96", ScaleKind::AbsChange, 96),
        ("level_std_336", ScaleKind::LevelStd, 336),
        ("change_std_96", ScaleKind::ChangeStd, 96),
    ] {
        let mut plain = ForecastStream::<f32>::new(&model);
        let mut with = ForecastStream::<f32>::new(&model).with_intervals(intervals(scale, window, t_n, 96)).unwrap();
        warm(&mut plain);
        warm(&mut with);
        // Each stream reads the rows in order from row 2,000, wrapping at the end.
        let (mut r_plain, mut r_with) = (2000, 2000);
        let next = |r: &mut usize| {
            *r = if *r + 1 < data.rows.len() { *r + 1 } else { 2000 };
            *r
        };
        let mut alternate = |b: &mut criterion::Bencher, quantiles: bool| {
            b.iter_custom(|iters| {
                alternately(iters, |measured| {
                    if measured == quantiles {
                        let r = next(&mut r_with);
                        let point = with.push(&data.rows[r], data.clock[r]).unwrap();
                        criterion::black_box(with.quantiles(&point).unwrap());
                    } else {
                        let r = next(&mut r_plain);
                        criterion::black_box(plain.push(&data.rows[r], data.clock[r]).unwrap());
                    }
                })
            })
        };
        group.bench_function(format!("{name}/plain"), |b| alternate(b, false));
        group.bench_function(name, |b| alternate(b, true));
    }
    group.finish();
}

/// Resident memory of this process, from `/proc/self/statm` (0 where there is none).
fn resident_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<usize>().ok()))
        .map_or(0, |pages| pages * 4096)
}

fn bank_rows(c: &mut Criterion) {
    let data = etth1();
    let device = Default::default();
    let mut group = c.benchmark_group("forecast/bank_row");
    group.sample_size(30).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    <Flex as Backend>::seed(&device, 0);
    // One series per id: the last column (OT) and the calendar, as `train --columns OT` builds.
    let ot = data.columns.len() - 1;
    let config = ForecasterConfig::defaults(96, 96, vec!["OT".into()], vec!["OT".into()], data.calendar.clone());
    let model = config.init::<Flex>(&device).unwrap();
    let stream = ForecastStream::<f32>::new(&model).with_intervals(intervals(ScaleKind::LevelStd, 336, 1, 96)).unwrap();
    let n = 1000;
    // Series `k` reads column `k % 7` from its own offset.
    let row_of = |k: usize, r: usize| {
        let i = (k * 37 + r) % data.rows.len();
        ([data.rows[i][k % data.columns.len()]], data.clock[i])
    };
    let before = resident_bytes();
    let mut bank = StreamBank::new(&stream);
    let ids: Vec<String> = (0..n).map(|k| format!("series-{k}")).collect();
    let warm = 700;
    for r in 0..warm {
        for (k, id) in ids.iter().enumerate() {
            let (row, clock) = row_of(k, r);
            bank.push(id, &row, clock).unwrap();
        }
    }
    eprintln!(
        "forecast/bank_row/{n}: {} bytes of state per series (StreamBank::state_bytes), {} bytes resident per series",
        bank.state_bytes() / n,
        resident_bytes().saturating_sub(before) / n
    );
    let mut alone = stream.fresh(false);
    for r in 0..warm {
        let (row, clock) = row_of(ot, r);
        alone.push(&row, clock).unwrap();
    }
    let (mut i, mut r_alone) = (0usize, warm);
    let mut alternate = |b: &mut criterion::Bencher, many: bool| {
        b.iter_custom(|iters| {
            alternately(iters, |measured| {
                if measured == many {
                    let (k, r) = (i % n, warm + i / n);
                    i += 1;
                    let (row, clock) = row_of(k, r);
                    let point = bank.push(&ids[k], &row, clock).unwrap();
                    criterion::black_box(bank.quantiles(&ids[k], &point).unwrap());
                } else {
                    let (row, clock) = row_of(ot, r_alone);
                    r_alone += 1;
                    let point = alone.push(&row, clock).unwrap();
                    criterion::black_box(alone.quantiles(&point).unwrap());
                }
            })
        })
    };
    group.bench_function(BenchmarkId::from_parameter(1), |b| alternate(b, false));
    group.bench_function(BenchmarkId::from_parameter(n), |b| alternate(b, true));
    group.finish();
}

fn workers(c: &mut Criterion) {
    let data = etth1();
    // 16 steps of 32 windows from the training rows, and 16 validation windows.
    let (l, h) = (96, 96);
    let prepared = Prepared {
        rows: data.rows.clone(),
        scaler: data.scaler.clone(),
        ranges: [(0, 32 * 16 + l + h - 1), (8640 - l, 8640 + 16 + h - 1), (8640 + 16 + h - 1, data.rows.len())],
        targets: (0..data.columns.len()).collect(),
        clock: data.clock.clone(),
    };
    let config = config(&data, l);
    let tc = TrainConfig { epochs: 1, stride: 1, ..TrainConfig::default() };
    let device = Default::default();
    let mut group = c.benchmark_group("forecast/workers");
    group.sample_size(10).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(2));
    for w in [1, 2] {
        let dir = std::env::temp_dir().join(format!("mamba2-bench-workers-{w}-{}", std::process::id()));
        group.bench_function(BenchmarkId::from_parameter(w), |b| {
            b.iter(|| {
                let _ = std::fs::remove_dir_all(&dir);
                train_workers::<B>(&config, &tc, &prepared, &RunDir(dir.clone()), false, &device, w, |_| {}).unwrap()
            })
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    group.finish();
}

criterion_group!(forecast, train_steps, stream_rows, stream_rows_quantiles, bank_rows, workers);

fn main() {
    mamba2_train::keep_freed_memory();
    forecast();
    Criterion::default().configure_from_args().final_summary();
}
