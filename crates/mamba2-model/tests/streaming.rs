//! `StreamingStack` (the host inference path) against the tensor model's `step` and `forward`.

use crate::common::{normal, tiny_config, FlexF32, NdF64};
use burn::prelude::*;
use mamba2_model::{HostFloat, Mamba2Config, Mamba2Stack, ModelError, StreamingStack};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};

fn configs() -> Vec<(&'static str, Mamba2Config)> {
    vec![
        ("G1", tiny_config(1)),
        ("G2 bias", tiny_config(2)),
        (
            "D per channel, norm first, dt limit",
            tiny_config(1).with_d_has_hdim(true).with_norm_before_gate(true).with_dt_limit_hi(Some(0.05)),
        ),
        ("no conv bias, 3 layers", Mamba2Config::new(8, 3).with_d_state(16).with_headdim(4).with_conv_bias(false)),
        // in_proj's 296 outputs are several column panels, split between the two threads.
        ("wider", Mamba2Config::new(64, 1).with_d_state(16).with_headdim(16)),
    ]
}

/// Prefill with `forward`, then `steps` rows with the tensor model's `step` and with the host
/// path started from the prefill's state, with or without its helper thread; returns the worst
/// relative difference per step.
fn compare<B: Backend, T: HostFloat>(config: &Mamba2Config, batch: usize, steps: usize, helper: bool) -> f64 {
    let device = Default::default();
    B::seed(&device, 11);
    let stack = Mamba2Stack::<B>::init(config, &device).unwrap();
    let d = config.d_model;
    let prefix = normal::<B, 3>([batch, 9, d], 12, &device);
    let rows = normal::<B, 3>([batch, steps, d], 13, &device);
    let (_, mut state) = stack.forward(prefix, None).unwrap();

    let host = StreamingStack::<T>::new(&stack);
    let mut hstate = host.state_from(&state).unwrap().with_helper(helper);
    let mut out = vec![T::from_elem(0.0); batch * d];
    let mut worst = 0.0f64;
    for t in 0..steps {
        let row = rows.clone().narrow(1, t, 1).reshape([batch, d]);
        let (want, next) = stack.step(row.clone(), state).unwrap();
        state = next;
        let u: Vec<T> = row.into_data().convert::<T>().into_vec().unwrap();
        host.step(&mut hstate, &u, &mut out).unwrap();
        let got: Vec<f64> = out.iter().map(|v| v.elem::<f64>()).collect();
        worst = worst.max(rel_diff(&got, &to_f64_vec(want)));
    }
    // The host state handed back to the tensor model continues the same sequence.
    let back = host.state_to::<B>(&hstate, &device);
    for (a, b) in back.layers.iter().zip(&state.layers) {
        worst = worst.max(rel_diff(&to_f64_vec(a.ssm.clone()), &to_f64_vec(b.ssm.clone())));
        worst = worst.max(rel_diff(&to_f64_vec(a.conv.clone()), &to_f64_vec(b.conv.clone())));
    }
    worst
}

#[test]
fn host_steps_equal_tensor_steps_in_f64() {
    for (name, config) in configs() {
        for (batch, helper) in [(1, false), (3, false), (1, true), (3, true)] {
            let d = compare::<NdF64, f64>(&config, batch, 40, helper);
            assert!(d <= 1e-10, "{name}, batch {batch}, helper {helper}: host step differs by {d:e}");
        }
    }
}

#[test]
fn host_steps_equal_tensor_steps_in_f32() {
    for (name, config) in configs() {
        for helper in [false, true] {
            let d = compare::<FlexF32, f32>(&config, 2, 40, helper);
            assert!(d <= 1e-4, "{name}, helper {helper}: host step differs by {d:e}");
        }
    }
}

#[test]
fn wrong_sizes_are_errors() {
    let device = Default::default();
    let config = tiny_config(1);
    let stack = Mamba2Stack::<NdF64>::init(&config, &device).unwrap();
    let host = StreamingStack::<f64>::new(&stack);
    let mut state = host.zero_state(2);
    let mut out = vec![0.0; 2 * config.d_model];
    let err = host.step(&mut state, &[0.0; 3], &mut out).unwrap_err();
    assert!(matches!(err, ModelError::State { .. }), "{err}");

    let three = Mamba2Config { n_layer: 3, ..config.clone() };
    let other = Mamba2Stack::<NdF64>::init(&three, &device).unwrap();
    let (_, s3) = other.forward(Tensor::zeros([1, 2, config.d_model], &device), None).unwrap();
    assert!(matches!(host.state_from(&s3), Err(ModelError::State { .. })));
}
