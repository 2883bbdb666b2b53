//! The streaming step: a stack's weights as plain host arrays and a preallocated
//! [`StreamingState`], advanced one row at a time with no allocation per step. What
//! `Mamba2Stack::step` computes, for tick-by-tick use (`mamba2-model`'s `StreamingStack` copies a
//! Burn stack into a [`Streaming`], and its tests check the two against each other).

use crate::avx512;
use crate::conv::{step_size, transpose_conv};
use crate::float::{multiversion, sigmoid, HostFloat};
use crate::helper::Helper;
use crate::layout::Dims;
use crate::norm::{gated_norm_row, rms_row};
use crate::scan::head_forward;

/// A step's input or output slice does not hold `batch * d_model` values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("step needs {want} input and output values (batch {batch} x d_model {d_model}), got {input} and {output}")]
pub struct StepSizeError {
    /// `batch * d_model`.
    pub want: usize,
    /// The state's streams.
    pub batch: usize,
    /// The stack's width.
    pub d_model: usize,
    /// Values in the input slice.
    pub input: usize,
    /// Values in the output slice.
    pub output: usize,
}

/// A linear map `[d_in] -> [d_out]` on the host.
#[derive(Debug, Clone)]
pub struct Linear<T> {
    /// `[d_in, d_out]`, Burn's layout: row `i` is what input `i` adds to the output; or, when
    /// `panels`, packed in column panels for the vector loop ([`avx512::pack_panels`]). Empty
    /// when the weight is stored in `half`.
    weight: Vec<T>,
    /// The weight in bf16, laid out as `weight` would be, after [`Linear::into_bf16`]; else empty.
    half: Vec<half::bf16>,
    bf16: bool,
    panels: bool,
    bias: Option<Vec<T>>,
    d_in: usize,
    d_out: usize,
}

/// Whether weights are packed in panels for the vector product (AVX-512).
fn panels_usable<T: HostFloat>() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512::usable::<T>(T::W);
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl<T: HostFloat> Linear<T> {
    /// From a weight `[d_in, d_out]` (row-major, Burn's layout) and a bias `[d_out]`.
    pub fn new(weight: Vec<T>, d_in: usize, d_out: usize, bias: Option<Vec<T>>) -> Self {
        assert_eq!(weight.len(), d_in * d_out, "a [{d_in}, {d_out}] weight");
        #[cfg(target_arch = "x86_64")]
        if panels_usable::<T>() {
            return Linear {
                weight: avx512::pack_panels(&weight, d_in, d_out),
                half: Vec::new(),
                bf16: false,
                panels: true,
                bias,
                d_in,
                d_out,
            };
        }
        Linear { weight, half: Vec::new(), bf16: false, panels: false, bias, d_in, d_out }
    }

    /// The same map with its weight stored in bf16 (rounded to nearest, ties to even) and
    /// widened back to `T` as the product reads it: half the bytes of f32 per product, for steps
    /// bound by reading the weights (decoding at batch 1). The bias stays in `T`.
    pub fn into_bf16(self) -> Self {
        if self.bf16 {
            return self;
        }
        let half = self.weight.iter().map(|&v| half::bf16::from_f64(v.to_f64().expect("a float converts"))).collect();
        Linear { weight: Vec::new(), half, bf16: true, ..self }
    }

    /// Whether the weight is stored in bf16.
    pub fn is_bf16(&self) -> bool {
        self.bf16
    }

    /// Bytes of weight one product reads.
    fn weight_bytes(&self) -> usize {
        self.weight.len() * std::mem::size_of::<T>() + self.half.len() * 2
    }

    /// Inputs per row.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Outputs per row.
    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// `out = x W + b` for one row, with `state`'s helper thread (if it has one) taking half of
    /// the product: the step's own matrix-vector product, for a layer outside the stack (an LM
    /// head reading the stack's output).
    ///
    /// # Panics
    /// When `x` does not hold `d_in` values or `out` `d_out`.
    pub fn apply(&self, state: &StreamingState<T>, x: &[T], out: &mut [T]) {
        assert!(
            x.len() == self.d_in && out.len() == self.d_out,
            "a [{}, {}] linear map got {} inputs and {} outputs",
            self.d_in,
            self.d_out,
            x.len(),
            out.len()
        );
        matvec(x, self, out, state.helper.0.as_ref());
    }
}

/// One block's weights, as the step reads them.
#[derive(Debug, Clone)]
pub struct LayerWeights<T> {
    norm: Vec<T>,
    in_proj: Linear<T>,
    /// `[d_conv, conv_dim]`: tap-major, so that a tap runs over contiguous channels.
    conv_wt: Vec<T>,
    conv_b: Option<Vec<T>>,
    dt_bias: Vec<T>,
    /// `A = -exp(A_log)`, precomputed.
    a: Vec<T>,
    d: Vec<T>,
    gated_norm: Vec<T>,
    out_proj: Linear<T>,
}

/// A block's parameters in the layouts of Burn's modules (and the checkpoints').
#[derive(Debug, Clone)]
pub struct BlockParams<T> {
    /// The block's RMS norm weight, `[d_model]`.
    pub norm: Vec<T>,
    /// `in_proj`.
    pub in_proj: Linear<T>,
    /// `[conv_dim, d_conv]`.
    pub conv_w: Vec<T>,
    /// `[conv_dim]`.
    pub conv_b: Option<Vec<T>>,
    /// `[nheads]`.
    pub dt_bias: Vec<T>,
    /// `[nheads]`.
    pub a_log: Vec<T>,
    /// `[nheads]` or `[d_inner]`.
    pub d: Vec<T>,
    /// The gated norm's weight, `[d_inner]`.
    pub gated_norm: Vec<T>,
    /// `out_proj`.
    pub out_proj: Linear<T>,
}

impl<T: HostFloat> LayerWeights<T> {
    /// The step's form of a block's parameters (`dims` gives the sizes).
    pub fn new(dims: &Dims, p: BlockParams<T>) -> Self {
        let (cd, k) = (dims.conv_dim(), dims.d_conv);
        assert_eq!(p.conv_w.len(), cd * k, "a [{cd}, {k}] convolution weight");
        Self {
            norm: p.norm,
            in_proj: p.in_proj,
            conv_wt: transpose_conv(dims, &p.conv_w),
            conv_b: p.conv_b,
            dt_bias: p.dt_bias,
            a: p.a_log.iter().map(|v| -v.exp()).collect(),
            d: p.d,
            gated_norm: p.gated_norm,
            out_proj: p.out_proj,
        }
    }
}

/// A stack's weights on the host, for [`Streaming::step`].
#[derive(Debug, Clone)]
pub struct Streaming<T> {
    /// The sizes, for one row (`batch` and `len` 1).
    dims: Dims,
    layers: Vec<LayerWeights<T>>,
    norm_f: Vec<T>,
}

/// The recurrent state of a [`Streaming`] stack for `batch` independent streams, with the
/// scratch space one step needs and, for stacks whose weights outgrow a core's cache, a helper
/// thread that takes half of each matrix-vector product ([`StreamingState::with_helper`]). A
/// clone starts its own helper thread if this one has one.
#[derive(Debug, Clone)]
pub struct StreamingState<T: HostFloat> {
    batch: usize,
    /// Per layer: `[batch, d_conv - 1, conv_dim]`, oldest row first.
    conv: Vec<Vec<T>>,
    /// Per layer: `[batch, nheads, headdim, d_state]`.
    ssm: Vec<Vec<T>>,
    hidden: Vec<T>,
    normed: Vec<T>,
    zx: Vec<T>,
    xa: Vec<T>,
    y: Vec<T>,
    normed_y: Vec<T>,
    /// `1 / rms` per norm group, which the step does not need but the shared norm writes.
    rstd: Vec<T>,
    mixed: Vec<T>,
    helper: HelperSlot<T>,
}

/// The optional helper thread; a clone starts its own helper if this one has one.
#[derive(Debug)]
struct HelperSlot<T: HostFloat>(Option<Helper<T>>);

impl<T: HostFloat> Clone for HelperSlot<T> {
    fn clone(&self) -> Self {
        Self(self.0.as_ref().and_then(|_| Helper::start()))
    }
}

impl<T: HostFloat> StreamingState<T> {
    /// Turns the helper thread on or off. [`Streaming::zero_state`] turns it on where the
    /// stack's weights exceed [`HELPER_ABOVE_BYTES`], the machine has two cores, and the CPU has
    /// the vector loops the split product uses; `true` here still needs the latter two.
    /// While on, the helper spins on its core between steps (parking after 2 ms without work).
    pub fn with_helper(mut self, on: bool) -> Self {
        self.helper.0 = if on && panels_usable::<T>() { self.helper.0.or_else(Helper::start) } else { None };
        self
    }

    /// Whether a helper thread takes part in the steps.
    pub fn has_helper(&self) -> bool {
        self.helper.0.is_some()
    }

    /// The number of streams.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Layer `layer`'s convolution tail, `[batch, d_conv - 1, conv_dim]`, oldest row first.
    pub fn conv(&self, layer: usize) -> &[T] {
        &self.conv[layer]
    }

    /// See [`conv`](Self::conv).
    pub fn conv_mut(&mut self, layer: usize) -> &mut [T] {
        &mut self.conv[layer]
    }

    /// Layer `layer`'s scan state, `[batch, nheads, headdim, d_state]`.
    pub fn ssm(&self, layer: usize) -> &[T] {
        &self.ssm[layer]
    }

    /// See [`ssm`](Self::ssm).
    pub fn ssm_mut(&mut self, layer: usize) -> &mut [T] {
        &mut self.ssm[layer]
    }

    /// The number of layers.
    pub fn n_layer(&self) -> usize {
        self.conv.len()
    }

    /// Bytes this state holds on the heap: the recurrent state and the step's scratch.
    pub fn heap_bytes(&self) -> usize {
        let n: usize = self.conv.iter().chain(&self.ssm).map(Vec::len).sum::<usize>()
            + [&self.hidden, &self.normed, &self.zx, &self.xa, &self.y, &self.normed_y, &self.rstd, &self.mixed]
                .iter()
                .map(|v| v.len())
                .sum::<usize>();
        n * std::mem::size_of::<T>()
    }
}

/// Weight bytes above which [`Streaming::zero_state`] starts a helper thread: about where one
/// core's L2 cache stops holding the weights.
pub const HELPER_ABOVE_BYTES: usize = 1 << 20;

impl<T: HostFloat> Streaming<T> {
    /// A stack of `layers` and the final norm's weight `norm_f` (`[d_model]`); `dims` gives the
    /// sizes (its `batch` and `len` are not read).
    pub fn new(dims: Dims, layers: Vec<LayerWeights<T>>, norm_f: Vec<T>) -> Self {
        Self { dims: Dims { batch: 1, len: 1, ..dims }, layers, norm_f }
    }

    /// The same stack with its projections' weights (`in_proj`, `out_proj`: nearly all of a
    /// step's bytes) stored in bf16; see [`Linear::into_bf16`].
    pub fn into_bf16(self) -> Self {
        let layers = self
            .layers
            .into_iter()
            .map(|l| LayerWeights { in_proj: l.in_proj.into_bf16(), out_proj: l.out_proj.into_bf16(), ..l })
            .collect();
        Self { layers, ..self }
    }

    /// The number of layers.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// A zero state for `batch` streams.
    pub fn zero_state(&self, batch: usize) -> StreamingState<T> {
        let c = &self.dims;
        let (d, cd, di) = (c.d_model, c.conv_dim(), c.d_inner());
        let n_layer = self.layers.len();
        StreamingState {
            batch,
            conv: vec![vec![T::zero(); batch * (c.d_conv - 1) * cd]; n_layer],
            ssm: vec![vec![T::zero(); batch * c.state_len()]; n_layer],
            hidden: vec![T::zero(); d],
            normed: vec![T::zero(); d],
            zx: vec![T::zero(); c.width()],
            xa: vec![T::zero(); cd],
            y: vec![T::zero(); di],
            normed_y: vec![T::zero(); di],
            rstd: vec![T::zero(); c.ngroups],
            mixed: vec![T::zero(); d],
            helper: HelperSlot(None),
        }
        .with_helper(self.weight_bytes() > HELPER_ABOVE_BYTES)
    }

    /// Bytes of the weights one step reads.
    fn weight_bytes(&self) -> usize {
        let per_layer =
            |l: &LayerWeights<T>| l.in_proj.weight_bytes() + l.out_proj.weight_bytes() + l.conv_wt.len() * std::mem::size_of::<T>();
        self.layers.iter().map(per_layer).sum::<usize>()
    }

    /// One step: `u` is one row per stream (`[batch, d_model]`, row-major), `out` receives the
    /// stack's output for it (after the final norm), and `state` advances.
    ///
    /// # Errors
    /// [`StepSizeError`] when the slices do not have `batch * d_model` entries.
    pub fn step(&self, state: &mut StreamingState<T>, u: &[T], out: &mut [T]) -> Result<(), StepSizeError> {
        let d = self.dims.d_model;
        let want = state.batch * d;
        if u.len() != want || out.len() != want {
            return Err(StepSizeError { want, batch: state.batch, d_model: d, input: u.len(), output: out.len() });
        }
        let eps = T::from(self.dims.eps).expect("finite eps");
        for row in 0..state.batch {
            state.hidden.copy_from_slice(&u[row * d..(row + 1) * d]);
            for (li, layer) in self.layers.iter().enumerate() {
                self.layer_step(layer, li, row, state);
            }
            rms_row(&state.hidden, &self.norm_f, eps, &mut out[row * d..(row + 1) * d]);
        }
        Ok(())
    }

    fn layer_step(&self, layer: &LayerWeights<T>, li: usize, row: usize, st: &mut StreamingState<T>) {
        let dims = &self.dims;
        let (h, cd, k, per_head) = (dims.nheads, dims.conv_dim(), dims.d_conv, dims.headdim * dims.d_state);
        rms_row(&st.hidden, &layer.norm, T::from(dims.eps).expect("finite eps"), &mut st.normed);
        matvec(&st.normed, &layer.in_proj, &mut st.zx, st.helper.0.as_ref());

        // Convolution over the stored k - 1 rows and this one; then shift the window.
        let tail = &mut st.conv[li][row * (k - 1) * cd..(row + 1) * (k - 1) * cd];
        let xbc = &st.zx[dims.xbc()];
        match &layer.conv_b {
            Some(b) => st.xa.copy_from_slice(b),
            None => st.xa.fill(T::zero()),
        }
        for j in 0..k - 1 {
            axpy_mul(&mut st.xa, &layer.conv_wt[j * cd..(j + 1) * cd], &tail[j * cd..(j + 1) * cd]);
        }
        axpy_mul(&mut st.xa, &layer.conv_wt[(k - 1) * cd..], xbc);
        tail.copy_within(cd.., 0);
        tail[(k - 2) * cd..].copy_from_slice(xbc);
        for v in st.xa.iter_mut() {
            *v = *v * sigmoid(*v);
        }

        // The recurrence, head by head.
        let ssm = &mut st.ssm[li][row * dims.state_len()..(row + 1) * dims.state_len()];
        let (p, dt_at) = (dims.headdim, dims.dt().start);
        for hh in 0..h {
            let gi = dims.group_of(hh);
            let dt = step_size(dims, st.zx[dt_at + hh], layer.dt_bias[hh]);
            let decay = (dt * layer.a[hh]).exp();
            let x = &st.xa[dims.x_of(hh)];
            let (bv, cv) = (&st.xa[dims.b_of(gi)], &st.xa[dims.c_of(gi)]);
            let yh = &mut st.y[dims.x_of(hh)];
            head_forward(&mut ssm[hh * per_head..(hh + 1) * per_head], x, bv, cv, decay, dt, yh);
            for (pi, yv) in yh.iter_mut().enumerate() {
                let skip = if dims.d_per_channel { layer.d[hh * p + pi] } else { layer.d[hh] };
                *yv = *yv + skip * x[pi];
            }
        }

        // Gated group-wise norm, out_proj, residual.
        gated_norm_row(dims, &st.y, &st.zx[dims.z()], &layer.gated_norm, &mut st.normed_y, &mut st.rstd);
        matvec(&st.normed_y, &layer.out_proj, &mut st.mixed, st.helper.0.as_ref());
        for (hv, &m) in st.hidden.iter_mut().zip(&st.mixed) {
            *hv = *hv + m;
        }
    }
}

multiversion! {
    /// `out = x W`, four rows of `W` at a time so that each pass over `out` does four rows' work.
    fn matvec_rows<T>(x: &[T], w: &[T], out: &mut [T]) {
        let n = out.len();
        out.fill(T::zero());
        let (quads, rest) = x.as_chunks::<4>();
        for (q, xs) in quads.iter().enumerate() {
            let rows = &w[q * 4 * n..(q * 4 + 4) * n];
            let (r0, r1) = rows.split_at(n);
            let (r1, r2) = r1.split_at(n);
            let (r2, r3) = r2.split_at(n);
            for ((((o, &a), &b), &c), &d) in out.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
                *o = *o + (xs[0] * a + xs[1] * b) + (xs[2] * c + xs[3] * d);
            }
        }
        for (i, &xi) in rest.iter().enumerate() {
            let row = quads.len() * 4 + i;
            for (o, &wv) in out.iter_mut().zip(&w[row * n..(row + 1) * n]) {
                *o = *o + xi * wv;
            }
        }
    }
}

multiversion! {
    /// `out = x W` for `W` stored in bf16, row-major.
    fn matvec_rows_bf16<T>(x: &[T], w: &[half::bf16], out: &mut [T]) {
        let n = out.len();
        out.fill(T::zero());
        for (i, &xi) in x.iter().enumerate() {
            for (o, &wv) in out.iter_mut().zip(&w[i * n..(i + 1) * n]) {
                *o = *o + xi * T::from(wv.to_f32()).expect("a float converts");
            }
        }
    }
}

fn matvec<T: HostFloat>(x: &[T], l: &Linear<T>, out: &mut [T], helper: Option<&Helper<T>>) {
    debug_assert_eq!(out.len(), l.d_out);
    if l.panels {
        #[cfg(target_arch = "x86_64")]
        match (helper, l.bf16) {
            (Some(helper), false) => helper.matvec(x, &l.weight, out),
            (Some(helper), true) => helper.matvec(x, &l.half, out),
            // SAFETY: panels are only packed when the CPU has AVX-512, for these sizes.
            (None, false) => unsafe { avx512::matvec_panels(x, &l.weight, out) },
            // SAFETY: as above (bf16 panels keep the layout of the panels they were made from).
            (None, true) => unsafe { avx512::matvec_panels(x, &l.half, out) },
        }
    } else if l.bf16 {
        matvec_rows_bf16(x, &l.half, out);
    } else {
        matvec_rows(x, &l.weight, out);
    }
    if let Some(b) = &l.bias {
        for (o, &bv) in out.iter_mut().zip(b) {
            *o = *o + bv;
        }
    }
}

multiversion! {
    /// `acc += w * x`, element-wise.
    fn axpy_mul<T>(acc: &mut [T], w: &[T], x: &[T]) {
        for ((a, &wv), &xv) in acc.iter_mut().zip(w).zip(x) {
            *a = *a + wv * xv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::{self, LayerPlan};

    fn wave(n: usize, f: f64, scale: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64 + 1.0) * f).sin() * scale).collect()
    }

    /// The streaming step and the training kernel read a layer's columns through the same
    /// [`Dims`]: a one-block stack stepped row by row gives what the layer's forward gives over
    /// the whole sequence (block norm, residual and final norm included), for two groups, `D`
    /// per channel and the gate after the norm, and with `d_state` off the vector width.
    #[test]
    fn the_step_equals_the_layer_forward_row_by_row() {
        for (ngroups, d_state, d_per_channel, gate_first) in [(1, 16, false, true), (2, 8, true, false), (2, 5, false, true)] {
            let dims = Dims {
                batch: 2,
                len: 9,
                d_model: 8,
                nheads: 4,
                headdim: 4,
                ngroups,
                d_state,
                d_conv: 4,
                d_per_channel,
                dt_lo: 1e-3,
                dt_hi: 0.5,
                gate_first,
                eps: 1e-5,
            };
            let (dm, w, cd, di, h) = (dims.d_model, dims.width(), dims.conv_dim(), dims.d_inner(), dims.nheads);
            let u = wave(dims.rows() * dm, 0.61, 1.0);
            let (in_w, in_b, conv_w, conv_b) = (wave(dm * w, 0.37, 0.4), wave(w, 0.5, 0.1), wave(cd * 4, 0.83, 0.5), wave(cd, 0.29, 0.1));
            let (dt_bias, a_log, d) = (wave(h, 1.3, 1.0), wave(h, 0.7, 0.5), wave(if d_per_channel { di } else { h }, 0.45, 1.0));
            let (norm_w, out_w, out_b, pre_w, post_w) =
                (wave(di, 0.2, 1.0), wave(di * dm, 0.53, 0.3), wave(dm, 0.9, 0.1), wave(dm, 0.3, 1.0), wave(dm, 0.4, 1.0));
            let plan = LayerPlan {
                dims,
                u: &u,
                in_w: &in_w,
                in_b: Some(&in_b),
                tail: None,
                h0: None,
                conv_w: &conv_w,
                conv_b: Some(&conv_b),
                dt_bias: &dt_bias,
                a_log: &a_log,
                d: &d,
                norm_w: &norm_w,
                out_w: &out_w,
                out_b: Some(&out_b),
                pre_w: Some(&pre_w),
                post_w: Some(&post_w),
                picks: None,
            };
            let (whole, _) = layer::forward(&plan, false);

            let params = BlockParams {
                norm: pre_w.clone(),
                in_proj: Linear::new(in_w.clone(), dm, w, Some(in_b.clone())),
                conv_w: conv_w.clone(),
                conv_b: Some(conv_b.clone()),
                dt_bias: dt_bias.clone(),
                a_log: a_log.clone(),
                d: d.clone(),
                gated_norm: norm_w.clone(),
                out_proj: Linear::new(out_w.clone(), di, dm, Some(out_b.clone())),
            };
            let stack = Streaming::new(dims, vec![LayerWeights::new(&dims, params)], post_w.clone());
            let mut state = stack.zero_state(dims.batch);
            let (mut row_in, mut row_out) = (vec![0.0; dims.batch * dm], vec![0.0; dims.batch * dm]);
            let mut worst = 0.0f64;
            for t in 0..dims.len {
                for b in 0..dims.batch {
                    let r = b * dims.len + t;
                    row_in[b * dm..(b + 1) * dm].copy_from_slice(&u[r * dm..(r + 1) * dm]);
                }
                stack.step(&mut state, &row_in, &mut row_out).unwrap();
                for b in 0..dims.batch {
                    let r = b * dims.len + t;
                    for (x, y) in row_out[b * dm..(b + 1) * dm].iter().zip(&whole[r * dm..(r + 1) * dm]) {
                        worst = worst.max((x - y).abs());
                    }
                }
            }
            assert!(worst < 1e-12, "groups {ngroups}, d_state {d_state}: step and forward differ by {worst:e}");
            // The step's state is the forward's final state.
            let [ny, ns, _] = layer::packed_parts(&dims, None);
            let fin = &whole[ny..ny + ns];
            let diff = state.ssm(0).iter().zip(fin).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(diff < 1e-12, "final states differ by {diff:e}");
        }
    }

    /// One block of width 4, for tests that need a stack but not its layers.
    fn tiny_dims() -> Dims {
        Dims {
            batch: 1,
            len: 1,
            d_model: 4,
            nheads: 2,
            headdim: 2,
            ngroups: 1,
            d_state: 4,
            d_conv: 2,
            d_per_channel: false,
            dt_lo: 0.0,
            dt_hi: f64::INFINITY,
            gate_first: true,
            eps: 1e-5,
        }
    }

    fn bf16_products_agree<T: HostFloat>(tol: f64) {
        let dims = tiny_dims();
        let host = |v: &[f64]| v.iter().map(|&x| T::from(x).unwrap()).collect::<Vec<T>>();
        let empty = Streaming::<T>::new(dims, Vec::new(), vec![T::one(); 4]);
        for (d_in, d_out) in [(1, 1), (7, 64), (33, 131), (256, 1160)] {
            let (w, x, b) = (wave(d_in * d_out, 0.37, 1.0), wave(d_in, 0.61, 1.0), wave(d_out, 0.2, 0.1));
            // Rounded from `T`'s value, as the layer sees only that.
            let rounded: Vec<f64> = host(&w).iter().map(|&v| half::bf16::from_f64(v.to_f64().unwrap()).to_f64()).collect();
            assert!(rounded.iter().zip(&w).any(|(r, v)| r != v), "the weights are not all bf16 already");
            let full = Linear::new(host(&w), d_in, d_out, Some(host(&b)));
            let full_bytes = full.weight_bytes();
            let half = full.into_bf16();
            assert!(half.is_bf16() && half.weight_bytes() * std::mem::size_of::<T>() == full_bytes * 2, "2 bytes a weight");
            let exact: Vec<f64> = (0..d_out).map(|o| b[o] + (0..d_in).map(|i| x[i] * rounded[i * d_out + o]).sum::<f64>()).collect();
            // The plain loop, which CPUs without AVX-512 run.
            let stored: Vec<half::bf16> = rounded.iter().map(|&v| half::bf16::from_f64(v)).collect();
            let mut plain = vec![T::zero(); d_out];
            matvec_rows_bf16(&host(&x), &stored, &mut plain);
            let scale: f64 = x.iter().map(|v| v.abs()).sum::<f64>() + 1.0;
            let worst = plain.iter().zip(&exact).zip(&b).map(|((o, e), bv)| (o.to_f64().unwrap() + bv - e).abs()).fold(0.0, f64::max);
            assert!(worst < tol * scale, "[{d_in}, {d_out}], plain loop: off the rounded weights' product by {worst:e}");
            for helper in [false, true] {
                let state = empty.zero_state(1).with_helper(helper);
                let mut out = vec![T::zero(); d_out];
                half.apply(&state, &host(&x), &mut out);
                let worst = out.iter().zip(&exact).map(|(o, e)| (o.to_f64().unwrap() - e).abs()).fold(0.0, f64::max);
                assert!(worst < tol * scale, "[{d_in}, {d_out}], helper {helper}: off the rounded weights' product by {worst:e}");
            }
        }
    }

    /// A bf16 weight computes the product of the weight rounded to bf16 (to `T`'s rounding),
    /// with and without the helper thread, on the vector and the plain loops alike.
    #[test]
    fn bf16_weights_give_the_product_of_the_rounded_weights() {
        bf16_products_agree::<f32>(1e-6);
        bf16_products_agree::<f64>(1e-14);
    }

    #[test]
    fn wrong_slice_sizes_are_named() {
        let dims = tiny_dims();
        let stack = Streaming::<f32>::new(dims, Vec::new(), vec![1.0; 4]);
        let mut state = stack.zero_state(2);
        let err = stack.step(&mut state, &[0.0; 8], &mut [0.0; 4]).unwrap_err();
        assert_eq!(err.to_string(), "step needs 8 input and output values (batch 2 x d_model 4), got 8 and 4");
    }
}
