//! The core's backward pass: gradients of every input given those of the gated norm's output
//! and of the final state. The backward runs the recurrence again rather than storing states:
//! it keeps no state but the running one, so memory does not grow with `L` times the state.

use rayon::prelude::*;

use crate::buffers::{build_rows, sum_partials, zeros, Pieces, ROWS_PER_TASK};
use crate::conv::{conv_backward_rows, transpose_conv};
use crate::core_data::{Inputs, Params, Saved};
use crate::float::{multiversion, HostFloat};
use crate::layout::Dims;
use crate::norm::norm_backward_rows;
use crate::scan::{scan_block_backward, BlockGrads};

/// Gradients of every input of the core.
#[derive(Debug)]
pub(crate) struct Grads<T> {
    pub zx: Vec<T>,
    pub tail: Vec<T>,
    pub h0: Vec<T>,
    pub conv_w: Vec<T>,
    pub conv_b: Vec<T>,
    pub dt_bias: Vec<T>,
    pub a_log: Vec<T>,
    pub d: Vec<T>,
    pub norm_w: Vec<T>,
}

multiversion! {
    /// For the rows from `first` on: the blocks' B and C gradients added into `gxa` (whose x
    /// columns the scan's tasks wrote), all back through the SiLU (so that `gxa` ends as the
    /// gradient of the convolution's output), and dt's gradient through softplus and clamp into
    /// the dt columns of `gzx`. Returns these rows' part of dt_bias's gradient.
    fn scatter_rows<T>(
        dims: &Dims, saved: &Saved<T>, blocks: &[BlockGrads<T>], nblk: usize, first: usize,
        gxa: &mut [T], gzx: &mut [T]
    ) -> Vec<T> {
        let (l, h, w, cd) = (dims.len, dims.nheads, dims.width(), dims.conv_dim());
        let gn = dims.ngroups * dims.d_state;
        let mut dtb = vec![T::zero(); h];
        for (i, (row, gzr)) in gxa.chunks_mut(cd).zip(gzx.chunks_mut(w)).enumerate() {
            let r = first + i;
            let (b, t) = (r / l, r % l);
            for bg in &blocks[b * nblk..(b + 1) * nblk] {
                let (first, heads) = (bg.first, bg.heads);
                for (o, &v) in row[dims.bc()].iter_mut().zip(&bg.gbc[t * 2 * gn..(t + 1) * 2 * gn]) {
                    *o = *o + v;
                }
                for j in 0..heads {
                    let hh = first + j;
                    let graw = bg.gdt[t * heads + j] * saved.dt[r * 3 * h + 2 * h + hh];
                    gzr[dims.dt().start + hh] = graw;
                    dtb[hh] = dtb[hh] + graw;
                }
            }
            // d silu(x) / dx = s (1 + x (1 - s)) = s + silu(x) (1 - s), while the row is in cache.
            let (sx, xa) = (&saved.sx[r * cd..(r + 1) * cd], &saved.xa[r * cd..(r + 1) * cd]);
            for ((v, &s), &xav) in row.iter_mut().zip(sx).zip(xa) {
                *v = *v * (s + xav * (T::one() - s));
            }
        }
        dtb
    }
}

/// The backward pass: gradients of every input, given those of the norm's output (`gout`,
/// `[batch, L, d_inner]`, or `[sel.len(), d_inner]` when the forward had `sel`) and of the final
/// state (`gfin`, `[batch, nheads, headdim, d_state]`).
pub(crate) fn backward<T: HostFloat>(
    dims: &Dims,
    inp: &Inputs<T>,
    prm: &Params<T>,
    saved: &Saved<T>,
    sel: Option<&[usize]>,
    gout: &[T],
    gfin: &[T],
) -> Grads<T> {
    let (l, h, p, n) = (dims.len, dims.nheads, dims.headdim, dims.d_state);
    let (di, cd, w, k, rows) = (dims.d_inner(), dims.conv_dim(), dims.width(), dims.d_conv, dims.rows());
    let a: Vec<T> = prm.a_log.iter().map(|v| -v.exp()).collect();
    // Norm: gradient of y (into gy) and of z (into gzx, whose other columns the later passes
    // fill), and partial sums for the norm weight; zero at the rows the norm's output skipped.
    let ([gy, mut gzx], norm_partials) =
        build_rows(rows, ROWS_PER_TASK, [di, w], |first, [gy, gzx]| norm_backward_rows(dims, inp, prm, saved, sel, gout, first, gy, gzx));
    let norm_w = sum_partials(norm_partials, di);

    // The scan in reverse, one block of consecutive heads of one batch entry per task: one block
    // per entry when the batch alone keeps every thread busy, smaller blocks otherwise. Each task
    // sums the gradients of B and C over its heads itself, so that what it hands on is one
    // `[L, 2 ngroups d_state]` array, not one per head.
    let blocks_per_entry = (2 * rayon::current_num_threads()).div_ceil(dims.batch.max(1)).clamp(1, h);
    let hb = h.div_ceil(blocks_per_entry);
    let nblk = h.div_ceil(hb);
    // The x columns of `gxc` come straight from the scan's tasks, the rest below.
    let mut gxc = zeros(rows * cd);
    let per_block: Vec<BlockGrads<T>> = {
        let pieces = Pieces::new(&mut gxc);
        (0..dims.batch * nblk)
            .into_par_iter()
            .map(|task| {
                let (b, blk) = (task / nblk, task % nblk);
                let first = blk * hb;
                scan_block_backward(dims, inp, prm, saved, &gy, gfin, &a, b, first, hb.min(h - first), &pieces)
            })
            .collect()
    };

    // Per head: h0, A and D.
    let d_width = if dims.d_per_channel { p } else { 1 };
    let mut h0 = zeros(dims.batch * h * p * n);
    let mut a_log = vec![T::zero(); h];
    let mut d = vec![T::zero(); prm.d.len()];
    for (task, bg) in per_block.iter().enumerate() {
        let b = task / nblk;
        let start = (b * h + bg.first) * p * n;
        h0[start..start + bg.heads * p * n].copy_from_slice(&bg.gh0);
        for j in 0..bg.heads {
            let hh = bg.first + j;
            // d A / d A_log = A.
            a_log[hh] = a_log[hh] + bg.ga[j] * a[hh];
            for q in 0..d_width {
                d[hh * d_width + q] = d[hh * d_width + q] + bg.gd[j * d_width + q];
            }
        }
    }
    // Per row, in parallel: the blocks' B and C gradients into gxc, then all through the SiLU;
    // dt's into gzx.
    let dt_partials: Vec<Vec<T>> = gxc
        .par_chunks_mut(ROWS_PER_TASK * cd)
        .zip(gzx.par_chunks_mut(ROWS_PER_TASK * w))
        .enumerate()
        .map(|(task, (gxc, gzx))| scatter_rows(dims, saved, &per_block, nblk, task * ROWS_PER_TASK, gxc, gzx))
        .collect();
    let dt_bias = sum_partials(dt_partials, h);

    // The convolution: gradient of the pre-convolution rows, of the tail, and partial sums for
    // the weight and bias.
    let wt = transpose_conv(dims, prm.conv_w);
    let conv_partials: Vec<(Vec<T>, Vec<T>)> = gzx
        .par_chunks_mut(ROWS_PER_TASK * w)
        .enumerate()
        .map(|(task, gzx)| conv_backward_rows(dims, inp, &wt, &gxc, task * ROWS_PER_TASK, gzx))
        .collect();
    let mut gwt = vec![T::zero(); k * cd];
    let mut conv_b = vec![T::zero(); cd];
    for (gw_t, gb) in conv_partials {
        for (o, v) in gwt.iter_mut().zip(gw_t) {
            *o = *o + v;
        }
        for (o, v) in conv_b.iter_mut().zip(gb) {
            *o = *o + v;
        }
    }
    let mut conv_w = vec![T::zero(); cd * k];
    for ch in 0..cd {
        for j in 0..k {
            conv_w[ch * k + j] = gwt[j * cd + ch];
        }
    }
    // The tail's rows feed the first k - 1 outputs.
    let mut tail = vec![T::zero(); dims.batch * (k - 1) * cd];
    for b in 0..dims.batch {
        for s in 0..k - 1 {
            let row = &mut tail[(b * (k - 1) + s) * cd..(b * (k - 1) + s + 1) * cd];
            for t in 0..l.min(s + 1) {
                // Output t reads position t + j - (k - 1) through tap j; position s - (k - 1)
                // means j = s - t.
                let j = s - t;
                let gxo = &gxc[(b * l + t) * cd..(b * l + t + 1) * cd];
                for ((o, &gv), &wv) in row.iter_mut().zip(gxo).zip(&wt[j * cd..(j + 1) * cd]) {
                    *o = *o + wv * gv;
                }
            }
        }
    }

    Grads { zx: gzx, tail, h0, conv_w, conv_b, dt_bias, a_log, d, norm_w }
}
