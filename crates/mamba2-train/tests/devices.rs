//! The forecaster trains on WebGPU as on the CPU: the same 20 optimizer steps (two epochs,
//! clipping and the warm-up and cosine schedule included) from the same seed end with the same
//! parameters and the same figures per epoch, to f32 rounding. Where no GPU is present, Mesa's
//! lavapipe runs WebGPU on the CPU; the path is CubeCL's generic tensor ops, the one CUDA runs.

use burn::backend::{Autodiff, Flex};
use burn_wgpu::Wgpu;

use crate::common::worst;
use crate::parallel::run;

#[test]
fn the_forecaster_trains_on_wgpu_as_on_flex() {
    let (host, p_host) = run::<Autodiff<Flex>>(1, "flex-vs-wgpu");
    let (gpu, p_gpu) = run::<Autodiff<Wgpu>>(1, "wgpu");
    let w = worst(&p_gpu, &p_host);
    println!("Wgpu vs Flex after {} steps: worst relative parameter difference {w:.2e}", host.history.last().unwrap().step);
    assert!(w <= 1e-4, "parameters differ by {w:e}");
    assert_eq!(gpu.history.len(), host.history.len());
    for (a, b) in gpu.history.iter().zip(&host.history) {
        for (x, y, what) in [
            (a.train_loss, b.train_loss, "train loss"),
            (a.val_mse, b.val_mse, "val MSE"),
            (a.val_mae, b.val_mae, "val MAE"),
            (a.grad_norm, b.grad_norm, "grad norm"),
        ] {
            println!("epoch {}: {what} Wgpu {x:.7} Flex {y:.7}", a.epoch);
            assert!((x - y).abs() <= 1e-4 * y.abs(), "epoch {}: {what} {x} on Wgpu, {y} on Flex", a.epoch);
        }
    }
}
