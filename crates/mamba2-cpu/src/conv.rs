//! The causal depthwise convolution over `xBC` with its SiLU, and `dt = clamp(softplus(dt_raw +
//! dt_bias))`, forward and backward, a block of rows per task.

use crate::core_data::{Inputs, Params};
use crate::float::{c, multiversion, sigmoid_into, HostFloat};
use crate::layout::Dims;

/// `softplus` with the generic path's threshold: the identity above 20.
pub(crate) fn softplus<T: HostFloat>(v: T) -> T {
    if v > c(20.0) {
        v
    } else {
        v.exp().ln_1p()
    }
}

/// The left-context row `s` (negative: from the tail) of the `xBC` channels for batch `b`;
/// `None` for a row before the sequence when no tail is given (zeros, which add nothing).
#[inline(always)]
pub(crate) fn ext_row<'a, T: HostFloat>(dims: &Dims, inp: &Inputs<'a, T>, b: usize, s: isize) -> Option<&'a [T]> {
    let (cd, w, k, xbc) = (dims.conv_dim(), dims.width(), dims.d_conv, dims.xbc());
    if s >= 0 {
        let r = b * dims.len + s as usize;
        Some(&inp.zx[r * w + xbc.start..r * w + xbc.end])
    } else {
        let r = b * (k - 1) + (k as isize - 1 + s) as usize;
        inp.tail.map(|tail| &tail[r * cd..(r + 1) * cd])
    }
}

/// `wt[k][c] = w[c][k]`, so that the convolution's inner loop runs over contiguous channels.
pub(crate) fn transpose_conv<T: HostFloat>(dims: &Dims, w: &[T]) -> Vec<T> {
    let (cd, k) = (dims.conv_dim(), dims.d_conv);
    let mut wt = vec![T::zero(); cd * k];
    for ch in 0..cd {
        for j in 0..k {
            wt[j * cd + ch] = w[ch * k + j];
        }
    }
    wt
}

// The passes below work on a block of rows (or one scan task) each and are compiled per
// instruction set (see `multiversion!`): rayon calls them from closures, which would otherwise
// be compiled for the baseline target only.

multiversion! {
    /// The convolution with its SiLU, and `dt`, for the rows from `first` on (one per `conv_dim`
    /// of `xa`): the pre-activation's sigmoid into `sx`, the SiLU into `xa`, and `dt` with what
    /// the scan and the backward take from it (see [`Saved::dt`]). `sx` holds either one row per
    /// row of `xa` (kept for the backward) or a single scratch row.
    fn conv_rows<T>(
        dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, wt: &[T], a: &[T], first: usize,
        sx: &mut [T], xa: &mut [T], dt: &mut [T]
    ) {
        let (l, h, k, w, cd) = (dims.len, dims.nheads, dims.d_conv, dims.width(), dims.conv_dim());
        let per_row = sx.len() == xa.len();
        let mut xc = vec![T::zero(); cd];
        for (i, (xa, dt)) in xa.chunks_mut(cd).zip(dt.chunks_mut(3 * h)).enumerate() {
            let r = first + i;
            let (b, t) = (r / l, r % l);
            let span = if per_row { i * cd..(i + 1) * cd } else { 0..cd };
            let sx = &mut sx[span];
            match prm.conv_b {
                Some(bias) => xc.copy_from_slice(bias),
                None => xc.fill(T::zero()),
            }
            for j in 0..k {
                if let Some(src) = ext_row(dims, inp, b, t as isize + j as isize - (k as isize - 1)) {
                    for ((o, &x), &wv) in xc.iter_mut().zip(src).zip(&wt[j * cd..(j + 1) * cd]) {
                        *o = *o + wv * x;
                    }
                }
            }
            sigmoid_into(&xc, sx);
            for ((o, &s), &v) in xa.iter_mut().zip(sx.iter()).zip(xc.iter()) {
                *o = v * s;
            }
            let raw = &inp.zx[r * w + dims.dt().start..r * w + dims.dt().end];
            let (dt, rest) = dt.split_at_mut(h);
            let (decay, ddt) = rest.split_at_mut(h);
            for hh in 0..h {
                let v = raw[hh] + prm.dt_bias[hh];
                // softplus(v) = log(1 + e^v) and its derivative sigmoid(v) = e^v / (1 + e^v), from
                // one exp; the identity above 20, as in the generic path.
                let (sp, dsp) = if v > c(20.0) {
                    (v, T::one())
                } else {
                    let e = v.exp();
                    (e.ln_1p(), e / (T::one() + e))
                };
                let clamped = clamp_dt(dims, sp);
                dt[hh] = clamped;
                decay[hh] = (clamped * a[hh]).exp();
                // The clamp passes no gradient where it bites.
                let passes = (dims.dt_lo <= 0.0 || sp > c(dims.dt_lo)) && (!dims.dt_hi.is_finite() || sp < c(dims.dt_hi));
                ddt[hh] = if passes { dsp } else { T::zero() };
            }
        }
    }
}

/// `dt = clamp(softplus(raw + bias), dt_lo, dt_hi)`, as in the generic path.
pub(crate) fn step_size<T: HostFloat>(dims: &Dims, raw: T, bias: T) -> T {
    clamp_dt(dims, softplus(raw + bias))
}

pub(crate) fn clamp_dt<T: HostFloat>(dims: &Dims, v: T) -> T {
    let v = if dims.dt_lo > 0.0 { v.max(c(dims.dt_lo)) } else { v };
    if dims.dt_hi.is_finite() {
        v.min(c(dims.dt_hi))
    } else {
        v
    }
}

multiversion! {
    /// The convolution's backward for the rows from `first` on, given the gradient `gxc` of its
    /// output (all rows): the gradient of each input row into the `xBC` columns of `gzx` (each
    /// task writes only its own rows), and these rows' parts of the gradients of the transposed
    /// weight (`[d_conv, conv_dim]`) and of the bias.
    fn conv_backward_rows<T>(dims: &Dims, inp: &Inputs<T>, wt: &[T], gxc: &[T], first: usize, gzx: &mut [T]) -> (Vec<T>, Vec<T>) {
        let (l, k, w, cd) = (dims.len, dims.d_conv, dims.width(), dims.conv_dim());
        let mut gw_t = vec![T::zero(); k * cd];
        let mut gb = vec![T::zero(); cd];
        for (i, gzr) in gzx.chunks_mut(w).enumerate() {
            let r = first + i;
            let (b, t) = (r / l, r % l);
            let gxr = &gxc[r * cd..(r + 1) * cd];
            for (o, &v) in gb.iter_mut().zip(gxr) {
                *o = *o + v;
            }
            let gin = &mut gzr[dims.xbc()];
            for j in 0..k {
                if let Some(src) = ext_row(dims, inp, b, t as isize + j as isize - (k as isize - 1)) {
                    for ((o, &x), &gv) in gw_t[j * cd..(j + 1) * cd].iter_mut().zip(src).zip(gxr) {
                        *o = *o + gv * x;
                    }
                }
                // Input row t feeds output row t + (k - 1 - j) through tap j.
                let to = t + (k - 1 - j);
                if to < l {
                    let gxo = &gxc[(b * l + to) * cd..(b * l + to + 1) * cd];
                    for ((o, &gv), &wv) in gin.iter_mut().zip(gxo).zip(&wt[j * cd..(j + 1) * cd]) {
                        *o = *o + wv * gv;
                    }
                }
            }
        }
        (gw_t, gb)
    }
}
