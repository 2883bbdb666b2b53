//! The CPU kernel in f32 over one long sequence, against the same kernel in f64 (which
//! `fast_path.rs` holds equal to the generic path).

use crate::common::{normal_values, FlexF32Grad, NdF64Grad};
use burn::prelude::*;
use burn::record::{DoublePrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use mamba2_model::{named_grads, Mamba2Config, Mamba2Mixer};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};

/// Output and every gradient of `sum(y * wy)` for a mixer fed `u` (both given in f64).
fn mixer_grads<B: AutodiffBackend>(mixer: &Mamba2Mixer<B>, u: &[f64], wy: &[f64], shape: [usize; 3]) -> Vec<(String, Vec<f64>)> {
    let device = Default::default();
    let tensor = |v: &[f64]| Tensor::<B, 3>::from_data(TensorData::new(v.to_vec(), shape), &device);
    let u = tensor(u).require_grad();
    let building = mamba2_tensor::graph::recording();
    let (y, _) = mixer.forward(u.clone(), None).unwrap();
    let loss = (y.clone() * tensor(wy)).sum();
    drop(building);
    let grads = mamba2_tensor::graph::backward(loss);
    let mut out = vec![("y".to_string(), to_f64_vec(y)), ("grad u".to_string(), to_f64_vec(u.grad(&grads).expect("tracked")))];
    for (path, g) in named_grads(mixer, &grads) {
        out.push((format!("grad {path}"), to_f64_vec(g.unwrap_or_else(|| panic!("{path} got no gradient")))));
    }
    out
}

/// The f32 kernel against the f64 kernel on one long sequence,
/// with the same weights and inputs. The decay's gradient (reaching `A_log` and `dt_bias`) is a
/// running sum whose terms cancel; restarted every 16 steps from an exact value, its rounding
/// stays that of a short sum: 2.8e-6 here, against 7.3e-5 without the restarts.
#[test]
fn f32_kernel_gradients_hold_over_a_long_sequence() {
    let config = Mamba2Config::new(32, 1).with_d_state(16).with_headdim(16);
    let (batch, len) = (1, 4096);
    let shape = [batch, len, config.d_model];
    let device = Default::default();
    NdF64Grad::seed(&device, 11);
    let mixer64 = Mamba2Mixer::<NdF64Grad>::init(&config, &device).unwrap();
    let numel = shape.iter().product();
    let (u, wy) = (normal_values(numel, 12), normal_values(numel, 13));
    // The same weights in f32, through a full-precision record.
    let recorder = NamedMpkBytesRecorder::<DoublePrecisionSettings>::default();
    let bytes = recorder.record(mixer64.clone().into_record(), ()).unwrap();
    let device32 = Default::default();
    let record = recorder.load(bytes, &device32).unwrap();
    let mixer32 = Mamba2Mixer::<FlexF32Grad>::init(&config, &device32).unwrap().load_record(record);

    let want = mixer_grads(&mixer64, &u, &wy, shape);
    let got = mixer_grads(&mixer32, &u, &wy, shape);
    let mut worst = (0.0f64, String::new());
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        let d = rel_diff(g, w);
        assert!(d <= 2e-5, "L {len}: {name} differs by {d:e} between f32 and f64 (tolerance 2e-5)");
        if d > worst.0 {
            worst = (d, name.clone());
        }
    }
    println!("L {len}, f32 against f64: worst relative difference {:e} ({})", worst.0, worst.1);
}
