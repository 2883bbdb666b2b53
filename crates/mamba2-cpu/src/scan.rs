//! The selective scan: one head's step forward, in the backward's forward sweep and in reverse
//! (each a plain loop and an AVX-512 one, see [`crate::avx512`]), the forward scan of one
//! `(batch, head)` pair, and the backward scan of a block of heads in two sweeps.

use crate::buffers::{Lines, Pieces};
use crate::core_data::{Inputs, Params, Saved};
use crate::float::{dot, multiversion, update_dot, HostFloat};
use crate::layout::Dims;

multiversion! {
    /// One step of one head: `h = decay h + dt x B`, `y[p] = h[p] . C` for every row `p`.
    fn head_forward_plain<T>(state: &mut [T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, y: &mut [T]) {
        let n = b.len();
        for (pi, hs) in state.chunks_exact_mut(n).enumerate() {
            y[pi] = update_dot(hs, b, c, decay, x[pi] * dt);
        }
    }
}

multiversion! {
    /// One step of one head in the backward's forward sweep: `h = decay h + dt x B` in place;
    /// adds `sum_p gy[p] h[p]`, the gradient this head's output sends to `C`, into `gc` and
    /// returns its product with `C`, which is `gy . (h C)`.
    fn head_state_gc_plain<T>(state: &mut [T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, gy: &[T], gc: &mut [T]) -> T {
        let n = b.len();
        let mut q = T::zero();
        for ((hs, &xv), &g) in state.chunks_exact_mut(n).zip(x).zip(gy) {
            let xdt = xv * dt;
            for ((h, &bv), o) in hs.iter_mut().zip(b).zip(gc.iter_mut()) {
                *h = decay * *h + xdt * bv;
                *o = *o + g * *h;
            }
            q = q + g * dot(hs, c);
        }
        q
    }
}

multiversion! {
    /// One reverse step of one head. On entry `gh` is the gradient reaching `h_t` from later
    /// steps; on return it is the gradient reaching `h_{t-1}`. In between, with `G` the whole
    /// gradient of `h_t` (`gh + gy C`): adds `dt x[p] G[p]` to `gb` and writes `sb[p] = G[p] . B`.
    fn head_reverse_plain<T>(gh: &mut [T], gy: &[T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, gb: &mut [T], sb: &mut [T]) {
        let n = b.len();
        for (pi, g) in gh.chunks_exact_mut(n).enumerate() {
            let gyp = gy[pi];
            for (gv, &cv) in g.iter_mut().zip(c) {
                *gv = *gv + gyp * cv;
            }
            sb[pi] = dot(g, b);
            let xdt = x[pi] * dt;
            for (o, gv) in gb.iter_mut().zip(g.iter_mut()) {
                *o = *o + xdt * *gv;
                *gv = *gv * decay;
            }
        }
    }
}

/// One step of one head: `h = decay h + dt x B`, `y[p] = h[p] . C` for every row `p`.
pub(crate) fn head_forward<T: HostFloat>(state: &mut [T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, y: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if crate::avx512::usable::<T>(b.len()) {
        // SAFETY: `usable` checked the CPU and the row length.
        return unsafe { crate::avx512::head_forward(state, x, b, c, decay, dt, y) };
    }
    head_forward_plain(state, x, b, c, decay, dt, y)
}

/// One step of the backward's forward sweep; see [`head_state_gc_plain`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_state_gc<T: HostFloat>(state: &mut [T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, gy: &[T], gc: &mut [T]) -> T {
    #[cfg(target_arch = "x86_64")]
    if crate::avx512::usable::<T>(b.len()) {
        // SAFETY: as above.
        return unsafe { crate::avx512::head_state_gc(state, x, b, c, decay, dt, gy, gc) };
    }
    head_state_gc_plain(state, x, b, c, decay, dt, gy, gc)
}

/// One reverse step of one head; see [`head_reverse_plain`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_reverse<T: HostFloat>(gh: &mut [T], gy: &[T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, gb: &mut [T], sb: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if crate::avx512::usable::<T>(b.len()) {
        // SAFETY: as above.
        return unsafe { crate::avx512::head_reverse(gh, gy, x, b, c, decay, dt, gb, sb) };
    }
    head_reverse_plain(gh, gy, x, b, c, decay, dt, gb, sb)
}

/// Steps ahead of the scan's current one whose inputs [`prefetch`] asks for.
pub(crate) const AHEAD: usize = 4;

/// Asks the CPU to bring the cache lines of `s` into its nearest cache; a hint, which changes
/// no result. The scans need it: each step reads its `x`, `B`, `C` and `dt` from a new row of
/// buffers far larger than the caches, and one step's work fills the processor's reordering
/// window, so without it every step waited for its first loads (half of the forward scan's
/// time in a profile).
#[inline(always)]
pub(crate) fn prefetch<T>(s: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = s.as_ptr().cast::<i8>();
        let lead = p as usize % 64;
        let base = p.wrapping_sub(lead);
        for off in (0..lead + std::mem::size_of_val(s)).step_by(64) {
            // SAFETY: a prefetch reads nothing the program sees and cannot fault; every address
            // lies in a cache line that holds part of `s`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

/// Steps between the states the backward keeps to restart its running sum for the decay's
/// gradient (see [`scan_block_backward`]): the sum's rounding grows with the steps it runs.
pub(crate) const MARK: usize = 16;

/// Where one head's inputs of each step lie in the kernel's row buffers: `x`, `B` and `C` in
/// `xa`'s row, `dt` and the decay in `dt`'s (see [`Saved`]). Both scans read through it.
pub(crate) struct HeadRows<'a, T> {
    xa: &'a [T],
    dt: &'a [T],
    /// The entry's first row, and the width of an `xa` row (a `dt` row is `3 nheads`).
    row0: usize,
    cd: usize,
    /// Offsets of x, B and C in an `xa` row, and of dt in a `dt` row (the decay is `nheads`
    /// further).
    x: usize,
    b: usize,
    c: usize,
    hh: usize,
    h: usize,
    p: usize,
    n: usize,
}

impl<'a, T: HostFloat> HeadRows<'a, T> {
    fn new(dims: &Dims, xa: &'a [T], dt: &'a [T], b: usize, hh: usize) -> Self {
        let gi = dims.group_of(hh);
        let (x, b_col, c_col) = (dims.x_of(hh).start, dims.b_of(gi).start, dims.c_of(gi).start);
        Self {
            xa,
            dt,
            row0: b * dims.len,
            cd: dims.conv_dim(),
            x,
            b: b_col,
            c: c_col,
            hh,
            h: dims.nheads,
            p: dims.headdim,
            n: dims.d_state,
        }
    }

    /// Step `t`'s `x`, `B` and `C`, and its span of the `dt` row from dt to the decay.
    #[inline(always)]
    fn rows(&self, t: usize) -> (&'a [T], &'a [T], &'a [T], &'a [T]) {
        let r = self.row0 + t;
        let row = &self.xa[r * self.cd..(r + 1) * self.cd];
        let at = r * 3 * self.h + self.hh;
        let dts = &self.dt[at..=at + self.h];
        (&row[self.x..self.x + self.p], &row[self.b..self.b + self.n], &row[self.c..self.c + self.n], dts)
    }

    /// Step `t`'s `x`, `B`, `C`, dt and decay.
    #[inline(always)]
    fn at(&self, t: usize) -> (&'a [T], &'a [T], &'a [T], T, T) {
        let (x, bv, cv, dts) = self.rows(t);
        (x, bv, cv, dts[0], dts[self.h])
    }

    /// Asks for step `t`'s inputs (see [`prefetch`]).
    #[inline(always)]
    fn fetch(&self, t: usize) {
        let (x, bv, cv, dts) = self.rows(t);
        [x, bv, cv, dts].into_iter().for_each(prefetch);
    }
}

multiversion! {
    /// The forward scan of the `(batch, head)` pair `bh`: its output with the `D` skip into the
    /// head's columns of `y` (`[batch, L, d_inner]`) and its final state into its place in `fin`
    /// (`[batch, nheads, headdim, d_state]`), each written by this task alone.
    fn scan_head<T>(dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, xa: &[T], dt: &[T], bh: usize, y: &Pieces<T>, fin: &Pieces<T>) {
        let (l, h, p, n) = (dims.len, dims.nheads, dims.headdim, dims.d_state);
        let (b, hh) = (bh / h, bh % h);
        let mut state = Lines::zeros(p * n);
        if let Some(h0) = inp.h0 {
            state.copy_from_slice(&h0[bh * p * n..(bh + 1) * p * n]);
        }
        let mut yt = vec![T::zero(); p];
        let rows = HeadRows::new(dims, xa, dt, b, hh);
        for t in 0..l {
            if t + AHEAD < l {
                rows.fetch(t + AHEAD);
            }
            let (x, bv, cv, dtv, decay) = rows.at(t);
            head_forward(&mut state, x, bv, cv, decay, dtv, &mut yt);
            if dims.d_per_channel {
                for ((yv, &xv), &dv) in yt.iter_mut().zip(x).zip(&prm.d[hh * p..(hh + 1) * p]) {
                    *yv = *yv + dv * xv;
                }
            } else {
                let dv = prm.d[hh];
                for (yv, &xv) in yt.iter_mut().zip(x) {
                    *yv = *yv + dv * xv;
                }
            }
            // SAFETY: only this task writes head `hh`'s columns of batch entry `b`'s rows.
            unsafe { y.put(((b * l + t) * h + hh) * p, &yt) };
        }
        // SAFETY: only this task writes the pair's state.
        unsafe { fin.put(bh * p * n, &state) };
    }
}

/// What one task of the reverse scan hands on: the gradients of a block of consecutive heads of
/// one batch entry.
#[derive(Debug)]
pub(crate) struct BlockGrads<T> {
    /// The block's first head and its number of heads.
    pub(crate) first: usize,
    pub(crate) heads: usize,
    /// `[L, heads]`.
    pub(crate) gdt: Vec<T>,
    /// `[L, 2 ngroups d_state]`: the B and C columns, summed over the block's heads.
    pub(crate) gbc: Lines<T>,
    /// `[heads, headdim, d_state]`.
    pub(crate) gh0: Lines<T>,
    /// Per head.
    pub(crate) ga: Vec<T>,
    /// `[heads, headdim]` or `[heads, 1]`.
    pub(crate) gd: Vec<T>,
}

multiversion! {
    /// The backward scan of heads `first..first + heads` of batch entry `b`, given the gradient
    /// `gy` of the scan's output, in two sweeps per head and without storing a state.
    ///
    /// The forward sweep runs the recurrence again from `h0`, for the gradient of `C`
    /// (`sum_p gy[p] h_t[p]`) and for `q_t = gy_t . (h_t C_t)`. The reverse sweep carries `G_t`,
    /// the gradient of `h_t`, back from the final state's. The decay's gradient needs
    /// `<G_t, h_{t-1}>`, which would pair the two sweeps step by step; instead, with
    /// `h_t = a_t h_{t-1} + u_t` and `G_t = gy_t C_t + a_{t+1} G_{t+1}`,
    /// `dL/d log a_t = <G_t, h_t> - <G_t, u_t> = q_t - dt_t x_t . (G_t B_t) + dL/d log a_{t+1}`,
    /// a running sum in the reverse sweep that starts from `<gfin, h_last>`. Its terms cancel
    /// (over a long sequence their sum is far smaller than they are), so rounding would grow
    /// with `L`: every [`MARK`] steps the sum restarts from the exact `<a_t G_t, h_{t-1}>`, with
    /// `h_{t-1}` kept from the forward sweep.
    fn scan_block_backward<T>(
        dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, saved: &Saved<T>, gy: &[T], gfin: &[T], a: &[T], b: usize,
        first: usize, heads: usize, gxc: &Pieces<T>
    ) -> BlockGrads<T> {
        let (l, h, p, g, n) = (dims.len, dims.nheads, dims.headdim, dims.ngroups, dims.d_state);
        let (di, cd) = (dims.d_inner(), dims.conv_dim());
        let gn = g * n;
        let d_width = if dims.d_per_channel { p } else { 1 };
        let mut out = BlockGrads {
            first,
            heads,
            gdt: vec![T::zero(); l * heads],
            gbc: Lines::zeros(l * 2 * gn),
            gh0: Lines::zeros(heads * p * n),
            ga: vec![T::zero(); heads],
            gd: vec![T::zero(); heads * d_width],
        };
        let mut state = Lines::zeros(p * n);
        let mut q = vec![T::zero(); l];
        let mut marks = Vec::with_capacity(l.div_ceil(MARK) * p * n);
        let mut sb = vec![T::zero(); p];
        let mut gx_t = vec![T::zero(); p];
        for j in 0..heads {
            let hh = first + j;
            let bh = b * h + hh;
            let gi = hh / (h / g);
            let rows = HeadRows::new(dims, &saved.xa, &saved.dt, b, hh);
            let cols = dims.x_of(hh);
            let gy_at = |t: usize| &gy[(b * l + t) * di + cols.start..(b * l + t) * di + cols.end];
            let step = |t: usize| {
                let (x, bv, cv, dtv, decay) = rows.at(t);
                (x, bv, cv, dtv, decay, gy_at(t))
            };
            // The rows of step `t`, with its gradients of y, B and C, into the cache, for the
            // sweeps to ask for some steps ahead.
            let fetch = |t: usize, gbc: &[T]| {
                rows.fetch(t);
                prefetch(gy_at(t));
                prefetch(&gbc[t * 2 * gn..(t + 1) * 2 * gn]);
            };
            match inp.h0 {
                Some(h0) => state.copy_from_slice(&h0[bh * p * n..(bh + 1) * p * n]),
                None => state.fill(T::zero()),
            }
            marks.clear();
            for (t, qt) in q.iter_mut().enumerate() {
                if t % MARK == 0 {
                    marks.extend_from_slice(&state);
                }
                if t + AHEAD < l {
                    fetch(t + AHEAD, &out.gbc);
                }
                let (x, bv, cv, dtv, decay, gyv) = step(t);
                let gc = &mut out.gbc[t * 2 * gn + gn + gi * n..t * 2 * gn + gn + (gi + 1) * n];
                *qt = head_state_gc(&mut state, x, bv, cv, decay, dtv, gyv, gc);
            }
            let gfin_bh = &gfin[bh * p * n..(bh + 1) * p * n];
            // The decay's gradient from beyond the last step: through the final state.
            let mut g_log = dot(gfin_bh, &state);
            let gh = &mut out.gh0[j * p * n..(j + 1) * p * n];
            gh.copy_from_slice(gfin_bh);
            for t in (0..l).rev() {
                if (t + 1) % MARK == 0 && t + 1 < l {
                    // `gh` reaches h_t, which is the state before step t + 1: the running sum
                    // restarts from the exact value.
                    let m = (t + 1) / MARK;
                    g_log = dot(gh, &marks[m * p * n..(m + 1) * p * n]);
                }
                if t >= AHEAD {
                    fetch(t - AHEAD, &out.gbc);
                }
                let (x, bv, cv, dtv, decay, gyv) = step(t);
                let gb = &mut out.gbc[t * 2 * gn + gi * n..t * 2 * gn + (gi + 1) * n];
                head_reverse(gh, gyv, x, bv, cv, decay, dtv, gb, &mut sb);
                // y = h C + D x: x reaches y directly through D and the state through dt x B.
                if dims.d_per_channel {
                    let (dv, gd) = (&prm.d[hh * p..(hh + 1) * p], &mut out.gd[j * p..(j + 1) * p]);
                    for ((((o, gdv), &dq), &gyq), (&xq, &sq)) in gx_t.iter_mut().zip(gd).zip(dv).zip(gyv).zip(x.iter().zip(&sb)) {
                        *o = dq * gyq + dtv * sq;
                        *gdv = *gdv + gyq * xq;
                    }
                } else {
                    let dv = prm.d[hh];
                    for ((o, &gyq), &sq) in gx_t.iter_mut().zip(gyv).zip(&sb) {
                        *o = dv * gyq + dtv * sq;
                    }
                    out.gd[j] = out.gd[j] + dot(gyv, x);
                }
                // SAFETY: only this task writes the x columns of heads first..first + heads of
                // entry b's rows.
                unsafe { gxc.put((b * l + t) * cd + hh * p, &gx_t) };
                let xsb = dot(x, &sb);
                g_log = g_log + q[t] - dtv * xsb;
                // log decay = dt A: d/d dt = A, d/dA = dt.
                out.gdt[t * heads + j] = xsb + g_log * a[hh];
                out.ga[j] = out.ga[j] + g_log * dtv;
            }
        }
        out
    }
}
