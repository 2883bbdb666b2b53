//! Routes the mixer's core to the CPU kernel ([`crate::kernel`]) on the CPU backends, with a
//! hand-written backward registered in Burn's autodiff graph.
//!
//! The model stays generic over `B: Backend`; the choice is made at run time from the concrete
//! backend type (`Flex`, `NdArray<f32>`, `NdArray<f64>` and their `Autodiff` wrappers). Every
//! other backend (CUDA, Wgpu, ...) and every call inside [`with_generic_path`] runs the generic
//! tensor-op path, which stays the reference: `tests/fast_path.rs` checks that both agree on
//! outputs and on every gradient.

use std::any::Any;
use std::cell::Cell;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::{CheckpointStrategy, NoCheckpointing};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::prelude::*;
use burn::tensor::{Element, TensorData, TensorPrimitive};

use crate::kernel::{self, Dims, Inputs, Params, HostFloat};

thread_local! {
    static GENERIC_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the CPU kernel switched off on this thread, so that every mixer takes the
/// generic tensor-op path. For checking one path against the other, and for benchmarks.
pub fn with_generic_path<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GENERIC_ONLY.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GENERIC_ONLY.with(|g| g.replace(true)));
    f()
}

/// The core's inputs as tensors; the optional ones are absent rather than zero-filled.
pub(crate) struct CoreArgs<B: Backend> {
    pub dims: Dims,
    /// `[batch, L, width]`.
    pub zx: Tensor<B, 3>,
    /// `[batch, d_conv - 1, conv_dim]`.
    pub tail: Option<Tensor<B, 3>>,
    /// `[batch, nheads, headdim, d_state]`.
    pub h0: Option<Tensor<B, 4>>,
    /// `[conv_dim, d_conv]`.
    pub conv_w: Tensor<B, 2>,
    pub conv_b: Option<Tensor<B, 1>>,
    pub dt_bias: Tensor<B, 1>,
    pub a_log: Tensor<B, 1>,
    pub d: Tensor<B, 1>,
    pub norm_w: Tensor<B, 1>,
}

/// The core on the CPU kernel when the backend has it: the packed output
/// `[batch, L * d_inner + nheads * headdim * d_state]` (normed `y`, then the final scan state).
/// Gives the arguments back when the generic path must run.
pub(crate) fn try_core<B: Backend>(args: CoreArgs<B>) -> Result<Tensor<B, 2>, CoreArgs<B>> {
    if GENERIC_ONLY.with(Cell::get) {
        return Err(args);
    }
    let boxed: Box<dyn Any> = Box::new(args);
    macro_rules! route {
        ($boxed:ident, $backend:ty, $run:expr) => {
            let $boxed = match $boxed.downcast::<CoreArgs<$backend>>() {
                Ok(args) => {
                    let out: Tensor<$backend, 2> = $run(*args);
                    let out: Box<dyn Any> = Box::new(out);
                    return Ok(*out.downcast::<Tensor<B, 2>>().expect("same type as the arguments"));
                }
                Err(other) => other,
            };
        };
    }
    route!(boxed, Autodiff<Flex>, tracked::<Flex, NoCheckpointing, f32>);
    route!(boxed, Autodiff<NdArray<f64>>, tracked::<NdArray<f64>, NoCheckpointing, f64>);
    route!(boxed, Autodiff<NdArray<f32>>, tracked::<NdArray<f32>, NoCheckpointing, f32>);
    route!(boxed, Flex, plain::<Flex, f32>);
    route!(boxed, NdArray<f64>, plain::<NdArray<f64>, f64>);
    route!(boxed, NdArray<f32>, plain::<NdArray<f32>, f32>);
    Err(*boxed.downcast::<CoreArgs<B>>().expect("the arguments' own type"))
}

/// A float primitive's values on the host: the tensor's own buffer, read in place, when it holds
/// `T` suitably aligned (the usual case, and no copy beyond Burn's own), else a converted copy.
#[derive(Debug)]
enum HostBuf<T> {
    /// A Flex tensor shares its buffer: this is a view, no copy at all.
    Flex(FlexTensor),
    Data(TensorData),
    Owned(Vec<T>),
}

impl<T: HostFloat> HostBuf<T> {
    fn get(&self) -> &[T] {
        match self {
            HostBuf::Flex(t) => t.as_slice::<T>().expect("checked when made"),
            HostBuf::Data(data) => data.as_slice::<T>().expect("checked when made"),
            HostBuf::Owned(values) => values,
        }
    }
}

fn host<B: Backend, T: HostFloat>(t: B::FloatTensorPrimitive) -> HostBuf<T> {
    let any: Box<dyn Any> = Box::new(t);
    let t = match any.downcast::<FlexTensor>() {
        Ok(flex) if flex.as_slice::<T>().is_some() => return HostBuf::Flex(*flex),
        Ok(flex) => *(flex as Box<dyn Any>).downcast::<B::FloatTensorPrimitive>().expect("the primitive's own type"),
        Err(other) => *other.downcast::<B::FloatTensorPrimitive>().expect("the primitive's own type"),
    };
    let data = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t)).into_data();
    if data.as_slice::<T>().is_ok() {
        return HostBuf::Data(data);
    }
    HostBuf::Owned(data.convert::<T>().into_vec::<T>().expect("converted to the kernel's element type"))
}

fn to_device<B: Backend, T: Element>(values: Vec<T>, shape: Vec<usize>, device: &B::Device) -> B::FloatTensorPrimitive {
    B::float_from_data(TensorData::new(values, shape).convert_dtype(B::FloatElem::dtype()), device)
}

/// The host copies of every input, in the order of the autodiff node's parents.
#[derive(Debug)]
struct HostArgs<T> {
    dims: Dims,
    zx: HostBuf<T>,
    tail: Option<HostBuf<T>>,
    h0: Option<HostBuf<T>>,
    conv_w: HostBuf<T>,
    conv_b: Option<HostBuf<T>>,
    dt_bias: HostBuf<T>,
    a_log: HostBuf<T>,
    d: HostBuf<T>,
    norm_w: HostBuf<T>,
}

impl<T: HostFloat> HostArgs<T> {
    /// From the inputs in the order of the autodiff node's parents, `None` for an absent one.
    fn new<B: Backend>(dims: Dims, parts: [Option<B::FloatTensorPrimitive>; PARENTS]) -> Self {
        let [zx, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w] = parts.map(|t| t.map(host::<B, T>));
        let required = |v: Option<HostBuf<T>>| v.expect("zx and the parameters other than conv_b are always given");
        Self {
            dims,
            zx: required(zx),
            tail,
            h0,
            conv_w: required(conv_w),
            conv_b,
            dt_bias: required(dt_bias),
            a_log: required(a_log),
            d: required(d),
            norm_w: required(norm_w),
        }
    }
    fn inputs(&self) -> Inputs<'_, T> {
        Inputs { zx: self.zx.get(), tail: self.tail.as_ref().map(HostBuf::get), h0: self.h0.as_ref().map(HostBuf::get) }
    }
    fn params(&self) -> Params<'_, T> {
        Params {
            conv_w: self.conv_w.get(),
            conv_b: self.conv_b.as_ref().map(HostBuf::get),
            dt_bias: self.dt_bias.get(),
            a_log: self.a_log.get(),
            d: self.d.get(),
            norm_w: self.norm_w.get(),
        }
    }
}

fn prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> B::FloatTensorPrimitive {
    t.into_primitive().tensor()
}

/// The forward on a backend without autodiff.
fn plain<B: Backend, T: HostFloat>(args: CoreArgs<B>) -> Tensor<B, 2> {
    let device = args.zx.device();
    let dims = args.dims;
    let parts = [
        Some(prim(args.zx)),
        args.tail.map(prim),
        args.h0.map(prim),
        Some(prim(args.conv_w)),
        args.conv_b.map(prim),
        Some(prim(args.dt_bias)),
        Some(prim(args.a_log)),
        Some(prim(args.d)),
        Some(prim(args.norm_w)),
    ];
    let host_args = HostArgs::<T>::new::<B>(dims, parts);
    let (out, _) = kernel::forward(&dims, &host_args.inputs(), &host_args.params(), false);
    Tensor::from_primitive(TensorPrimitive::Float(to_device::<B, T>(out, vec![dims.batch, dims.out_width()], &device)))
}

/// The backward node: holds the host inputs and what the forward saved.
#[derive(Debug)]
struct CoreBackward<T>(std::marker::PhantomData<T>);

#[derive(Debug, Clone)]
struct CoreState<T: HostFloat, D: Clone + Send + std::fmt::Debug + 'static> {
    args: Arc<HostArgs<T>>,
    saved: Arc<kernel::Saved<T>>,
    device: D,
}

const PARENTS: usize = 9;

impl<B: Backend, T: HostFloat> Backward<B, PARENTS> for CoreBackward<T> {
    type State = CoreState<T, B::Device>;

    fn backward(self, ops: Ops<Self::State, PARENTS>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let CoreState { args, saved, device } = ops.state;
        let gout = host::<B, T>(grads.consume::<B>(&ops.node));
        let g = kernel::backward(&args.dims, &args.inputs(), &args.params(), &saved, gout.get());
        let dims = args.dims;
        let (b, l, k, cd) = (dims.batch, dims.len, dims.d_conv, dims.conv_dim());
        let (h, p, n) = (dims.nheads, dims.headdim, dims.d_state);
        let shaped: [(Vec<T>, Vec<usize>); PARENTS] = [
            (g.zx, vec![b, l, dims.width()]),
            (g.tail, vec![b, k - 1, cd]),
            (g.h0, vec![b, h, p, n]),
            (g.conv_w, vec![cd, k]),
            (g.conv_b, vec![cd]),
            (g.dt_bias, vec![h]),
            (g.a_log, vec![h]),
            (g.d, vec![args.d.get().len()]),
            (g.norm_w, vec![dims.d_inner()]),
        ];
        for (parent, (values, shape)) in ops.parents.iter().zip(shaped) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, to_device::<B, T>(values, shape, &device));
            }
        }
    }
}

/// The forward on `Autodiff<B>`, registering [`CoreBackward`] when any input is tracked.
fn tracked<B: Backend, C: CheckpointStrategy, T: HostFloat>(args: CoreArgs<Autodiff<B, C>>) -> Tensor<Autodiff<B, C>, 2> {
    let device = args.zx.device();
    let dims = args.dims;
    // Absent inputs become an untracked placeholder, so that the node always has nine parents.
    let present = [true, args.tail.is_some(), args.h0.is_some(), true, args.conv_b.is_some(), true, true, true, true];
    let placeholder = || Tensor::<Autodiff<B, C>, 1>::zeros([1], &device).into_primitive().tensor();
    let parts = [
        prim(args.zx),
        args.tail.map(prim).unwrap_or_else(placeholder),
        args.h0.map(prim).unwrap_or_else(placeholder),
        prim(args.conv_w),
        args.conv_b.map(prim).unwrap_or_else(placeholder),
        prim(args.dt_bias),
        prim(args.a_log),
        prim(args.d),
        prim(args.norm_w),
    ];
    let nodes = std::array::from_fn(|i| parts[i].node.clone());
    let inner_device: B::Device = device.clone();
    let host_args = HostArgs::<T>::new::<B>(dims, std::array::from_fn(|i| present[i].then(|| parts[i].primitive.clone())));
    let out = match CoreBackward::<T>(std::marker::PhantomData).prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, saved) = kernel::forward(&dims, &host_args.inputs(), &host_args.params(), true);
            let out = to_device::<B, T>(out, vec![dims.batch, dims.out_width()], &inner_device);
            prep.finish(CoreState { args: Arc::new(host_args), saved: Arc::new(saved), device: inner_device }, out)
        }
        OpsKind::UnTracked(prep) => {
            let (out, _) = kernel::forward(&dims, &host_args.inputs(), &host_args.params(), false);
            prep.finish(to_device::<B, T>(out, vec![dims.batch, dims.out_width()], &inner_device))
        }
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
