//! Runs the scan on random data: chunked against sequential, with timings and their difference.
//!
//! `cargo run --release -p mamba2-ssd --example scan`

use std::time::Instant;

use burn::backend::{Flex, NdArray};
use burn::prelude::*;
use burn::tensor::Distribution;
use mamba2_ssd::{ssd_chunked, ssd_sequential, Skip, SsdInput};
use mamba2_tensor::compare::tensor_rel_diff;

/// The sizes of one run: batch, length, heads, head dimension, groups, state size, chunk size.
struct Sizes {
    batch: usize,
    len: usize,
    h: usize,
    p: usize,
    g: usize,
    n: usize,
    chunk: usize,
}

fn run<B: Backend>(name: &str, sizes: Sizes) {
    let Sizes { batch, len, h, p, g, n, chunk } = sizes;
    let device = Default::default();
    B::seed(&device, 7);
    let u = |lo: f64, hi: f64| Distribution::Uniform(lo, hi);
    let input = SsdInput::<B>::new(
        Tensor::random([batch, len, h, p], u(-1.0, 1.0), &device),
        Tensor::random([batch, len, h], u(0.001, 0.1), &device),
        Tensor::random([h], u(-16.0, -1.0), &device),
        Tensor::random([batch, len, g, n], u(-1.0, 1.0), &device),
        Tensor::random([batch, len, g, n], u(-1.0, 1.0), &device),
    )
    .with_d(Skip::PerHead(Tensor::ones([h], &device)));

    let start = Instant::now();
    let fast = ssd_chunked(input.clone(), chunk).expect("valid input");
    let _ = fast.y.clone().sum().into_data();
    let t_chunked = start.elapsed();
    let start = Instant::now();
    let slow = ssd_sequential(input).expect("valid input");
    let _ = slow.y.clone().sum().into_data();
    let t_sequential = start.elapsed();

    let dy = tensor_rel_diff(fast.y, slow.y);
    let ds = tensor_rel_diff(fast.final_state, slow.final_state);
    let tokens = (batch * len) as f64;
    println!(
        "{name:<12} batch {batch} L {len} H {h} P {p} G {g} N {n} Q {chunk}: chunked {:>8.2} ms ({:>9.0} tok/s), \
         sequential {:>8.2} ms ({:>9.0} tok/s); relative difference y {dy:.1e}, final state {ds:.1e}",
        t_chunked.as_secs_f64() * 1e3,
        tokens / t_chunked.as_secs_f64(),
        t_sequential.as_secs_f64() * 1e3,
        tokens / t_sequential.as_secs_f64(),
    );
}

fn main() {
    println!("Mamba-2 SSD scan on random inputs (forward only)");
    let medium = || Sizes { batch: 8, len: 512, h: 16, p: 32, g: 1, n: 64, chunk: 64 };
    run::<NdArray<f64>>("ndarray f64", medium());
    run::<Flex>("flex f32", medium());
    run::<Flex>("flex f32", Sizes { batch: 2, len: 1000, h: 8, p: 16, g: 2, n: 32, chunk: 128 });
}
