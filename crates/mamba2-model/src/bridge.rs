//! The one place the model meets the host kernels of `mamba2-cpu`: on the CPU backends a layer
//! (the mixer, or the whole block with its norm and residual, and the stack's final norm after
//! its last block) runs as one call into that crate, with its backward registered in Burn's
//! autodiff graph as one node whose parents are the layer's input, state and weights.
//!
//! The model stays generic over `B: Backend`; the choice is made at run time from the concrete
//! backend type (`Flex`, `NdArray<f32>`, `NdArray<f64>` and their `Autodiff` wrappers), see
//! [`runs_on_host`]. Every other backend (CUDA, Wgpu, ...) and every call inside
//! [`with_generic_path`] runs the modules' tensor code, which stays the reference:
//! `tests/fast_path.rs` checks that both agree on outputs and on every gradient.

use std::any::{Any, TypeId};
use std::cell::Cell;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::{CheckpointStrategy, NoCheckpointing};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::{Element, TensorData, TensorPrimitive};
use mamba2_cpu::{layer, Dims, LayerGrads, LayerPlan, LayerSaved, Picks};

use crate::{Mamba2Block, Mamba2Config, Mamba2Mixer, MixerState, ModelError, RmsNorm};

/// The float types the host paths run in, `f32` and `f64`: what the kernels compute in and what
/// Burn's tensors can hold.
pub trait HostFloat: mamba2_cpu::HostFloat + Element {}
impl HostFloat for f32 {}
impl HostFloat for f64 {}

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

/// The concrete CPU backends the host kernels serve: the one list both [`runs_on_host`] and
/// [`run`] read, so that a backend cannot be routed by one and missed by the other.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route {
    AutodiffFlex,
    AutodiffNdArrayF64,
    AutodiffNdArrayF32,
    Flex,
    NdArrayF64,
    NdArrayF32,
}

pub(crate) fn route<B: Backend>() -> Option<Route> {
    let routes = [
        (TypeId::of::<Autodiff<Flex>>(), Route::AutodiffFlex),
        (TypeId::of::<Autodiff<NdArray<f64>>>(), Route::AutodiffNdArrayF64),
        (TypeId::of::<Autodiff<NdArray<f32>>>(), Route::AutodiffNdArrayF32),
        (TypeId::of::<Flex>(), Route::Flex),
        (TypeId::of::<NdArray<f64>>(), Route::NdArrayF64),
        (TypeId::of::<NdArray<f32>>(), Route::NdArrayF32),
    ];
    let b = TypeId::of::<B>();
    routes.into_iter().find(|(t, _)| *t == b).map(|(_, r)| r)
}

/// Whether `B` is one of the CPU backends the host kernels serve: Flex, NdArray f32 or f64, with
/// or without autodiff. Every other backend (CUDA, WebGPU) runs the generic tensor-op path.
pub fn is_cpu_backend<B: Backend>() -> bool {
    route::<B>().is_some()
}

/// Whether layers on backend `B` run on the host kernels here: a CPU backend, outside
/// [`with_generic_path`].
pub(crate) fn runs_on_host<B: Backend>() -> bool {
    !GENERIC_ONLY.with(Cell::get) && is_cpu_backend::<B>()
}

/// The kernel's view of a config, for `batch` rows of `len` steps.
pub(crate) fn kernel_dims(c: &Mamba2Config, batch: usize, len: usize) -> Dims {
    let (lo, hi) = c.dt_limit();
    Dims {
        batch,
        len,
        d_model: c.d_model,
        nheads: c.nheads(),
        headdim: c.headdim,
        ngroups: c.ngroups,
        d_state: c.d_state,
        d_conv: c.d_conv,
        d_per_channel: c.d_has_hdim,
        dt_lo: lo,
        dt_hi: hi,
        gate_first: !c.norm_before_gate,
        eps: c.norm_eps,
    }
}

/// The mixer over one piece of a sequence on the host kernels (only where [`runs_on_host`]).
///
/// # Shapes
/// - `u`: `[batch, L, d_model]`; output: `[batch, L, d_model]` and the state after it
pub(crate) fn mixer<B: Backend>(m: &Mamba2Mixer<B>, u: Tensor<B, 3>, state: Option<MixerState<B>>) -> (Tensor<B, 3>, MixerState<B>) {
    run(parents_of(m, u, state, None, None, None))
}

/// The block `h + mixer(norm(h))` over one piece of a sequence on the host kernels, followed by
/// `post_norm` when given (the stack's final norm after its last block), in one node; its output
/// only at `picks`' rows of each sequence when given (which must fit `L`).
///
/// # Shapes
/// - `h`: `[batch, L, d_model]`; output: `[batch, L or picks.n, d_model]` and the state after it
pub(crate) fn block<B: Backend>(
    block: &Mamba2Block<B>,
    h: Tensor<B, 3>,
    state: Option<MixerState<B>>,
    post_norm: Option<&RmsNorm<B>>,
    picks: Option<Picks>,
) -> Result<(Tensor<B, 3>, MixerState<B>), ModelError> {
    if let Some(s) = &state {
        block.mixer.check_state(s, h.dims()[0])?;
    }
    Ok(run(parents_of(&block.mixer, h, state, Some(&block.norm), post_norm, picks)))
}

/// A layer's inputs by name; `X` is what each holds along the way (a tensor, a host buffer, a
/// gradient, a shape). The autodiff node takes them as an array: [`Parents::into_array`] and
/// [`Parents::from_array`] are the only places that order is written.
#[derive(Debug, Clone)]
struct Parents<X> {
    u: X,
    in_w: X,
    in_b: X,
    tail: X,
    h0: X,
    conv_w: X,
    conv_b: X,
    dt_bias: X,
    a_log: X,
    d: X,
    norm_w: X,
    out_w: X,
    out_b: X,
    pre_w: X,
    post_w: X,
}

const PARENTS: usize = 15;

impl<X> Parents<X> {
    fn into_array(self) -> [X; PARENTS] {
        let Parents { u, in_w, in_b, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w, out_w, out_b, pre_w, post_w } = self;
        [u, in_w, in_b, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w, out_w, out_b, pre_w, post_w]
    }

    fn from_array(parts: [X; PARENTS]) -> Self {
        let [u, in_w, in_b, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w, out_w, out_b, pre_w, post_w] = parts;
        Parents { u, in_w, in_b, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w, out_w, out_b, pre_w, post_w }
    }

    fn map<Y>(self, f: impl FnMut(X) -> Y) -> Parents<Y> {
        Parents::from_array(self.into_array().map(f))
    }

    /// Each input paired with the same input's entry of `other`.
    fn zip<Y>(self, other: Parents<Y>) -> Parents<(X, Y)> {
        let mut other = other.into_array().into_iter();
        self.map(|x| (x, other.next().expect("as many as self")))
    }
}

/// A layer's call: its sizes, the rows its output is wanted at, and its inputs as flat tensors,
/// `None` for an absent one.
struct LayerCall<B: Backend> {
    dims: Dims,
    picks: Option<Picks>,
    parents: Parents<Option<Tensor<B, 2>>>,
}

fn flat<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 2> {
    let n = t.shape().num_elements();
    t.reshape([1, n])
}

fn parents_of<B: Backend>(
    m: &Mamba2Mixer<B>,
    u: Tensor<B, 3>,
    state: Option<MixerState<B>>,
    pre_norm: Option<&RmsNorm<B>>,
    post_norm: Option<&RmsNorm<B>>,
    picks: Option<Picks>,
) -> LayerCall<B> {
    let c = m.config();
    let [batch, len, _] = u.dims();
    let weight = |w: &Param<Tensor<B, 1>>| Some(flat(w.val()));
    let bias = |b: &Option<Param<Tensor<B, 1>>>| b.as_ref().map(|b| flat(b.val()));
    let (tail, h0) = match state {
        Some(MixerState { conv, ssm }) => (Some(flat(conv)), Some(flat(ssm))),
        None => (None, None),
    };
    LayerCall {
        dims: kernel_dims(c, batch, len),
        picks,
        parents: Parents {
            u: Some(flat(u)),
            in_w: Some(m.in_proj.weight.val()),
            in_b: bias(&m.in_proj.bias),
            tail,
            h0,
            conv_w: Some(m.conv1d.weight.val().reshape([c.conv_dim(), c.d_conv])),
            conv_b: bias(&m.conv1d.bias),
            dt_bias: weight(&m.dt_bias),
            a_log: weight(&m.a_log),
            d: weight(&m.d),
            norm_w: weight(&m.norm.weight),
            out_w: Some(m.out_proj.weight.val()),
            out_b: bias(&m.out_proj.bias),
            pre_w: pre_norm.map(|n| flat(n.weight.val())),
            post_w: post_norm.map(|n| flat(n.weight.val())),
        },
    }
}

/// The layer on the host kernels, on the concrete backend `B` is.
fn run<B: Backend>(call: LayerCall<B>) -> (Tensor<B, 3>, MixerState<B>) {
    /// `x` as the type it is: `B` and the route's backend are one type.
    fn same<X: 'static, Y: 'static>(x: X) -> Y {
        *(Box::new(x) as Box<dyn Any>).downcast::<Y>().expect("the route names B's own type")
    }
    let out: LayerOut<B> = match route::<B>().expect("bridge::run is only called where runs_on_host holds") {
        Route::AutodiffFlex => same(tracked::<Flex, NoCheckpointing, f32>(same(call))),
        Route::AutodiffNdArrayF64 => same(tracked::<NdArray<f64>, NoCheckpointing, f64>(same(call))),
        Route::AutodiffNdArrayF32 => same(tracked::<NdArray<f32>, NoCheckpointing, f32>(same(call))),
        Route::Flex => same(plain::<Flex, f32>(same(call))),
        Route::NdArrayF64 => same(plain::<NdArray<f64>, f64>(same(call))),
        Route::NdArrayF32 => same(plain::<NdArray<f32>, f32>(same(call))),
    };
    (out.y, MixerState { conv: out.conv, ssm: out.ssm })
}

/// What the layer gives back: its output and the state after the last step.
struct LayerOut<B: Backend> {
    /// `[batch, L, d_model]`.
    y: Tensor<B, 3>,
    /// `[batch, nheads, headdim, d_state]`.
    ssm: Tensor<B, 4>,
    /// `[batch, d_conv - 1, conv_dim]`.
    conv: Tensor<B, 3>,
}

/// A float primitive's values on the host: the tensor's own buffer, read in place, when it holds
/// `T` suitably aligned (the usual case, and no copy beyond Burn's own), else a converted copy.
#[derive(Debug)]
pub(crate) enum HostBuf<T> {
    /// A Flex tensor shares its buffer: this is a view, no copy at all.
    Flex(FlexTensor),
    Data(TensorData),
    Owned(Vec<T>),
}

impl<T: HostFloat> HostBuf<T> {
    pub(crate) fn get(&self) -> &[T] {
        match self {
            HostBuf::Flex(t) => t.as_slice::<T>().expect("checked when made"),
            HostBuf::Data(data) => data.as_slice::<T>().expect("checked when made"),
            HostBuf::Owned(values) => values,
        }
    }
}

pub(crate) fn host<B: Backend, T: HostFloat>(t: B::FloatTensorPrimitive) -> HostBuf<T> {
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

pub(crate) fn to_device<B: Backend, T: Element>(values: Vec<T>, shape: Vec<usize>, device: &B::Device) -> B::FloatTensorPrimitive {
    B::float_from_data(TensorData::new(values, shape).convert_dtype(B::FloatElem::dtype()), device)
}

/// The host copies of a layer's inputs.
#[derive(Debug)]
struct HostArgs<T> {
    dims: Dims,
    picks: Option<Picks>,
    bufs: Parents<Option<HostBuf<T>>>,
}

impl<T: HostFloat> HostArgs<T> {
    /// The kernel's plan: every input by name, the required ones unwrapped.
    fn plan(&self) -> LayerPlan<'_, T> {
        fn opt<T: HostFloat>(v: &Option<HostBuf<T>>) -> Option<&[T]> {
            v.as_ref().map(HostBuf::get)
        }
        fn req<T: HostFloat>(v: &Option<HostBuf<T>>) -> &[T] {
            opt(v).expect("the input and the weights are always given")
        }
        let b = &self.bufs;
        LayerPlan {
            dims: self.dims,
            u: req(&b.u),
            in_w: req(&b.in_w),
            in_b: opt(&b.in_b),
            tail: opt(&b.tail),
            h0: opt(&b.h0),
            conv_w: req(&b.conv_w),
            conv_b: opt(&b.conv_b),
            dt_bias: req(&b.dt_bias),
            a_log: req(&b.a_log),
            d: req(&b.d),
            norm_w: req(&b.norm_w),
            out_w: req(&b.out_w),
            out_b: opt(&b.out_b),
            pre_w: opt(&b.pre_w),
            post_w: opt(&b.post_w),
            picks: self.picks,
        }
    }

    /// Each input's shape, for the gradients handed back to Burn (the flat `[1, n]` of
    /// [`flat`], the weight matrices as they are).
    fn shapes(&self) -> Parents<Vec<usize>> {
        let dims = self.dims;
        let (b, l, k, cd) = (dims.batch, dims.len, dims.d_conv, dims.conv_dim());
        let (dm, w, di, h) = (dims.d_model, dims.width(), dims.d_inner(), dims.nheads);
        let row = |n: usize| vec![1, n];
        Parents {
            u: row(b * l * dm),
            in_w: vec![dm, w],
            in_b: row(w),
            tail: row(b * (k - 1) * cd),
            h0: row(b * dims.state_len()),
            conv_w: vec![cd, k],
            conv_b: row(cd),
            dt_bias: row(h),
            a_log: row(h),
            d: row(self.bufs.d.as_ref().map_or(0, |d| d.get().len())),
            norm_w: row(di),
            out_w: vec![di, dm],
            out_b: row(dm),
            pre_w: row(dm),
            post_w: row(dm),
        }
    }
}

/// The kernel's gradients under the node's names.
fn by_name<T>(g: LayerGrads<T>) -> Parents<Vec<T>> {
    let LayerGrads { u, in_w, in_b, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w, out_w, out_b, pre_w, post_w } = g;
    Parents { u, in_w, in_b, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w, out_w, out_b, pre_w, post_w }
}

fn prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> B::FloatTensorPrimitive {
    t.into_primitive().tensor()
}

/// The packed output `[y | final state | conv tail]` as the layer's three outputs.
fn unpack<B: Backend>(dims: &Dims, picks: Option<Picks>, packed: Tensor<B, 1>) -> LayerOut<B> {
    let [ny, ns, nt] = layer::packed_parts(dims, picks);
    let (b, l, k) = (dims.batch, picks.map_or(dims.len, |p| p.n), dims.d_conv);
    LayerOut {
        y: packed.clone().narrow(0, 0, ny).reshape([b, l, dims.d_model]),
        ssm: packed.clone().narrow(0, ny, ns).reshape([b, dims.nheads, dims.headdim, dims.d_state]),
        conv: packed.narrow(0, ny + ns, nt).reshape([b, k - 1, dims.conv_dim()]),
    }
}

/// The forward on a backend without autodiff: each output its own tensor, no packed copy.
fn plain<B: Backend, T: HostFloat>(call: LayerCall<B>) -> LayerOut<B> {
    let (dims, picks) = (call.dims, call.picks);
    let device = call.parents.u.as_ref().expect("the input is always given").device();
    let args = HostArgs::<T> { dims, picks, bufs: call.parents.map(|t| t.map(|t| host::<B, T>(prim(t)))) };
    let (mut y, _) = layer::forward(&args.plan(), false);
    let [ny, ns, _] = layer::packed_parts(&dims, picks);
    let mut state = y.split_off(ny);
    let conv = state.split_off(ns);
    let (b, k) = (dims.batch, dims.d_conv);
    fn tensor<B: Backend, T: HostFloat, const D: usize>(values: Vec<T>, shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
        Tensor::from_primitive(TensorPrimitive::Float(to_device::<B, T>(values, shape.to_vec(), device)))
    }
    LayerOut {
        y: tensor::<B, T, 3>(y, [b, picks.map_or(dims.len, |p| p.n), dims.d_model], &device),
        ssm: tensor::<B, T, 4>(state, [b, dims.nheads, dims.headdim, dims.d_state], &device),
        conv: tensor::<B, T, 3>(conv, [b, k - 1, dims.conv_dim()], &device),
    }
}

/// The backward node: holds the host inputs and what the forward saved.
#[derive(Debug)]
struct LayerBackward<T>(std::marker::PhantomData<T>);

#[derive(Debug, Clone)]
struct NodeState<T: HostFloat, D: Clone + Send + std::fmt::Debug + 'static> {
    args: Arc<HostArgs<T>>,
    saved: Arc<LayerSaved<T>>,
    device: D,
}

impl<B: Backend, T: HostFloat> Backward<B, PARENTS> for LayerBackward<T> {
    type State = NodeState<T, B::Device>;

    fn backward(self, ops: Ops<Self::State, PARENTS>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let NodeState { args, saved, device } = ops.state;
        let gout = host::<B, T>(grads.consume::<B>(&ops.node));
        let parents = Parents::from_array(ops.parents);
        let g = by_name(layer::backward(&args.plan(), &saved, gout.get(), parents.u.is_some()));
        for ((parent, values), shape) in parents.zip(g).zip(args.shapes()).into_array() {
            if let Some(node) = parent {
                grads.register::<B>(node.id, to_device::<B, T>(values, shape, &device));
            }
        }
    }
}

/// The forward on `Autodiff<B>`, registering [`LayerBackward`] when any input is tracked.
fn tracked<B: Backend, C: CheckpointStrategy, T: HostFloat>(call: LayerCall<Autodiff<B, C>>) -> LayerOut<Autodiff<B, C>> {
    let (dims, picks) = (call.dims, call.picks);
    let device = call.parents.u.as_ref().expect("the input is always given").device();
    // Absent inputs become an untracked placeholder, so that the node always has the same parents.
    let present = call.parents.clone().map(|t| t.is_some());
    let parts = call.parents.map(|t| prim(t.unwrap_or_else(|| Tensor::<Autodiff<B, C>, 2>::zeros([1, 1], &device))));
    let nodes = parts.clone().map(|p| p.node).into_array();
    let inner_device: B::Device = device.clone();
    let bufs = parts.zip(present).map(|(p, here)| here.then(|| host::<B, T>(p.primitive)));
    let args = HostArgs::<T> { dims, picks, bufs };
    let len = layer::packed_parts(&dims, picks).iter().sum::<usize>();
    let out = match LayerBackward::<T>(std::marker::PhantomData).prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, saved) = layer::forward(&args.plan(), true);
            let out = to_device::<B, T>(out, vec![len], &inner_device);
            let saved = saved.expect("kept when asked");
            prep.finish(NodeState { args: Arc::new(args), saved: Arc::new(saved), device: inner_device }, out)
        }
        OpsKind::UnTracked(prep) => {
            let (out, _) = layer::forward(&args.plan(), false);
            prep.finish(to_device::<B, T>(out, vec![len], &inner_device))
        }
    };
    unpack(&dims, picks, Tensor::from_primitive(TensorPrimitive::Float(out)))
}
