//! A dedicated inference path for tick-by-tick use: [`StreamingStack`] holds a stack's weights as
//! plain host arrays and advances a preallocated [`StreamingState`] one row at a time, with no
//! tensors, no autodiff and no allocation per step.
//!
//! It computes what [`Mamba2Stack::step`] computes (`tests/streaming.rs` checks the two against
//! each other over many steps); use the stack's own `step` for gradients or for GPU backends.

use burn::prelude::*;

use crate::helper::Helper;
use crate::kernel::{gated_norm_row, head_forward, multiversion, rms_row, sigmoid, step_size, HostFloat};
use crate::mixer::kernel_dims;
use crate::{Mamba2Config, Mamba2Stack, Mamba2State, MixerState, ModelError};

#[derive(Debug, Clone)]
struct Linear<T> {
    /// `[d_in, d_out]`, Burn's layout: row `i` is what input `i` adds to the output; or, when
    /// `panels`, packed in column panels for the vector loop (`simd::pack_panels`).
    weight: Vec<T>,
    panels: bool,
    bias: Option<Vec<T>>,
    d_out: usize,
}

#[derive(Debug, Clone)]
struct Layer<T> {
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

/// A [`Mamba2Stack`]'s weights on the host, for [`StreamingStack::step`].
#[derive(Debug, Clone)]
pub struct StreamingStack<T: HostFloat> {
    config: Mamba2Config,
    layers: Vec<Layer<T>>,
    norm_f: Vec<T>,
}

/// The recurrent state of a [`StreamingStack`] for `batch` independent streams, with the scratch
/// space one step needs and, for stacks whose weights outgrow a core's cache, a helper thread
/// that takes half of each matrix-vector product ([`StreamingState::with_helper`]). A clone
/// starts its own helper thread if this one has one.
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
    /// Turns the helper thread on or off. [`StreamingStack::zero_state`] turns it on where the
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
}

/// Weight bytes above which [`StreamingStack::zero_state`] starts a helper thread: about where
/// one core's L2 cache stops holding the weights.
pub const HELPER_ABOVE_BYTES: usize = 1 << 20;

/// Whether weights are packed in panels for the vector product (AVX-512).
fn panels_usable<T: HostFloat>() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::simd::usable::<T>(T::W);
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn host<B: Backend, T: HostFloat, const D: usize>(t: Tensor<B, D>) -> Vec<T> {
    t.into_data().convert::<T>().into_vec::<T>().expect("converted to the host type")
}

fn linear<B: Backend, T: HostFloat>(l: &burn::nn::Linear<B>) -> Linear<T> {
    let [d_in, d_out] = l.weight.dims();
    let weight = host(l.weight.val());
    #[cfg(target_arch = "x86_64")]
    if panels_usable::<T>() {
        let weight = crate::simd::pack_panels(&weight, d_in, d_out);
        return Linear { weight, panels: true, bias: l.bias.as_ref().map(|b| host(b.val())), d_out };
    }
    let _ = d_in;
    Linear { weight, panels: false, bias: l.bias.as_ref().map(|b| host(b.val())), d_out }
}

impl<T: HostFloat> StreamingStack<T> {
    /// Copies the stack's weights to the host.
    pub fn new<B: Backend>(stack: &Mamba2Stack<B>) -> Self {
        let config = stack.config().clone();
        let (cd, k) = (config.conv_dim(), config.d_conv);
        let layers = stack
            .layers
            .iter()
            .map(|block| {
                let m = &block.mixer;
                let w: Vec<T> = host(m.conv1d.weight.val().reshape([cd, k]));
                let mut conv_wt = vec![T::zero(); k * cd];
                for ch in 0..cd {
                    for j in 0..k {
                        conv_wt[j * cd + ch] = w[ch * k + j];
                    }
                }
                Layer {
                    norm: host(block.norm.weight.val()),
                    in_proj: linear(&m.in_proj),
                    conv_wt,
                    conv_b: m.conv1d.bias.as_ref().map(|b| host(b.val())),
                    dt_bias: host(m.dt_bias.val()),
                    a: host::<B, T, 1>(m.a_log.val()).into_iter().map(|v| -v.exp()).collect(),
                    d: host(m.d.val()),
                    gated_norm: host(m.norm.weight.val()),
                    out_proj: linear(&m.out_proj),
                }
            })
            .collect();
        Self { norm_f: host(stack.norm_f.weight.val()), layers, config }
    }

    /// The config of the copied stack.
    pub fn config(&self) -> &Mamba2Config {
        &self.config
    }

    /// A zero state for `batch` streams.
    pub fn zero_state(&self, batch: usize) -> StreamingState<T> {
        let c = &self.config;
        let (d, cd, di) = (c.d_model, c.conv_dim(), c.d_inner());
        let n_layer = self.layers.len();
        StreamingState {
            batch,
            conv: vec![vec![T::zero(); batch * (c.d_conv - 1) * cd]; n_layer],
            ssm: vec![vec![T::zero(); batch * c.nheads() * c.headdim * c.d_state]; n_layer],
            hidden: vec![T::zero(); d],
            normed: vec![T::zero(); d],
            zx: vec![T::zero(); c.d_in_proj()],
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
        let per_layer = |l: &Layer<T>| l.in_proj.weight.len() + l.out_proj.weight.len() + l.conv_wt.len();
        self.layers.iter().map(per_layer).sum::<usize>() * std::mem::size_of::<T>()
    }

    /// The state of a tensor model (after a prefill with `forward`, say), copied to the host.
    ///
    /// # Errors
    /// [`ModelError::State`] when the state's layers or shapes do not fit this stack.
    pub fn state_from<B: Backend>(&self, state: &Mamba2State<B>) -> Result<StreamingState<T>, ModelError> {
        if state.layers.len() != self.layers.len() {
            return Err(ModelError::State { why: format!("state has {} layers, the model {}", state.layers.len(), self.layers.len()) });
        }
        let mut out = self.zero_state(state.batch());
        for (i, MixerState { conv, ssm }) in state.layers.iter().enumerate() {
            let (conv, ssm): (Vec<T>, Vec<T>) = (host(conv.clone()), host(ssm.clone()));
            if conv.len() != out.conv[i].len() || ssm.len() != out.ssm[i].len() {
                return Err(ModelError::State { why: format!("layer {i}'s state does not fit the model's sizes") });
            }
            out.conv[i] = conv;
            out.ssm[i] = ssm;
        }
        Ok(out)
    }

    /// The state as tensors, to continue with the tensor model.
    pub fn state_to<B: Backend>(&self, state: &StreamingState<T>, device: &B::Device) -> Mamba2State<B> {
        let c = &self.config;
        let b = state.batch;
        let layers = state
            .conv
            .iter()
            .zip(&state.ssm)
            .map(|(conv, ssm)| MixerState {
                conv: Tensor::from_data(TensorData::new(conv.clone(), [b, c.d_conv - 1, c.conv_dim()]), device),
                ssm: Tensor::from_data(TensorData::new(ssm.clone(), [b, c.nheads(), c.headdim, c.d_state]), device),
            })
            .collect();
        Mamba2State { layers }
    }

    /// One step: `u` is one row per stream (`[batch, d_model]`, row-major), `out` receives the
    /// stack's output for it (after the final norm), and `state` advances.
    ///
    /// # Errors
    /// [`ModelError::State`] when the slices do not have `batch * d_model` entries.
    pub fn step(&self, state: &mut StreamingState<T>, u: &[T], out: &mut [T]) -> Result<(), ModelError> {
        let d = self.config.d_model;
        let want = state.batch * d;
        if u.len() != want || out.len() != want {
            return Err(ModelError::State {
                why: format!(
                    "step needs {want} input and output values (batch {} x d_model {d}), got {} and {}",
                    state.batch,
                    u.len(),
                    out.len()
                ),
            });
        }
        for row in 0..state.batch {
            state.hidden.copy_from_slice(&u[row * d..(row + 1) * d]);
            for (li, layer) in self.layers.iter().enumerate() {
                self.layer_step(layer, li, row, state);
            }
            let eps = self.config.norm_eps;
            rms_norm(&state.hidden, &self.norm_f, eps, &mut out[row * d..(row + 1) * d]);
        }
        Ok(())
    }

    fn layer_step(&self, layer: &Layer<T>, li: usize, row: usize, st: &mut StreamingState<T>) {
        let c = &self.config;
        let (h, p, g, n, di, cd, k) = (c.nheads(), c.headdim, c.ngroups, c.d_state, c.d_inner(), c.conv_dim(), c.d_conv);
        rms_norm(&st.hidden, &layer.norm, c.norm_eps, &mut st.normed);
        matvec(&st.normed, &layer.in_proj, &mut st.zx, st.helper.0.as_ref());

        // Convolution over the stored k - 1 rows and this one; then shift the window.
        let tail = &mut st.conv[li][row * (k - 1) * cd..(row + 1) * (k - 1) * cd];
        let xbc = &st.zx[di..di + cd];
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
        let dims = kernel_dims(c, 1, 1);
        let ssm = &mut st.ssm[li][row * h * p * n..(row + 1) * h * p * n];
        for hh in 0..h {
            let gi = hh / (h / g);
            let dt = step_size(&dims, st.zx[di + cd + hh], layer.dt_bias[hh]);
            let decay = (dt * layer.a[hh]).exp();
            let x = &st.xa[hh * p..(hh + 1) * p];
            let bv = &st.xa[di + gi * n..di + (gi + 1) * n];
            let cv = &st.xa[di + g * n + gi * n..di + g * n + (gi + 1) * n];
            let yh = &mut st.y[hh * p..(hh + 1) * p];
            head_forward(&mut ssm[hh * p * n..(hh + 1) * p * n], x, bv, cv, decay, dt, yh);
            for (pi, yv) in yh.iter_mut().enumerate() {
                let skip = if c.d_has_hdim { layer.d[hh * p + pi] } else { layer.d[hh] };
                *yv = *yv + skip * x[pi];
            }
        }

        // Gated group-wise norm, out_proj, residual.
        gated_norm_row(&dims, &st.y, &st.zx[..di], &layer.gated_norm, &mut st.normed_y, &mut st.rstd);
        matvec(&st.normed_y, &layer.out_proj, &mut st.mixed, st.helper.0.as_ref());
        for (hv, &m) in st.hidden.iter_mut().zip(&st.mixed) {
            *hv = *hv + m;
        }
    }
}

fn rms_norm<T: HostFloat>(x: &[T], w: &[T], eps: f64, out: &mut [T]) {
    rms_row(x, w, T::from(eps).expect("finite eps"), out);
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

fn matvec<T: HostFloat>(x: &[T], l: &Linear<T>, out: &mut [T], helper: Option<&Helper<T>>) {
    debug_assert_eq!(out.len(), l.d_out);
    if l.panels {
        #[cfg(target_arch = "x86_64")]
        match helper {
            Some(helper) => helper.matvec(x, &l.weight, out),
            // SAFETY: panels are only packed when the CPU has AVX-512, for these sizes.
            None => unsafe { crate::simd::matvec_panels(x, &l.weight, out) },
        }
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
