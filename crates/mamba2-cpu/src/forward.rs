//! The core's forward pass (convolution, scan, gated norm) over a batch of sequences, and what it
//! keeps for the backward.
//!
//! "Core" is everything between `in_proj` and `out_proj`. The generic path builds it from ~40
//! tensor operations, each a pass over memory and an autodiff node; here it is a handful of
//! passes over plain slices, and the scan is the sequential recurrence, whose state (`headdim x
//! d_state` per head) stays in cache.

use rayon::prelude::*;

use crate::buffers::{build_rows, Pieces, ROWS_PER_TASK};
use crate::conv::{conv_rows, transpose_conv};
use crate::core_data::{Inputs, Params, Saved};
use crate::float::HostFloat;
use crate::layout::Dims;
use crate::norm::norm_rows;
use crate::scan::scan_head;

/// The forward pass: the gated norm's output `[batch, L, d_inner]`, or `[sel.len(), d_inner]` at
/// the rows `sel` alone (rising indices into all `batch * L` rows), the final scan state
/// `[batch, nheads, headdim, d_state]`, and what the backward needs.
///
/// With `keep = false` (no backward will follow) the SiLU's sigmoid is not kept: the returned
/// [`Saved`] is then only good for dropping.
pub(crate) fn forward<T: HostFloat>(
    dims: &Dims,
    inp: &Inputs<T>,
    prm: &Params<T>,
    sel: Option<&[usize]>,
    keep: bool,
) -> (Vec<T>, Vec<T>, Saved<T>) {
    let (h, g) = (dims.nheads, dims.ngroups);
    let (di, cd, rows) = (dims.d_inner(), dims.conv_dim(), dims.rows());
    let wt = transpose_conv(dims, prm.conv_w);
    let a: Vec<T> = prm.a_log.iter().map(|v| -v.exp()).collect();

    // Convolution + SiLU and dt, in blocks of rows. The SiLU's sigmoid is kept for the backward;
    // in inference a scratch row per task takes its place.
    let widths = [if keep { cd } else { 0 }, cd, 3 * h];
    let ([sx, xa, dt], _) = build_rows(rows, ROWS_PER_TASK, widths, |first, [sx, xa, dt]| {
        if keep {
            conv_rows(dims, inp, prm, &wt, &a, first, sx, xa, dt)
        } else {
            conv_rows(dims, inp, prm, &wt, &a, first, &mut vec![T::zero(); cd], xa, dt)
        }
    });

    // The scan, one (batch, head) pair per task, each writing its columns of `y`, which is
    // neither zeroed first nor gathered from per-head buffers after.
    let (mut y, mut fin) = (Vec::with_capacity(rows * di), Vec::with_capacity(dims.batch * dims.state_len()));
    {
        let pieces = Pieces::uninit(&mut y.spare_capacity_mut()[..rows * di]);
        let states = Pieces::uninit(&mut fin.spare_capacity_mut()[..dims.batch * dims.state_len()]);
        (0..dims.batch * h).into_par_iter().for_each(|bh| scan_head(dims, inp, prm, &xa, &dt, bh, &pieces, &states));
    }
    // SAFETY: the pair (b, hh) wrote columns hh * p..(hh + 1) * p of every row of entry b, and
    // its state, so every value is set (a panic in a task propagates before these lines).
    unsafe {
        y.set_len(rows * di);
        fin.set_len(dims.batch * dims.state_len());
    }

    // The gated norm, written straight into `out`, at the rows wanted: its output feeds only
    // `out_proj`, which a forecaster reads at half the rows or fewer.
    let out_rows = sel.map_or(rows, <[usize]>::len);
    let ([out, rstd], _) =
        build_rows(out_rows, ROWS_PER_TASK, [di, g], |first, [out, rstd]| norm_rows(dims, inp, prm, &y, sel, first, out, rstd));
    (out, fin, Saved { sx, xa, dt, y, rstd })
}
