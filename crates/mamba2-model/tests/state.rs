//! The recurrent state: one forward = the same forward split into pieces = step by step, and a
//! row's output does not depend on the rest of its batch.

use crate::common::*;
use burn::prelude::*;
use mamba2_model::{Mamba2State, Mamba2TimeSeries, ModelError};
use mamba2_tensor::compare::tensor_rel_diff;

fn state_diff<B: Backend>(a: &Mamba2State<B>, b: &Mamba2State<B>) -> f64 {
    a.layers
        .iter()
        .zip(&b.layers)
        .map(|(x, y)| tensor_rel_diff(x.conv.clone(), y.conv.clone()).max(tensor_rel_diff(x.ssm.clone(), y.ssm.clone())))
        .fold(0.0, f64::max)
}

fn split_and_step_agree<B: Backend>(device: &B::Device, tol: f64) {
    for g in [1, 2] {
        let model: Mamba2TimeSeries<B> = tiny_ts(g).init(device).unwrap();
        let len = 13;
        let x = wave::<B>(2, len, 3, device);
        let (whole, whole_state) = model.forward(x.clone(), None).unwrap();

        // Pieces cut inside the conv window (1 and 2 rows), at and across chunk borders.
        for cuts in [vec![1, 2, 3, 7], vec![4, 8], vec![5], vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]] {
            let mut bounds = vec![0];
            bounds.extend(&cuts);
            bounds.push(len);
            let mut state = None;
            let mut outs = Vec::new();
            for w in bounds.windows(2) {
                let (y, s) = model.forward(x.clone().narrow(1, w[0], w[1] - w[0]), state).unwrap();
                outs.push(y);
                state = Some(s);
            }
            let dy = tensor_rel_diff(Tensor::cat(outs, 1), whole.clone());
            let ds = state_diff(&state.unwrap(), &whole_state);
            assert!(dy <= tol && ds <= tol, "ngroups {g}, cuts {cuts:?}: outputs {dy:e}, states {ds:e}");
        }

        let mut state = model.zero_state(2, device);
        let mut outs = Vec::new();
        for t in 0..len {
            let (y, s) = model.step(x.clone().narrow(1, t, 1).reshape([2, 3]), state).unwrap();
            outs.push(y.unsqueeze_dim::<3>(1));
            state = s;
        }
        let dy = tensor_rel_diff(Tensor::cat(outs, 1), whole.clone());
        let ds = state_diff(&state, &whole_state);
        println!("ngroups {g}: step by step vs forward: outputs {dy:e}, states {ds:e}");
        assert!(dy <= tol && ds <= tol, "ngroups {g}: step by step differs: outputs {dy:e}, states {ds:e}");

        // A prefill then steps: the streaming use.
        let (_, mut state) = model.forward(x.clone().narrow(1, 0, 6), None).unwrap();
        let mut outs = Vec::new();
        for t in 6..len {
            let (y, s) = model.step(x.clone().narrow(1, t, 1).reshape([2, 3]), state).unwrap();
            outs.push(y.unsqueeze_dim::<3>(1));
            state = s;
        }
        let dy = tensor_rel_diff(Tensor::cat(outs, 1), whole.clone().narrow(1, 6, len - 6));
        assert!(dy <= tol, "ngroups {g}: prefill + steps differ by {dy:e}");
    }
}

#[test]
fn forward_split_and_step_agree_in_f64() {
    split_and_step_agree::<NdF64>(&Default::default(), 1e-10);
}

#[test]
fn forward_split_and_step_agree_in_f32() {
    split_and_step_agree::<FlexF32>(&Default::default(), 1e-5);
}

#[cfg(feature = "cuda")]
#[test]
fn forward_split_and_step_agree_on_cuda() {
    split_and_step_agree::<CudaF32>(&Default::default(), 1e-4);
}

#[cfg(feature = "wgpu")]
#[test]
fn forward_split_and_step_agree_on_wgpu() {
    split_and_step_agree::<WgpuF32>(&Default::default(), 1e-4);
}

#[test]
fn rows_do_not_depend_on_their_batch() {
    let device = Default::default();
    let model: Mamba2TimeSeries<NdF64> = tiny_ts(2).init(&device).unwrap();
    let x8 = wave::<NdF64>(8, 10, 3, &device);
    let (y8, _) = model.forward(x8.clone(), None).unwrap();
    for (start, size) in [(0, 1), (2, 1), (3, 3), (5, 3)] {
        let (y, _) = model.forward(x8.clone().narrow(0, start, size), None).unwrap();
        let d = tensor_rel_diff(y, y8.clone().narrow(0, start, size));
        assert!(d <= 1e-13, "rows {start}..{} alone differ from within batch 8 by {d:e}", start + size);
    }
    // Changing other rows leaves row 0 alone.
    let other = Tensor::cat(vec![x8.clone().narrow(0, 0, 1), x8.clone().narrow(0, 1, 7).mul_scalar(-3.0)], 0);
    let (y, _) = model.forward(other, None).unwrap();
    assert!(tensor_rel_diff(y.narrow(0, 0, 1), y8.narrow(0, 0, 1)) <= 1e-13);
}

#[test]
fn a_state_for_another_batch_is_an_error() {
    let device = Default::default();
    let model: Mamba2TimeSeries<NdF64> = tiny_ts(1).init(&device).unwrap();
    let (_, state) = model.forward(wave::<NdF64>(3, 5, 3, &device), None).unwrap();
    let err = model.forward(wave::<NdF64>(2, 5, 3, &device), Some(state.clone())).unwrap_err();
    assert!(matches!(err, ModelError::State { .. }), "{err}");
    assert_eq!(err.to_string(), "state does not fit: state is for batch 3, the input has 2 rows");
    let err = model.step(Tensor::zeros([2, 3], &device), state).unwrap_err();
    assert!(matches!(err, ModelError::State { .. }));
}

#[test]
fn gradients_flow_through_the_state_both_ways() {
    type B = NdF64Grad;
    let device = Default::default();
    let model: Mamba2TimeSeries<B> = tiny_ts(1).init(&device).unwrap();
    let x1 = wave::<B>(2, 6, 3, &device).require_grad();
    let building = mamba2_tensor::graph::recording();
    let (_, state) = model.forward(x1.clone(), None).unwrap();
    let (y2, _) = model.forward(wave::<B>(2, 4, 3, &device), Some(state.clone())).unwrap();
    let loss = y2.sum();
    drop(building);
    let grads = mamba2_tensor::graph::backward(loss);
    let g = x1.grad(&grads).expect("the second call's loss reaches the first call's input");
    assert!(mamba2_tensor::compare::to_f64_vec(g).iter().any(|v| *v != 0.0));
    // Detaching cuts it (truncated BPTT).
    let building = mamba2_tensor::graph::recording();
    let (y2, _) = model.forward(wave::<B>(2, 4, 3, &device), Some(state.detach())).unwrap();
    let loss = y2.sum();
    drop(building);
    let grads = mamba2_tensor::graph::backward(loss);
    assert!(x1.grad(&grads).is_none());
}

#[test]
fn greedy_generation_follows_the_full_forward() {
    use mamba2_model::Mamba2LM;
    let device = Default::default();
    let model: Mamba2LM<NdF64> = tiny_lm(2).init(&device).unwrap();
    let prompt = vec![3i64, 1, 4, 1, 5];
    let ids = Tensor::<NdF64, 2, Int>::from_data(TensorData::new(prompt.clone(), [1, 5]), &device);
    let generated = model.generate_greedy(ids, 6).unwrap();
    assert_eq!(generated.len(), 1);
    assert_eq!(generated[0].len(), 6);
    // Each generated token is the argmax of a full forward over everything before it.
    let mut seq = prompt;
    for &tok in &generated[0] {
        let n = seq.len();
        let ids = Tensor::<NdF64, 2, Int>::from_data(TensorData::new(seq.clone(), [1, n]), &device);
        let logits = model.forward(ids, None).unwrap().logits.narrow(1, n - 1, 1).reshape([11]);
        let best = logits.argmax(0).into_data().convert::<i64>().to_vec::<i64>().unwrap()[0];
        assert_eq!(tok, best, "generation after {n} tokens");
        seq.push(tok);
    }
}

#[test]
fn sequences_longer_than_a_piece_equal_the_step_by_step_recurrence() {
    // forward cuts sequences over MAX_PIECE rows into pieces; the joins must not show, in the
    // outputs or in the final state.
    let device = Default::default();
    let model: Mamba2TimeSeries<NdF64> = tiny_ts(2).init(&device).unwrap();
    let len = 2 * mamba2_model::MAX_PIECE + 7;
    let x = wave::<NdF64>(1, len, 3, &device);
    let (whole, whole_state) = model.forward(x.clone(), None).unwrap();
    let mut state = model.zero_state(1, &device);
    let mut outs = Vec::new();
    for t in 0..len {
        let (y, s) = model.step(x.clone().narrow(1, t, 1).reshape([1, 3]), state).unwrap();
        outs.push(y.unsqueeze_dim::<3>(1));
        state = s;
    }
    let dy = tensor_rel_diff(Tensor::cat(outs, 1), whole);
    let ds = state_diff(&state, &whole_state);
    assert!(dy <= 1e-10 && ds <= 1e-10, "L {len}: outputs {dy:e}, states {ds:e}");
}
