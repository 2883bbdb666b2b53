//! A computation on host slices with a hand-written backward, as one node of Burn's autodiff
//! graph on the CPU backends: the bridge's machinery (reading tensors in place, registering the
//! gradients) for kernels that live outside this crate, such as the forecaster's fused readout.
//!
//! The caller keeps the tensor version of the same computation for every other backend and for
//! [`with_generic_path`](crate::with_generic_path), and tests that both agree.

use std::any::Any;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::{CheckpointStrategy, NoCheckpointing};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Flex, NdArray};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;

use crate::bridge::{host, route, to_device, HostBuf, HostFloat, Route};

/// A computation over `N` flat inputs (some of them absent) giving one flat output, with its
/// backward.
pub trait HostOp<const N: usize>: Send + Sync + std::fmt::Debug + 'static {
    /// What the forward keeps for the backward.
    type Saved<T: HostFloat>: Send + Sync + std::fmt::Debug + 'static;

    /// The output's length.
    fn out_len(&self) -> usize;

    /// The output, and with `keep` what [`backward`](Self::backward) needs.
    fn forward<T: HostFloat>(&self, inputs: [Option<&[T]>; N], keep: bool) -> (Vec<T>, Option<Self::Saved<T>>);

    /// The gradient of each input, given the output's (`gout`); only those `wanted` are read,
    /// the others may be left empty.
    fn backward<T: HostFloat>(&self, inputs: [Option<&[T]>; N], saved: &Self::Saved<T>, gout: &[T], wanted: [bool; N]) -> [Vec<T>; N];
}

/// Whether [`host_op`] serves backend `B` on this thread: a CPU backend (Flex, NdArray f32 or
/// f64, with or without autodiff), outside [`with_generic_path`](crate::with_generic_path).
pub fn runs_on_host<B: Backend>() -> bool {
    crate::bridge::runs_on_host::<B>()
}

/// `op` over `inputs` (rank 1, flattened by the caller; `None` for an absent one) as one node:
/// the output has length `op.out_len()`, and on `Autodiff` backends the gradient of every
/// tracked input comes from [`HostOp::backward`].
///
/// # Panics
/// Where [`runs_on_host`] does not hold.
pub fn host_op<B: Backend, O: HostOp<N>, const N: usize>(op: O, inputs: [Option<Tensor<B, 1>>; N]) -> Tensor<B, 1> {
    /// `x` as the type it is: `B` and the route's backend are one type.
    fn same<X: 'static, Y: 'static>(x: X) -> Y {
        *(Box::new(x) as Box<dyn Any>).downcast::<Y>().expect("the route names B's own type")
    }
    let r = route::<B>().filter(|_| runs_on_host::<B>()).expect("host_op is only called where runs_on_host holds");
    match r {
        Route::AutodiffFlex => same(tracked::<Flex, NoCheckpointing, f32, O, N>(op, same(inputs))),
        Route::AutodiffNdArrayF64 => same(tracked::<NdArray<f64>, NoCheckpointing, f64, O, N>(op, same(inputs))),
        Route::AutodiffNdArrayF32 => same(tracked::<NdArray<f32>, NoCheckpointing, f32, O, N>(op, same(inputs))),
        Route::Flex => same(plain::<Flex, f32, O, N>(op, same(inputs))),
        Route::NdArrayF64 => same(plain::<NdArray<f64>, f64, O, N>(op, same(inputs))),
        Route::NdArrayF32 => same(plain::<NdArray<f32>, f32, O, N>(op, same(inputs))),
    }
}

fn slices<T: HostFloat, const N: usize>(bufs: &[Option<HostBuf<T>>; N]) -> [Option<&[T]>; N] {
    std::array::from_fn(|i| bufs[i].as_ref().map(HostBuf::get))
}

fn plain<B: Backend, T: HostFloat, O: HostOp<N>, const N: usize>(op: O, inputs: [Option<Tensor<B, 1>>; N]) -> Tensor<B, 1> {
    let device = inputs.iter().flatten().next().expect("at least one input").device();
    let bufs = inputs.map(|t| t.map(|t| host::<B, T>(t.into_primitive().tensor())));
    let (out, _) = op.forward(slices(&bufs), false);
    let len = out.len();
    Tensor::from_primitive(TensorPrimitive::Float(to_device::<B, T>(out, vec![len], &device)))
}

/// The node's state: the op, its inputs on the host, what the forward kept.
#[derive(Debug)]
struct Held<O, T: HostFloat, S, const N: usize> {
    op: O,
    bufs: [Option<HostBuf<T>>; N],
    saved: S,
}

#[derive(Debug)]
struct OpBackward<O, T>(std::marker::PhantomData<(O, T)>);

#[derive(Debug)]
struct NodeState<O: HostOp<N>, T: HostFloat, D, const N: usize> {
    held: Arc<Held<O, T, O::Saved<T>, N>>,
    device: D,
}

impl<O: HostOp<N>, T: HostFloat, D: Clone, const N: usize> Clone for NodeState<O, T, D, N> {
    fn clone(&self) -> Self {
        Self { held: self.held.clone(), device: self.device.clone() }
    }
}

impl<B: Backend, T: HostFloat, O: HostOp<N>, const N: usize> Backward<B, N> for OpBackward<O, T> {
    type State = NodeState<O, T, B::Device, N>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let NodeState { held, device } = ops.state;
        let gout = host::<B, T>(grads.consume::<B>(&ops.node));
        let wanted = std::array::from_fn(|i| ops.parents[i].is_some());
        let g = held.op.backward(slices(&held.bufs), &held.saved, gout.get(), wanted);
        for ((parent, values), buf) in ops.parents.into_iter().zip(g).zip(&held.bufs) {
            if let (Some(node), Some(buf)) = (parent, buf) {
                assert_eq!(values.len(), buf.get().len(), "host_op: a gradient's length differs from its input's");
                let len = values.len();
                grads.register::<B>(node.id, to_device::<B, T>(values, vec![len], &device));
            }
        }
    }
}

fn tracked<B: Backend, C: CheckpointStrategy, T: HostFloat, O: HostOp<N>, const N: usize>(
    op: O,
    inputs: [Option<Tensor<Autodiff<B, C>, 1>>; N],
) -> Tensor<Autodiff<B, C>, 1> {
    let device = inputs.iter().flatten().next().expect("at least one input").device();
    let present: [bool; N] = std::array::from_fn(|i| inputs[i].is_some());
    // Absent inputs become an untracked placeholder, so that the node always has `N` parents.
    let parts = inputs.map(|t| t.unwrap_or_else(|| Tensor::zeros([1], &device)).into_primitive().tensor());
    let nodes = std::array::from_fn(|i| parts[i].node.clone());
    let inner_device: B::Device = device.clone();
    let mut i = 0;
    let bufs = parts.map(|p| {
        let here = present[i];
        i += 1;
        here.then(|| host::<B, T>(p.primitive))
    });
    let len = op.out_len();
    let out = match OpBackward::<O, T>(std::marker::PhantomData).prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, saved) = op.forward(slices(&bufs), true);
            let out = to_device::<B, T>(out, vec![len], &inner_device);
            let held = Held { op, bufs, saved: saved.expect("kept when asked") };
            prep.finish(NodeState { held: Arc::new(held), device: inner_device }, out)
        }
        OpsKind::UnTracked(prep) => {
            let (out, _) = op.forward(slices(&bufs), false);
            prep.finish(to_device::<B, T>(out, vec![len], &inner_device))
        }
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
