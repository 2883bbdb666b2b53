//! Routes the whole mixer (`in_proj`, the core in [`crate::kernel`], `out_proj`) to host code on
//! the CPU backends, with a hand-written backward registered in Burn's autodiff graph as one node.
//! The projections run on the `gemm` crate into buffers this module owns, so that no Burn tensor
//! is allocated, zero-filled and copied between the mixer's stages.
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

use crate::kernel::{self, Dims, HostFloat, Inputs, Params};
use crate::matmul::{affine, column_sums, product, Mat};

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

/// The mixer's inputs as tensors, in the order of the autodiff node's parents; the optional ones
/// are absent rather than zero-filled.
pub(crate) struct MixerArgs<B: Backend> {
    pub dims: Dims,
    /// `[batch, L, d_model]`.
    pub u: Tensor<B, 3>,
    /// `in_proj`: `[d_model, width]` (Burn's layout) and `[width]`.
    pub in_w: Tensor<B, 2>,
    pub in_b: Option<Tensor<B, 1>>,
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
    /// `out_proj`: `[d_inner, d_model]` and `[d_model]`.
    pub out_w: Tensor<B, 2>,
    pub out_b: Option<Tensor<B, 1>>,
    /// The block around the mixer, when given: the weight `[d_model]` of the RMS norm in front of
    /// it. Then `u` is the block's input, the mixer reads its norm, and the output is `u` plus
    /// the mixer's (the residual).
    pub pre_w: Option<Tensor<B, 1>>,
    /// The stack's final RMS norm weight `[d_model]`, when this is its last layer: the output is
    /// then that norm of what it would otherwise be.
    pub post_w: Option<Tensor<B, 1>>,
}

/// What the mixer gives back: its output and the state after the last step.
pub(crate) struct MixerOut<B: Backend> {
    /// `[batch, L, d_model]`.
    pub y: Tensor<B, 3>,
    /// `[batch, nheads, headdim, d_state]`.
    pub ssm: Tensor<B, 4>,
    /// `[batch, d_conv - 1, conv_dim]`.
    pub conv: Tensor<B, 3>,
}

/// The whole mixer (`in_proj` to `out_proj`) on the CPU kernel when the backend has it. Gives
/// the arguments back when the generic path must run.
pub(crate) fn try_mixer<B: Backend>(args: MixerArgs<B>) -> Result<MixerOut<B>, MixerArgs<B>> {
    if GENERIC_ONLY.with(Cell::get) {
        return Err(args);
    }
    let boxed: Box<dyn Any> = Box::new(args);
    macro_rules! route {
        ($boxed:ident, $backend:ty, $run:expr) => {
            let $boxed = match $boxed.downcast::<MixerArgs<$backend>>() {
                Ok(args) => {
                    let out: MixerOut<$backend> = $run(*args);
                    let out: Box<dyn Any> = Box::new(out);
                    return Ok(*out.downcast::<MixerOut<B>>().expect("same type as the arguments"));
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
    Err(*boxed.downcast::<MixerArgs<B>>().expect("the arguments' own type"))
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
    u: HostBuf<T>,
    in_w: HostBuf<T>,
    in_b: Option<HostBuf<T>>,
    tail: Option<HostBuf<T>>,
    h0: Option<HostBuf<T>>,
    conv_w: HostBuf<T>,
    conv_b: Option<HostBuf<T>>,
    dt_bias: HostBuf<T>,
    a_log: HostBuf<T>,
    d: HostBuf<T>,
    norm_w: HostBuf<T>,
    out_w: HostBuf<T>,
    out_b: Option<HostBuf<T>>,
    pre_w: Option<HostBuf<T>>,
    post_w: Option<HostBuf<T>>,
}

const PARENTS: usize = 15;

impl<T: HostFloat> HostArgs<T> {
    /// From the inputs in the order of the autodiff node's parents, `None` for an absent one.
    fn new<B: Backend>(dims: Dims, parts: [Option<B::FloatTensorPrimitive>; PARENTS]) -> Self {
        let [u, in_w, in_b, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w, out_w, out_b, pre_w, post_w] =
            parts.map(|t| t.map(host::<B, T>));
        let required = |v: Option<HostBuf<T>>| v.expect("the input and the weights are always given");
        Self {
            dims,
            u: required(u),
            in_w: required(in_w),
            in_b,
            tail,
            h0,
            conv_w: required(conv_w),
            conv_b,
            dt_bias: required(dt_bias),
            a_log: required(a_log),
            d: required(d),
            norm_w: required(norm_w),
            out_w: required(out_w),
            out_b,
            pre_w,
            post_w,
        }
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
    fn inputs<'a>(&'a self, zx: &'a [T]) -> Inputs<'a, T> {
        Inputs { zx, tail: self.tail.as_ref().map(HostBuf::get), h0: self.h0.as_ref().map(HostBuf::get) }
    }
}

impl<B: Backend> MixerArgs<B> {
    /// The inputs in the order of the autodiff node's parents, `None` for an absent one.
    fn parts(self) -> (Dims, [Option<Tensor<B, 2>>; PARENTS]) {
        fn flat<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 2> {
            let n = t.shape().num_elements();
            t.reshape([1, n])
        }
        let parts = [
            Some(flat(self.u)),
            Some(self.in_w),
            self.in_b.map(flat),
            self.tail.map(flat),
            self.h0.map(flat),
            Some(self.conv_w),
            self.conv_b.map(flat),
            Some(flat(self.dt_bias)),
            Some(flat(self.a_log)),
            Some(flat(self.d)),
            Some(flat(self.norm_w)),
            Some(self.out_w),
            self.out_b.map(flat),
            self.pre_w.map(flat),
            self.post_w.map(flat),
        ];
        (self.dims, parts)
    }
}

/// What the forward keeps for the backward, beyond the inputs.
#[derive(Debug)]
struct MixerSaved<T> {
    /// The `in_proj` output, `[rows, width]`.
    zx: Vec<T>,
    /// The gated norm's output, the `out_proj` input, `[rows, d_inner]`.
    normed: Vec<T>,
    core: kernel::Saved<T>,
    /// With the block's norm: its output, the `in_proj` input (`[rows, d_model]`), and `1 / rms`
    /// per row.
    pre: Option<(Vec<T>, Vec<T>)>,
    /// With the final norm: its input (`[rows, d_model]`) and `1 / rms` per row.
    post: Option<(Vec<T>, Vec<T>)>,
}

/// Lengths of the three parts of the packed output: `y`, the final scan state, the conv tail.
fn packed_parts(dims: &Dims) -> [usize; 3] {
    [dims.rows() * dims.d_model, dims.batch * dims.state_len(), dims.batch * (dims.d_conv - 1) * dims.conv_dim()]
}

/// The source of the conv tail's row `s` for batch `b`: the last `d_conv - 1` pre-convolution
/// rows of the old tail followed by this call's rows. `Ok(row)` for a row of `zx`, `Err(row)`
/// for a row of the old tail.
fn tail_source(dims: &Dims, b: usize, s: usize) -> Result<usize, usize> {
    let k1 = dims.d_conv - 1;
    let j = dims.len + s;
    if j >= k1 {
        Ok(b * dims.len + j - k1)
    } else {
        Err(b * k1 + j)
    }
}

/// The mixer's forward on host buffers: the packed output `[y | final state | conv tail]` and,
/// with `keep`, what the backward needs.
fn mixer_forward<T: HostFloat>(a: &HostArgs<T>, keep: bool) -> (Vec<T>, Option<MixerSaved<T>>) {
    let dims = a.dims;
    let (rows, dm, w, di, cd) = (dims.rows(), dims.d_model, dims.width(), dims.d_inner(), dims.conv_dim());
    let pre = a.pre_w.as_ref().map(|pw| kernel::rms_norm(a.u.get(), pw.get(), dims.eps));
    let u = pre.as_ref().map_or(a.u.get(), |(normed, _)| normed);
    let (u, in_w) = (Mat::rows(u, dm), Mat::rows(a.in_w.get(), w));
    let zx = affine(rows, w, dm, u, in_w, a.in_b.as_ref().map(HostBuf::get), None);
    let (normed, fin, core) = kernel::forward(&dims, &a.inputs(&zx), &a.params(), keep);

    let [ny, ns, nt] = packed_parts(&dims);
    let (x, out_w) = (Mat::rows(&normed, di), Mat::rows(a.out_w.get(), dm));
    let residual = pre.is_some().then(|| a.u.get());
    let mut out = affine(rows, dm, di, x, out_w, a.out_b.as_ref().map(HostBuf::get), residual);
    let post = a.post_w.as_ref().map(|pw| {
        let (normed, rstd) = kernel::rms_norm(&out, pw.get(), dims.eps);
        (std::mem::replace(&mut out, normed), rstd)
    });
    out.reserve_exact(ns + nt);
    out.extend_from_slice(&fin);
    for i in 0..dims.batch * (dims.d_conv - 1) {
        let (b, s) = (i / (dims.d_conv - 1), i % (dims.d_conv - 1));
        match (tail_source(&dims, b, s), &a.tail) {
            (Ok(r), _) => out.extend_from_slice(&zx[r * w + di..r * w + di + cd]),
            (Err(r), Some(old)) => out.extend_from_slice(&old.get()[r * cd..(r + 1) * cd]),
            (Err(_), None) => out.resize(out.len() + cd, T::zero()),
        }
    }
    debug_assert_eq!(out.len(), ny + ns + nt);
    (out, keep.then_some(MixerSaved { zx, normed, core, pre, post }))
}

/// The mixer's backward on host buffers: the gradient of every parent, given that of the
/// packed output. With `need_u` false (the input is not tracked, as for a stack's first layer
/// fed data) the input's gradient is left empty: its product with `in_proj`'s weight is a sixth
/// of a layer's matrix work, and torch skips it too.
fn mixer_backward<T: HostFloat>(a: &HostArgs<T>, saved: &MixerSaved<T>, gout: &[T], need_u: bool) -> [Vec<T>; PARENTS] {
    let dims = a.dims;
    let (rows, dm, w, di, cd) = (dims.rows(), dims.d_model, dims.width(), dims.d_inner(), dims.conv_dim());
    let [ny, ns, _] = packed_parts(&dims);
    let (gy, rest) = gout.split_at(ny);
    let (gfin, gtail_out) = rest.split_at(ns);
    // Through the final norm first, when this is the stack's last layer.
    let (gy_post, post_w) = match (&saved.post, &a.post_w) {
        (Some((y, rstd)), Some(pw)) => {
            let (g, gw) = kernel::rms_norm_backward(y, pw.get(), rstd, gy, None);
            (Some(g), gw)
        }
        _ => (None, Vec::new()),
    };
    let gy = gy_post.as_deref().unwrap_or(gy);

    // out_proj: its weight, its bias, and the gradient reaching the norm's output.
    let out_w = product(di, dm, rows, Mat::transposed(&saved.normed, di), Mat::rows(gy, dm));
    let out_b = if a.out_b.is_some() { column_sums(gy, dm) } else { Vec::new() };
    let gnormed = product(rows, di, dm, Mat::rows(gy, dm), Mat::transposed(a.out_w.get(), dm));

    let mut g = kernel::backward(&dims, &a.inputs(&saved.zx), &a.params(), &saved.core, &gnormed, gfin);
    drop(gnormed);
    // The conv tail handed on is made of pre-convolution rows: its gradient goes back to them.
    for (i, grow) in gtail_out.chunks(cd).enumerate() {
        let (b, s) = (i / (dims.d_conv - 1), i % (dims.d_conv - 1));
        let dst = match tail_source(&dims, b, s) {
            Ok(r) => &mut g.zx[r * w + di..r * w + di + cd],
            Err(r) => &mut g.tail[r * cd..(r + 1) * cd],
        };
        for (o, &v) in dst.iter_mut().zip(grow) {
            *o = *o + v;
        }
    }

    // in_proj: its weight, its bias, and the gradient of its input.
    let in_b = if a.in_b.is_some() { column_sums(&g.zx, w) } else { Vec::new() };
    let g_in = || product(rows, dm, w, Mat::rows(&g.zx, w), Mat::transposed(a.in_w.get(), w));
    let (in_w, u, pre_w) = match (&saved.pre, &a.pre_w) {
        (Some((_, rstd)), Some(pw)) if !need_u => {
            // The norm weight's gradient, sum_r g_in[r, j] xhat[r, j] with g_in = gzx in_w^T,
            // is sum_k in_w[j, k] G[j, k] with G = xhat^T gzx; and in_proj's weight gradient is
            // G with row j scaled by the norm weight, so no g_in is needed at all.
            let xhat = kernel::rms_unit(a.u.get(), rstd, dm);
            let mut gw = product(dm, w, rows, Mat::transposed(&xhat, dm), Mat::rows(&g.zx, w));
            let pre_w = gw.chunks(w).zip(a.in_w.get().chunks(w)).map(|(gr, wr)| kernel::dot(gr, wr)).collect();
            for (row, &scale) in gw.chunks_mut(w).zip(pw.get()) {
                row.iter_mut().for_each(|v| *v = *v * scale);
            }
            (gw, Vec::new(), pre_w)
        }
        // With the block around the mixer, `u` reaches the output through the norm and directly.
        (Some((normed, rstd)), Some(pw)) => {
            let in_w = product(dm, w, rows, Mat::transposed(normed, dm), Mat::rows(&g.zx, w));
            let (u, pre_w) = kernel::rms_norm_backward(a.u.get(), pw.get(), rstd, &g_in(), Some(gy));
            (in_w, u, pre_w)
        }
        _ => {
            let in_w = product(dm, w, rows, Mat::transposed(a.u.get(), dm), Mat::rows(&g.zx, w));
            (in_w, if need_u { g_in() } else { Vec::new() }, Vec::new())
        }
    };

    [u, in_w, in_b, g.tail, g.h0, g.conv_w, g.conv_b, g.dt_bias, g.a_log, g.d, g.norm_w, out_w, out_b, pre_w, post_w]
}

/// The parents' shapes, in order, for the gradients handed back to Burn.
fn parent_shapes(a: &HostArgs<impl HostFloat>) -> [Vec<usize>; PARENTS] {
    let dims = a.dims;
    let (b, l, k, cd) = (dims.batch, dims.len, dims.d_conv, dims.conv_dim());
    let (h, p, n, dm, w, di) = (dims.nheads, dims.headdim, dims.d_state, dims.d_model, dims.width(), dims.d_inner());
    [
        vec![1, b * l * dm],
        vec![dm, w],
        vec![1, w],
        vec![1, b * (k - 1) * cd],
        vec![1, b * h * p * n],
        vec![cd, k],
        vec![1, cd],
        vec![1, h],
        vec![1, h],
        vec![1, a.d.get().len()],
        vec![1, di],
        vec![di, dm],
        vec![1, dm],
        vec![1, dm],
        vec![1, dm],
    ]
}

fn prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> B::FloatTensorPrimitive {
    t.into_primitive().tensor()
}

/// The packed output `[y | final state | conv tail]` as the mixer's three outputs.
fn unpack<B: Backend>(dims: &Dims, packed: Tensor<B, 1>) -> MixerOut<B> {
    let [ny, ns, nt] = packed_parts(dims);
    let (b, l, k) = (dims.batch, dims.len, dims.d_conv);
    MixerOut {
        y: packed.clone().narrow(0, 0, ny).reshape([b, l, dims.d_model]),
        ssm: packed.clone().narrow(0, ny, ns).reshape([b, dims.nheads, dims.headdim, dims.d_state]),
        conv: packed.narrow(0, ny + ns, nt).reshape([b, k - 1, dims.conv_dim()]),
    }
}

/// The forward on a backend without autodiff: each output its own tensor, no packed copy.
fn plain<B: Backend, T: HostFloat>(args: MixerArgs<B>) -> MixerOut<B> {
    let device = args.u.device();
    let (dims, parts) = args.parts();
    let host_args = HostArgs::<T>::new::<B>(dims, parts.map(|t| t.map(prim)));
    let (mut y, _) = mixer_forward(&host_args, false);
    let [ny, ns, _] = packed_parts(&dims);
    let mut state = y.split_off(ny);
    let conv = state.split_off(ns);
    let (b, k) = (dims.batch, dims.d_conv);
    fn tensor<B: Backend, T: HostFloat, const D: usize>(values: Vec<T>, shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
        Tensor::from_primitive(TensorPrimitive::Float(to_device::<B, T>(values, shape.to_vec(), device)))
    }
    MixerOut {
        y: tensor::<B, T, 3>(y, [b, dims.len, dims.d_model], &device),
        ssm: tensor::<B, T, 4>(state, [b, dims.nheads, dims.headdim, dims.d_state], &device),
        conv: tensor::<B, T, 3>(conv, [b, k - 1, dims.conv_dim()], &device),
    }
}

/// The backward node: holds the host inputs and what the forward saved.
#[derive(Debug)]
struct MixerBackward<T>(std::marker::PhantomData<T>);

#[derive(Debug, Clone)]
struct NodeState<T: HostFloat, D: Clone + Send + std::fmt::Debug + 'static> {
    args: Arc<HostArgs<T>>,
    saved: Arc<MixerSaved<T>>,
    device: D,
}

impl<B: Backend, T: HostFloat> Backward<B, PARENTS> for MixerBackward<T> {
    type State = NodeState<T, B::Device>;

    fn backward(self, ops: Ops<Self::State, PARENTS>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let NodeState { args, saved, device } = ops.state;
        let gout = host::<B, T>(grads.consume::<B>(&ops.node));
        let g = mixer_backward(&args, &saved, gout.get(), ops.parents[0].is_some());
        for ((parent, values), shape) in ops.parents.iter().zip(g).zip(parent_shapes(&args)) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, to_device::<B, T>(values, shape, &device));
            }
        }
    }
}

/// The forward on `Autodiff<B>`, registering [`MixerBackward`] when any input is tracked.
fn tracked<B: Backend, C: CheckpointStrategy, T: HostFloat>(args: MixerArgs<Autodiff<B, C>>) -> MixerOut<Autodiff<B, C>> {
    let device = args.u.device();
    let (dims, parts) = args.parts();
    let present = parts.each_ref().map(Option::is_some);
    // Absent inputs become an untracked placeholder, so that the node always has the same parents.
    let parts = parts.map(|t| prim(t.unwrap_or_else(|| Tensor::<Autodiff<B, C>, 2>::zeros([1, 1], &device))));
    let nodes = std::array::from_fn(|i| parts[i].node.clone());
    let inner_device: B::Device = device.clone();
    let host_args = HostArgs::<T>::new::<B>(dims, std::array::from_fn(|i| present[i].then(|| parts[i].primitive.clone())));
    let len = packed_parts(&dims).iter().sum::<usize>();
    let out = match MixerBackward::<T>(std::marker::PhantomData).prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, saved) = mixer_forward(&host_args, true);
            let out = to_device::<B, T>(out, vec![len], &inner_device);
            let saved = saved.expect("kept when asked");
            prep.finish(NodeState { args: Arc::new(host_args), saved: Arc::new(saved), device: inner_device }, out)
        }
        OpsKind::UnTracked(prep) => {
            let (out, _) = mixer_forward(&host_args, false);
            prep.finish(to_device::<B, T>(out, vec![len], &inner_device))
        }
    };
    unpack(&dims, Tensor::from_primitive(TensorPrimitive::Float(out)))
}
