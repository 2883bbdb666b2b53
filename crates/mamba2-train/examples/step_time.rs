//! Times forward and forward+backward of the default ETTh1 forecaster at batch 32, L 96.
//! `cargo run --release -p mamba2-train --example step_time`
use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::Distribution;
use mamba2_model::Mamba2Config;
use mamba2_train::{ForecastSpec, ForecasterConfig};

fn main() {
    run::<Autodiff<Flex>>("flex f32");
    run::<Autodiff<burn::backend::NdArray<f32>>>("ndarray f32");
}

fn run<B: burn::tensor::backend::AutodiffBackend>(name: &str) {
    println!("{name}");
    let device = Default::default();
    let feats: Vec<String> = (0..7).map(|i| format!("c{i}")).collect();
    for (chunk, d_model, d_state, headdim) in [(32, 64, 16, 16), (16, 64, 16, 16)] {
        let config = ForecasterConfig {
            spec: ForecastSpec { lookback: 96, horizon: 96, features: feats.clone(), targets: feats.clone(), revin: true, linear_skip: true },
            backbone: Mamba2Config::new(d_model, 2).with_d_state(d_state).with_headdim(headdim).with_chunk_size(chunk),
        };
        let model = config.init::<B>(&device).unwrap();
        let x = Tensor::<B, 3>::random([32, 96, 7], Distribution::Normal(0.0, 1.0), &device);
        let mut fwd = 0.0;
        let mut all = 0.0;
        for i in 0..4 {
            let t = Instant::now();
            let y = model.forward(x.clone()).unwrap();
            let _ = y.clone().sum().into_data();
            let f = t.elapsed().as_secs_f64();
            let _g = y.powi_scalar(2).mean().backward();
            if i > 0 {
                fwd += f;
                all += t.elapsed().as_secs_f64();
            }
        }
        println!("chunk {chunk} d_model {d_model} d_state {d_state} headdim {headdim}: forward {:.1} ms, forward+backward {:.1} ms", fwd / 3.0 * 1e3, all / 3.0 * 1e3);
    }
}
