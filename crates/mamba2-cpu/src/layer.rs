//! One layer on host buffers: the whole mixer (`in_proj`, the core, `out_proj`) and, when asked,
//! the block around it (its RMS norm in front, the residual) and the stack's final norm after it,
//! forward and backward. The projections run on the `gemm` crate into buffers this crate owns,
//! so that nothing is allocated, zero-filled and copied between the stages.
//!
//! The caller (`mamba2-model`'s bridge) hands over a [`LayerPlan`] of slices and gets back one
//! packed output `[y | final state | conv tail]` ([`packed_parts`]) and, for the backward, a
//! [`LayerGrads`] with one gradient per named input. With [`LayerPlan::picks`] `y` holds only
//! the picked rows of each sequence: the gated norm, `out_proj`, the residual and the final norm
//! run there alone, while the scan and the states it hands on still cover every row.

use crate::backward::backward as core_backward;
use crate::buffers::{build, BUILD_CHUNK};
use crate::core_data::{Inputs, Params, Saved};
use crate::float::{dot, HostFloat};
use crate::forward::forward as core_forward;
use crate::layout::{Dims, Picks};
use crate::matmul::{affine, column_sums, product, Mat};
use crate::norm::{rms_norm, rms_norm_backward, rms_unit};

/// A layer's input, state and weights, row-major, in the layouts Burn's modules hold them.
#[derive(Debug, Clone, Copy)]
pub struct LayerPlan<'a, T> {
    /// Sizes of this call.
    pub dims: Dims,
    /// The input, `[batch, L, d_model]`: the mixer's, or the block's with `pre_w`.
    pub u: &'a [T],
    /// `in_proj`: `[d_model, width]` and `[width]`.
    pub in_w: &'a [T],
    /// See `in_w`.
    pub in_b: Option<&'a [T]>,
    /// `[batch, d_conv - 1, conv_dim]`, the convolution's left context; zeros when `None`.
    pub tail: Option<&'a [T]>,
    /// `[batch, nheads, headdim, d_state]`, the scan's initial state; zeros when `None`.
    pub h0: Option<&'a [T]>,
    /// `[conv_dim, d_conv]`.
    pub conv_w: &'a [T],
    /// `[conv_dim]`.
    pub conv_b: Option<&'a [T]>,
    /// `[nheads]`.
    pub dt_bias: &'a [T],
    /// `[nheads]`.
    pub a_log: &'a [T],
    /// `[nheads]` or `[d_inner]`.
    pub d: &'a [T],
    /// The gated norm's weight, `[d_inner]`.
    pub norm_w: &'a [T],
    /// `out_proj`: `[d_inner, d_model]` and `[d_model]`.
    pub out_w: &'a [T],
    /// See `out_w`.
    pub out_b: Option<&'a [T]>,
    /// The block around the mixer, when given: the weight `[d_model]` of the RMS norm in front of
    /// it. Then `u` is the block's input, the mixer reads its norm, and the output is `u` plus
    /// the mixer's (the residual).
    pub pre_w: Option<&'a [T]>,
    /// The stack's final RMS norm weight `[d_model]`, when this is its last layer: the output is
    /// then that norm of what it would otherwise be.
    pub post_w: Option<&'a [T]>,
    /// The rows of each sequence the output is wanted at (`y` is then `[batch, picks.n,
    /// d_model]`); every row when `None`. Must [`fit`](Picks::fit) `dims.len`.
    pub picks: Option<Picks>,
}

impl<'a, T: HostFloat> LayerPlan<'a, T> {
    fn params(&self) -> Params<'a, T> {
        Params { conv_w: self.conv_w, conv_b: self.conv_b, dt_bias: self.dt_bias, a_log: self.a_log, d: self.d, norm_w: self.norm_w }
    }

    /// The picked rows' indices into all rows, when not all rows are picked.
    fn picked(&self) -> Option<Vec<usize>> {
        let (batch, len) = (self.dims.batch, self.dims.len);
        self.picks.filter(|p| !p.all(len)).map(|p| {
            assert!(p.fit(len), "layer: {p:?} are not rows of a sequence of {len}");
            p.indices(batch, len)
        })
    }

    fn inputs<'b>(&self, zx: &'b [T]) -> Inputs<'b, T>
    where
        'a: 'b,
    {
        Inputs { zx, tail: self.tail, h0: self.h0 }
    }
}

/// The gradient of every input of a [`LayerPlan`], each named and shaped as its input; empty for
/// an absent input (and for `u` when the backward was told it is not needed).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)] // Each field is the gradient of the plan's field of the same name.
pub struct LayerGrads<T> {
    pub u: Vec<T>,
    pub in_w: Vec<T>,
    pub in_b: Vec<T>,
    pub tail: Vec<T>,
    pub h0: Vec<T>,
    pub conv_w: Vec<T>,
    pub conv_b: Vec<T>,
    pub dt_bias: Vec<T>,
    pub a_log: Vec<T>,
    pub d: Vec<T>,
    pub norm_w: Vec<T>,
    pub out_w: Vec<T>,
    pub out_b: Vec<T>,
    pub pre_w: Vec<T>,
    pub post_w: Vec<T>,
}

/// What the forward keeps for the backward, beyond the plan's inputs.
#[derive(Debug)]
pub struct LayerSaved<T> {
    /// The `in_proj` output, `[rows, width]`.
    zx: Vec<T>,
    /// The gated norm's output, the `out_proj` input, `[out rows, d_inner]`.
    normed: Vec<T>,
    core: Saved<T>,
    /// With the block's norm: its output, the `in_proj` input (`[rows, d_model]`), and `1 / rms`
    /// per row.
    pre: Option<(Vec<T>, Vec<T>)>,
    /// With the final norm: its input (`[out rows, d_model]`) and `1 / rms` per row.
    post: Option<(Vec<T>, Vec<T>)>,
    /// The picked rows' indices, when the output is not at every row.
    picked: Option<Vec<usize>>,
}

/// Lengths of the three parts of the packed output: `y` (at every row, or at the picked ones),
/// the final scan state, the conv tail.
pub fn packed_parts(dims: &Dims, picks: Option<Picks>) -> [usize; 3] {
    let out_rows = picks.map_or(dims.len, |p| p.n) * dims.batch;
    [out_rows * dims.d_model, dims.batch * dims.state_len(), dims.batch * (dims.d_conv - 1) * dims.conv_dim()]
}

/// Rows `rows` of a row-major matrix `width` wide, in their order, copied by the rayon pool.
fn gather<T: HostFloat>(src: &[T], width: usize, rows: &[usize]) -> Vec<T> {
    let width = width.max(1);
    build(rows.len() * width, width * BUILD_CHUNK.div_ceil(width), |at, c| {
        for (o, &r) in c.chunks_mut(width).zip(&rows[at / width..]) {
            o.copy_from_slice(&src[r * width..(r + 1) * width]);
        }
    })
}

/// A `[n, width]` matrix, zero but for row `rows[i]`, which is `src`'s row `i` (`rows` rising),
/// written by the rayon pool.
fn scatter<T: HostFloat>(src: &[T], width: usize, rows: &[usize], n: usize) -> Vec<T> {
    let width = width.max(1);
    build(n * width, width * BUILD_CHUNK.div_ceil(width), |at, c| {
        let (first, last) = (at / width, (at + c.len()) / width);
        let from = rows.partition_point(|&r| r < first);
        for (i, &r) in rows[from..].iter().take_while(|&&r| r < last).enumerate() {
            let src_row = from + i;
            c[(r - first) * width..(r - first + 1) * width].copy_from_slice(&src[src_row * width..(src_row + 1) * width]);
        }
    })
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

/// The layer's forward: the packed output `[y | final state | conv tail]` and, with `keep`, what
/// the backward needs.
pub fn forward<T: HostFloat>(a: &LayerPlan<T>, keep: bool) -> (Vec<T>, Option<LayerSaved<T>>) {
    let dims = a.dims;
    let (rows, dm, w, di, cd) = (dims.rows(), dims.d_model, dims.width(), dims.d_inner(), dims.conv_dim());
    let pre = a.pre_w.map(|pw| rms_norm(a.u, pw, dims.eps));
    let u = pre.as_ref().map_or(a.u, |(normed, _)| normed);
    let zx = affine(rows, w, dm, Mat::rows(u, dm), Mat::rows(a.in_w, w), a.in_b, None);
    // From the gated norm on only the output's rows: all, or the picked ones.
    let picked = a.picked();
    let (normed, fin, core) = core_forward(&dims, &a.inputs(&zx), &a.params(), picked.as_deref(), keep);

    let [ny, ns, nt] = packed_parts(&dims, a.picks);
    let out_rows = picked.as_ref().map_or(rows, Vec::len);
    let u_picked = picked.as_ref().filter(|_| pre.is_some()).map(|sel| gather(a.u, dm, sel));
    let residual = pre.is_some().then(|| u_picked.as_deref().unwrap_or(a.u));
    let mut out = affine(out_rows, dm, di, Mat::rows(&normed, di), Mat::rows(a.out_w, dm), a.out_b, residual);
    drop(u_picked);
    let post = a.post_w.map(|pw| {
        let (normed, rstd) = rms_norm(&out, pw, dims.eps);
        (std::mem::replace(&mut out, normed), rstd)
    });
    out.reserve_exact(ns + nt);
    out.extend_from_slice(&fin);
    let xbc = dims.xbc();
    for i in 0..dims.batch * (dims.d_conv - 1) {
        let (b, s) = (i / (dims.d_conv - 1), i % (dims.d_conv - 1));
        match (tail_source(&dims, b, s), a.tail) {
            (Ok(r), _) => out.extend_from_slice(&zx[r * w + xbc.start..r * w + xbc.end]),
            (Err(r), Some(old)) => out.extend_from_slice(&old[r * cd..(r + 1) * cd]),
            (Err(_), None) => out.resize(out.len() + cd, T::zero()),
        }
    }
    debug_assert_eq!(out.len(), ny + ns + nt);
    (out, keep.then_some(LayerSaved { zx, normed, core, pre, post, picked }))
}

/// The layer's backward: the gradient of every input, given that of the packed output. With
/// `need_u` false (the input is not tracked, as for a stack's first layer fed data) the input's
/// gradient is left empty: its product with `in_proj`'s weight is a sixth of a layer's matrix
/// work, and torch skips it too.
pub fn backward<T: HostFloat>(a: &LayerPlan<T>, saved: &LayerSaved<T>, gout: &[T], need_u: bool) -> LayerGrads<T> {
    let dims = a.dims;
    let (rows, dm, w, di, cd) = (dims.rows(), dims.d_model, dims.width(), dims.d_inner(), dims.conv_dim());
    let [ny, ns, _] = packed_parts(&dims, a.picks);
    let out_rows = ny / dm.max(1);
    let (gy, rest) = gout.split_at(ny);
    let (gfin, gtail_out) = rest.split_at(ns);
    // Through the final norm first, when this is the stack's last layer.
    let (gy_post, post_w) = match (&saved.post, a.post_w) {
        (Some((y, rstd)), Some(pw)) => {
            let (g, gw) = rms_norm_backward(y, pw, rstd, gy, None);
            (Some(g), gw)
        }
        _ => (None, Vec::new()),
    };
    let gy = gy_post.as_deref().unwrap_or(gy);

    // out_proj: its weight, its bias, and the gradient reaching the norm's output (at the
    // output's rows, as the norm's output is).
    let out_w = product(di, dm, out_rows, Mat::transposed(&saved.normed, di), Mat::rows(gy, dm));
    let out_b = if a.out_b.is_some() { column_sums(gy, dm) } else { Vec::new() };
    let gnormed = product(out_rows, di, dm, Mat::rows(gy, dm), Mat::transposed(a.out_w, dm));
    // The residual's gradient at every row, where it is needed.
    let gy_all = saved.picked.as_ref().filter(|_| saved.pre.is_some() && need_u).map(|sel| scatter(gy, dm, sel, rows));
    let gy_around = gy_all.as_deref().unwrap_or(gy);

    let sel = saved.picked.as_deref();
    let mut g = core_backward(&dims, &a.inputs(&saved.zx), &a.params(), &saved.core, sel, &gnormed, gfin);
    drop(gnormed);
    // The conv tail handed on is made of pre-convolution rows: its gradient goes back to them.
    let xbc = dims.xbc();
    for (i, grow) in gtail_out.chunks(cd).enumerate() {
        let (b, s) = (i / (dims.d_conv - 1), i % (dims.d_conv - 1));
        let dst = match tail_source(&dims, b, s) {
            Ok(r) => &mut g.zx[r * w + xbc.start..r * w + xbc.end],
            Err(r) => &mut g.tail[r * cd..(r + 1) * cd],
        };
        for (o, &v) in dst.iter_mut().zip(grow) {
            *o = *o + v;
        }
    }

    // in_proj: its weight, its bias, and the gradient of its input.
    let in_b = if a.in_b.is_some() { column_sums(&g.zx, w) } else { Vec::new() };
    let g_in = || product(rows, dm, w, Mat::rows(&g.zx, w), Mat::transposed(a.in_w, w));
    let (in_w, u, pre_w) = match (&saved.pre, a.pre_w) {
        (Some((_, rstd)), Some(pw)) if !need_u => {
            // The norm weight's gradient, sum_r g_in[r, j] xhat[r, j] with g_in = gzx in_w^T,
            // is sum_k in_w[j, k] G[j, k] with G = xhat^T gzx; and in_proj's weight gradient is
            // G with row j scaled by the norm weight, so no g_in is needed at all.
            let xhat = rms_unit(a.u, rstd, dm);
            let mut gw = product(dm, w, rows, Mat::transposed(&xhat, dm), Mat::rows(&g.zx, w));
            let pre_w = gw.chunks(w).zip(a.in_w.chunks(w)).map(|(gr, wr)| dot(gr, wr)).collect();
            for (row, &scale) in gw.chunks_mut(w).zip(pw) {
                row.iter_mut().for_each(|v| *v = *v * scale);
            }
            (gw, Vec::new(), pre_w)
        }
        // With the block around the mixer, `u` reaches the output through the norm and directly.
        (Some((normed, rstd)), Some(pw)) => {
            let in_w = product(dm, w, rows, Mat::transposed(normed, dm), Mat::rows(&g.zx, w));
            let (u, pre_w) = rms_norm_backward(a.u, pw, rstd, &g_in(), Some(gy_around));
            (in_w, u, pre_w)
        }
        _ => {
            let in_w = product(dm, w, rows, Mat::transposed(a.u, dm), Mat::rows(&g.zx, w));
            (in_w, if need_u { g_in() } else { Vec::new() }, Vec::new())
        }
    };

    LayerGrads {
        u,
        in_w,
        in_b,
        tail: g.tail,
        h0: g.h0,
        conv_w: g.conv_w,
        conv_b: g.conv_b,
        dt_bias: g.dt_bias,
        a_log: g.a_log,
        d: g.d,
        norm_w: g.norm_w,
        out_w,
        out_b,
        pre_w,
        post_w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With picks, the output is the unpicked output's picked rows and the states are the same;
    /// backward, every gradient equals the unpicked backward's given a gradient that is zero at
    /// the rows not picked. In f64, for the mixer alone and for the block with both norms.
    #[test]
    fn picked_rows_equal_the_whole_output_at_those_rows() {
        // At L 40 the 120 rows are more than one task of the gated norm's: the second task
        // starts after some of the picked rows.
        for len in [11, 40] {
            picked_rows_at(len);
        }
    }

    fn picked_rows_at(len: usize) {
        let dims = Dims {
            batch: 3,
            len,
            d_model: 6,
            nheads: 4,
            headdim: 2,
            ngroups: 2,
            d_state: 3,
            d_conv: 4,
            d_per_channel: false,
            dt_lo: 0.0,
            dt_hi: f64::INFINITY,
            gate_first: true,
            eps: 1e-5,
        };
        let wave = |n: usize, f: f64, a: f64| (0..n).map(|i| ((i as f64 + 1.0) * f).sin() * a).collect::<Vec<f64>>();
        let (dm, w, cd, di, h) = (dims.d_model, dims.width(), dims.conv_dim(), dims.d_inner(), dims.nheads);
        let u = wave(dims.rows() * dm, 0.61, 1.0);
        let (in_w, in_b, conv_w) = (wave(dm * w, 0.37, 0.4), wave(w, 0.5, 0.1), wave(cd * 4, 0.83, 0.5));
        let (dt_bias, a_log, d) = (wave(h, 1.3, 1.0), wave(h, 0.7, 0.5), wave(h, 0.45, 1.0));
        let (norm_w, out_w, out_b, pre_w, post_w) =
            (wave(di, 0.2, 1.0), wave(di * dm, 0.53, 0.3), wave(dm, 0.9, 0.1), wave(dm, 0.3, 1.0), wave(dm, 0.4, 1.0));
        let (tail, h0) = (wave(dims.batch * 3 * cd, 0.17, 0.5), wave(dims.batch * dims.state_len(), 0.23, 0.5));
        let picks = Picks { n: 4, every: 3 };
        let sel = picks.indices(dims.batch, dims.len);
        for block in [false, true] {
            let plan = |picks: Option<Picks>| LayerPlan {
                dims,
                u: &u,
                in_w: &in_w,
                in_b: Some(&in_b),
                tail: Some(&tail),
                h0: Some(&h0),
                conv_w: &conv_w,
                conv_b: None,
                dt_bias: &dt_bias,
                a_log: &a_log,
                d: &d,
                norm_w: &norm_w,
                out_w: &out_w,
                out_b: Some(&out_b),
                pre_w: block.then_some(&pre_w[..]),
                post_w: block.then_some(&post_w[..]),
                picks,
            };
            let (whole, whole_saved) = forward(&plan(None), true);
            let (part, part_saved) = forward(&plan(Some(picks)), true);
            let [ny, ..] = packed_parts(&dims, None);
            let [py, ..] = packed_parts(&dims, Some(picks));
            assert_eq!(py, sel.len() * dm);
            let close = |a: &[f64], b: &[f64], what: &str| {
                assert_eq!(a.len(), b.len(), "{what}: lengths");
                let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
                assert!(worst <= 1e-12, "L {len}, block {block}, {what}: differ by {worst:e}");
            };
            close(&part[..py], &gather(&whole[..ny], dm, &sel), "output");
            close(&part[py..], &whole[ny..], "states");

            // A gradient at the picked rows and on the states; zero elsewhere in the whole one.
            let g_part = wave(part.len(), 0.41, 1.0);
            let mut g_whole = scatter(&g_part[..py], dm, &sel, dims.rows());
            g_whole.extend_from_slice(&g_part[py..]);
            let a = backward(&plan(None), &whole_saved.unwrap(), &g_whole, true);
            let b = backward(&plan(Some(picks)), &part_saved.unwrap(), &g_part, true);
            let named = |g: &LayerGrads<f64>| {
                [
                    &g.u, &g.in_w, &g.in_b, &g.tail, &g.h0, &g.conv_w, &g.dt_bias, &g.a_log, &g.d, &g.norm_w, &g.out_w, &g.out_b, &g.pre_w,
                    &g.post_w,
                ]
                .map(|v| v.clone())
            };
            for (i, (x, y)) in named(&a).iter().zip(named(&b).iter()).enumerate() {
                close(x, y, &format!("gradient {i}"));
            }
        }
    }
}
