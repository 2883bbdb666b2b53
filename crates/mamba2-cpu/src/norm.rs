//! The two RMS norms: the mixer's gated group-wise norm of the scan's output, and the block's
//! plain norm in front of the mixer (also the stack's final norm and the streaming step's).
//! As tensor operations each is a dozen single-threaded passes per layer and direction; here it
//! is one parallel pass over the rows each way.

use crate::buffers::{build_rows, sum_partials, ROWS_PER_TASK};
use crate::core_data::{Inputs, Params, Saved};
use crate::float::{c, dot, dot3, multiversion, sigmoid_into, HostFloat};
use crate::layout::Dims;

multiversion! {
    /// The gated norm of the scan's output `y` (all rows) for output rows `first` on, into
    /// `out`, with `1 / rms` into `rstd`: output row `i` is row `sel[i]` of `y` (row `i` without
    /// `sel`).
    fn norm_rows<T>(
        dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, y: &[T], sel: Option<&[usize]>, first: usize, out: &mut [T], rstd: &mut [T]
    ) {
        let (g, w, di) = (dims.ngroups, dims.width(), dims.d_inner());
        for (i, (orow, rs)) in out.chunks_mut(di).zip(rstd.chunks_mut(g)).enumerate() {
            let r = sel.map_or(first + i, |s| s[first + i]);
            gated_norm_row(dims, &y[r * di..(r + 1) * di], &inp.zx[r * w..][dims.z()], prm.norm_w, orow, rs);
        }
    }
}

/// One row of the gated group-wise RMS norm of `y` with gate `silu(z)` and weight `w`, in the
/// order `dims.gate_first` says; `1 / rms` of each group goes to `rstd`.
#[inline(always)]
pub(crate) fn gated_norm_row<T: HostFloat>(dims: &Dims, y: &[T], z: &[T], w: &[T], out: &mut [T], rstd: &mut [T]) {
    let gw = dims.d_inner() / dims.ngroups;
    // The gate silu(z) first, into `out`, which is then scaled in place.
    sigmoid_into(z, out);
    for (o, &zv) in out.iter_mut().zip(z) {
        *o = *o * zv;
    }
    for (gi, inv_out) in rstd.iter_mut().enumerate() {
        let span = gi * gw..(gi + 1) * gw;
        let (yg, og, wg) = (&y[span.clone()], &mut out[span.clone()], &w[span]);
        let ss = if dims.gate_first {
            for (o, &yv) in og.iter_mut().zip(yg) {
                *o = *o * yv;
            }
            dot(og, og)
        } else {
            dot(yg, yg)
        };
        let inv = T::one() / (ss / c(gw as f64) + c(dims.eps)).sqrt();
        *inv_out = inv;
        if dims.gate_first {
            for (o, &wv) in og.iter_mut().zip(wg) {
                *o = *o * inv * wv;
            }
        } else {
            for ((o, &yv), &wv) in og.iter_mut().zip(yg).zip(wg) {
                *o = yv * inv * wv * *o;
            }
        }
    }
}

multiversion! {
    /// The norm's backward for the rows from `first` on: the gradient of `y` into `gy` and of `z`
    /// into the `z` columns of `gzx` (both zero on entry); returns these rows' part of the norm
    /// weight's gradient. With `sel`, the norm's output and `gout` are at rows `sel` alone
    /// (rising), and the other rows are left at zero.
    fn norm_backward_rows<T>(
        dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, saved: &Saved<T>, sel: Option<&[usize]>, gout: &[T], first: usize,
        gy: &mut [T], gzx: &mut [T]
    ) -> Vec<T> {
        let (g, di, w) = (dims.ngroups, dims.d_inner(), dims.width());
        let gw = di / g;
        let mut gnw = vec![T::zero(); di];
        let mut sig = vec![T::zero(); di];
        // The next output row, and (with `sel`) the row of `y` it is.
        let mut next = sel.map_or(first, |s| s.partition_point(|&r| r < first));
        for (i, (gyr, gzr)) in gy.chunks_mut(di).zip(gzx.chunks_mut(w)).enumerate() {
            let r = first + i;
            if sel.is_some_and(|s| s.get(next) != Some(&r)) {
                continue;
            }
            let o = next;
            next += 1;
            let z = &inp.zx[r * w..][dims.z()];
            sigmoid_into(z, &mut sig);
            for gi in 0..g {
                let span = gi * gw..(gi + 1) * gw;
                let inv = saved.rstd[o * g + gi];
                let go = &gout[o * di..(o + 1) * di][span.clone()];
                let yr = &saved.y[r * di..(r + 1) * di][span.clone()];
                let (z, sig, nw) = (&z[span.clone()], &sig[span.clone()], &prm.norm_w[span.clone()]);
                let (gnw, gyr, gzr) = (&mut gnw[span.clone()], &mut gyr[span.clone()], &mut gzr[span]);
                // With v what the norm normalises and g_in the gradient reaching its output,
                // g_in v = go y silu(z) in either order; `gyr` holds it until its own value.
                for ((((o, &gov), &yv), &zv), &s) in gyr.iter_mut().zip(go).zip(yr).zip(z).zip(sig) {
                    *o = gov * yv * zv * s;
                }
                for (o, &v) in gnw.iter_mut().zip(gyr.iter()) {
                    *o = *o + v * inv;
                }
                let coef = inv * inv * inv * dot(gyr, nw) / c(gw as f64);
                let rows = gyr.iter_mut().zip(gzr.iter_mut()).zip(go.iter().zip(yr)).zip(z.iter().zip(sig).zip(nw));
                if dims.gate_first {
                    // v = y silu(z), g_in = go.
                    for (((gyv, gzv), (&gov, &yv)), ((&zv, &s), &wv)) in rows {
                        let sz = zv * s;
                        let gv = inv * wv * gov - coef * yv * sz;
                        *gyv = gv * sz;
                        *gzv = gv * yv * s * (T::one() + zv * (T::one() - s));
                    }
                } else {
                    // v = y, g_in = go silu(z).
                    for (((gyv, gzv), (&gov, &yv)), ((&zv, &s), &wv)) in rows {
                        *gyv = inv * wv * gov * zv * s - coef * yv;
                        *gzv = gov * yv * inv * wv * s * (T::one() + zv * (T::one() - s));
                    }
                }
            }
        }
        gnw
    }
}

// The block's RMS norm in front of the mixer (one group over `d_model`, no gate), for the fused
// block of `fast.rs`: as tensor operations it is a dozen single-threaded passes per layer and
// direction; here it is one parallel pass over the rows each way.

/// `out = x / rms(x) * w` for one row; returns `1 / rms`. Also the streaming step's norm.
#[inline(always)]
pub(crate) fn rms_row<T: HostFloat>(x: &[T], w: &[T], eps: T, out: &mut [T]) -> T {
    let inv = T::one() / (dot(x, x) / c(x.len() as f64) + eps).sqrt();
    for ((o, &v), &wv) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * wv;
    }
    inv
}

multiversion! {
    /// [`rms_row`] for each row of `x` (rows of `w.len()` values), `1 / rms` into `rstd`.
    fn rms_rows<T>(x: &[T], w: &[T], eps: T, out: &mut [T], rstd: &mut [T]) {
        let d = w.len();
        for ((xr, or), inv) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)).zip(rstd.iter_mut()) {
            *inv = rms_row(xr, w, eps, or);
        }
    }
}

/// The block's RMS norm of `x` (`[rows, w.len()]`): the normalised rows and `1 / rms` per row.
pub(crate) fn rms_norm<T: HostFloat>(x: &[T], w: &[T], eps: f64) -> (Vec<T>, Vec<T>) {
    let d = w.len().max(1);
    let rows = x.len() / d;
    let ([out, rstd], _) =
        build_rows(rows, ROWS_PER_TASK, [d, 1], |first, [o, r]| rms_rows(&x[first * d..first * d + o.len()], w, c(eps), o, r));
    (out, rstd)
}

/// `x / rms(x)` per row of `d` values, given `1 / rms` per row (`rstd`): the block norm's
/// output before its weight.
pub(crate) fn rms_unit<T: HostFloat>(x: &[T], rstd: &[T], d: usize) -> Vec<T> {
    let d = d.max(1);
    let ([out], _) = build_rows(x.len() / d, ROWS_PER_TASK, [d], |first, [o]| {
        for ((orow, xrow), &inv) in o.chunks_mut(d).zip(x[first * d..].chunks(d)).zip(&rstd[first..]) {
            for (v, &xv) in orow.iter_mut().zip(xrow) {
                *v = xv * inv;
            }
        }
    });
    out
}

multiversion! {
    /// The norm's backward for a block of rows: `gx` holds the gradient that reaches `x` another
    /// way (the residual) and gets the norm's part added; returns these rows' part of `w`'s
    /// gradient. `g` is the gradient of the norm's output.
    fn rms_backward_rows<T>(x: &[T], w: &[T], rstd: &[T], g: &[T], gx: &mut [T]) -> Vec<T> {
        let d = w.len();
        let mut gw = vec![T::zero(); d];
        let rows = x.chunks_exact(d).zip(g.chunks_exact(d)).zip(gx.chunks_exact_mut(d)).zip(rstd);
        for (((xr, gr), gxr), &inv) in rows {
            // With xh = x inv: dL/dx = inv (g w) - inv^3 x sum(g w x) / d.
            for (gwv, (&gv, &xv)) in gw.iter_mut().zip(gr.iter().zip(xr)) {
                *gwv = *gwv + gv * xv * inv;
            }
            let coef = inv * inv * inv * dot3(gr, w, xr) / c(d as f64);
            for ((o, (&gv, &xv)), &wv) in gxr.iter_mut().zip(gr.iter().zip(xr)).zip(w) {
                *o = *o + inv * gv * wv - coef * xv;
            }
        }
        gw
    }
}

/// The block norm's backward: the gradient of `x` (`[rows, d]`), that reaching it around the
/// norm (`around`, the residual's, when there is one) plus the norm's part, given the gradient
/// `g` of the norm's output; and the weight's gradient.
pub(crate) fn rms_norm_backward<T: HostFloat>(x: &[T], w: &[T], rstd: &[T], g: &[T], around: Option<&[T]>) -> (Vec<T>, Vec<T>) {
    let d = w.len().max(1);
    let ([gx], parts) = build_rows(x.len() / d, ROWS_PER_TASK, [d], |first, [gxc]| {
        let (rows, span) = (gxc.len() / d, first * d..first * d + gxc.len());
        if let Some(around) = around {
            gxc.copy_from_slice(&around[span.clone()]);
        }
        rms_backward_rows(&x[span.clone()], w, &rstd[first..first + rows], &g[span], gxc)
    });
    (gx, sum_partials(parts, w.len()))
}
