//! The mixer's core as one hand-written CPU kernel, forward and backward.
//!
//! "Core" is everything between `in_proj` and `out_proj`: the causal depthwise convolution with
//! its SiLU, `dt = clamp(softplus(dt_raw + dt_bias))`, the selective scan with the `D` skip, and
//! the gated group-wise RMS norm. The generic path builds this from ~40 tensor operations, each a
//! pass over memory and an autodiff node; here it is a handful of passes over plain slices, and
//! the scan is the sequential recurrence, whose state (`headdim x d_state` per head) stays in
//! cache. The backward runs the recurrence again rather than storing states: it keeps no state
//! but the running one, so memory does not grow with `L` times the state.
//!
//! The functions work on row-major slices in `f32` or `f64` and know nothing about Burn;
//! `fast.rs` moves tensors in and out and registers the backward with Burn's autodiff.
//! `tests/fast_path.rs` checks both directions against the generic path.

use num_traits::Float;
use rayon::prelude::*;

/// Rows per parallel task in the row-wise passes (convolution, norm).
const ROWS_PER_TASK: usize = 64;

/// The float types the CPU paths run in: `f32` and `f64`.
pub trait HostFloat:
    Float + Send + Sync + std::iter::Sum + std::fmt::Debug + burn::tensor::Element + bytemuck::Pod + crate::simd::Lanes + 'static
{
}
impl HostFloat for f32 {}
impl HostFloat for f64 {}

// The loops below are where a step spends its time. Each has a plain body and, on x86-64, copies
// compiled for AVX2 and AVX-512, chosen once per call by run-time detection: the default target
// only guarantees SSE2, which would leave three quarters of each vector unit idle.

macro_rules! multiversion {
    ($(#[$doc:meta])* fn $name:ident<$t:ident>($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                fn avx2<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has just been found to support the enabled features.
                    return unsafe { avx512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Vector lanes for the reductions over `d_state`: partial sums kept per lane, so that the loops
/// vectorise without reassociating a single running sum (which the compiler may not do).
const LANES: usize = 16;

/// The sum of the lanes, as a tree: four vector additions rather than fifteen dependent scalar
/// ones.
#[inline(always)]
fn reduce<T: HostFloat>(mut acc: [T; LANES]) -> T {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] = acc[l] + acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `h = decay h + xdt b` in place, returning `h . c`, in [`LANES`] partial sums.
#[inline(always)]
fn update_dot<T: HostFloat>(h: &mut [T], b: &[T], c: &[T], decay: T, xdt: T) -> T {
    let (hv, hr) = h.as_chunks_mut::<LANES>();
    let (bv, br) = b.as_chunks::<LANES>();
    let (cv, cr) = c.as_chunks::<LANES>();
    let mut acc = [T::zero(); LANES];
    for ((hc, bc), cc) in hv.iter_mut().zip(bv).zip(cv) {
        for l in 0..LANES {
            let v = decay * hc[l] + xdt * bc[l];
            hc[l] = v;
            acc[l] = acc[l] + v * cc[l];
        }
    }
    let mut total = reduce(acc);
    for ((hs, &bs), &cs) in hr.iter_mut().zip(br).zip(cr) {
        *hs = decay * *hs + xdt * bs;
        total = total + *hs * cs;
    }
    total
}

/// `a . b` in [`LANES`] partial sums.
#[inline(always)]
pub(crate) fn dot<T: HostFloat>(a: &[T], b: &[T]) -> T {
    let (av, ar) = a.as_chunks::<LANES>();
    let (bv, br) = b.as_chunks::<LANES>();
    let mut acc = [T::zero(); LANES];
    for (ac, bc) in av.iter().zip(bv) {
        for l in 0..LANES {
            acc[l] = acc[l] + ac[l] * bc[l];
        }
    }
    let mut total = reduce(acc);
    for (&x, &y) in ar.iter().zip(br) {
        total = total + x * y;
    }
    total
}

/// `sum a b c` in [`LANES`] partial sums.
#[inline(always)]
fn dot3<T: HostFloat>(a: &[T], b: &[T], c: &[T]) -> T {
    let (av, ar) = a.as_chunks::<LANES>();
    let (bv, br) = b.as_chunks::<LANES>();
    let (cv, cr) = c.as_chunks::<LANES>();
    let mut acc = [T::zero(); LANES];
    for ((ac, bc), cc) in av.iter().zip(bv).zip(cv) {
        for l in 0..LANES {
            acc[l] = acc[l] + ac[l] * bc[l] * cc[l];
        }
    }
    let mut total = reduce(acc);
    for ((&x, &y), &z) in ar.iter().zip(br).zip(cr) {
        total = total + x * y * z;
    }
    total
}

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
    if crate::simd::usable::<T>(b.len()) {
        // SAFETY: `usable` checked the CPU and the row length.
        return unsafe { crate::simd::head_forward(state, x, b, c, decay, dt, y) };
    }
    head_forward_plain(state, x, b, c, decay, dt, y)
}

/// One step of the backward's forward sweep; see [`head_state_gc_plain`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_state_gc<T: HostFloat>(state: &mut [T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, gy: &[T], gc: &mut [T]) -> T {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::usable::<T>(b.len()) {
        // SAFETY: as above.
        return unsafe { crate::simd::head_state_gc(state, x, b, c, decay, dt, gy, gc) };
    }
    head_state_gc_plain(state, x, b, c, decay, dt, gy, gc)
}

/// One reverse step of one head; see [`head_reverse_plain`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_reverse<T: HostFloat>(gh: &mut [T], gy: &[T], x: &[T], b: &[T], c: &[T], decay: T, dt: T, gb: &mut [T], sb: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::usable::<T>(b.len()) {
        // SAFETY: as above.
        return unsafe { crate::simd::head_reverse(gh, gy, x, b, c, decay, dt, gb, sb) };
    }
    head_reverse_plain(gh, gy, x, b, c, decay, dt, gb, sb)
}

/// Sizes and settings of one call; the names are the config's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub batch: usize,
    pub len: usize,
    pub d_model: usize,
    pub nheads: usize,
    pub headdim: usize,
    pub ngroups: usize,
    pub d_state: usize,
    pub d_conv: usize,
    /// `D` per channel (`[d_inner]`) rather than per head.
    pub d_per_channel: bool,
    pub dt_lo: f64,
    pub dt_hi: f64,
    /// Gate before the norm (`norm_before_gate = false`, the default) or after it.
    pub gate_first: bool,
    pub eps: f64,
}

impl Dims {
    pub fn d_inner(&self) -> usize {
        self.nheads * self.headdim
    }
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.ngroups * self.d_state
    }
    /// Width of an `in_proj` output row: `z | xBC | dt`.
    pub fn width(&self) -> usize {
        self.d_inner() + self.conv_dim() + self.nheads
    }
    pub fn state_len(&self) -> usize {
        self.nheads * self.headdim * self.d_state
    }
    pub fn rows(&self) -> usize {
        self.batch * self.len
    }
}

/// Steps ahead of the scan's current one whose inputs [`prefetch`] asks for.
const AHEAD: usize = 4;

/// Asks the CPU to bring the cache lines of `s` into its nearest cache; a hint, which changes
/// no result. The scans need it: each step reads its `x`, `B`, `C` and `dt` from a new row of
/// buffers far larger than the caches, and one step's work fills the processor's reordering
/// window, so without it every step waited for its first loads (half of the forward scan's
/// time in a profile).
#[inline(always)]
fn prefetch<T>(s: &[T]) {
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
const MARK: usize = 16;

/// The learned parameters the core reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params<'a, T> {
    /// `[conv_dim, d_conv]`.
    pub conv_w: &'a [T],
    pub conv_b: Option<&'a [T]>,
    pub dt_bias: &'a [T],
    pub a_log: &'a [T],
    /// `[nheads]` or `[d_inner]`.
    pub d: &'a [T],
    /// `[d_inner]`.
    pub norm_w: &'a [T],
}

/// The inputs that vary per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs<'a, T> {
    /// `[batch, L, width]`, the `in_proj` output.
    pub zx: &'a [T],
    /// `[batch, d_conv - 1, conv_dim]`, the convolution's left context; zeros when `None`.
    pub tail: Option<&'a [T]>,
    /// `[batch, nheads, headdim, d_state]`; zeros when `None`.
    pub h0: Option<&'a [T]>,
}

/// What the forward keeps for the backward.
#[derive(Debug)]
pub(crate) struct Saved<T> {
    /// The sigmoid of the convolution's output, `[rows, conv_dim]`: with `xa` it gives the
    /// SiLU's derivative, `s (1 + x (1 - s)) = s + xa (1 - s)`, without a sigmoid in the backward.
    sx: Vec<T>,
    /// After the SiLU: `x | B | C`, `[rows, conv_dim]`.
    xa: Vec<T>,
    /// Per row `[dt | decay = exp(dt A) | d dt / d dt_raw]`, `[rows, 3 nheads]`: the decay and
    /// the derivative (0 where the clamp bites) computed once, not again in the backward.
    dt: Vec<T>,
    /// The scan output with the skip, before the norm, `[rows, d_inner]`.
    y: Vec<T>,
    /// `1 / rms` per row and norm group, `[rows, ngroups]`.
    rstd: Vec<T>,
}

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

fn c<T: HostFloat>(v: f64) -> T {
    T::from(v).expect("finite constant")
}

pub(crate) fn sigmoid<T: HostFloat>(v: T) -> T {
    T::one() / (T::one() + (-v).exp())
}

/// `out[i] = sigmoid(x[i])`, with vector instructions where the CPU has them.
pub(crate) fn sigmoid_into<T: HostFloat>(x: &[T], out: &mut [T]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has just been found to support AVX-512F.
        done = unsafe { crate::simd::sigmoid_slice(x, out) };
    }
    for (o, &v) in out[done..].iter_mut().zip(&x[done..]) {
        *o = sigmoid(v);
    }
}

/// `softplus` with the generic path's threshold: the identity above 20.
fn softplus<T: HostFloat>(v: T) -> T {
    if v > c(20.0) {
        v
    } else {
        v.exp().ln_1p()
    }
}

/// The left-context row `s` (negative: from the tail) of the `xBC` channels for batch `b`;
/// `None` for a row before the sequence when no tail is given (zeros, which add nothing).
#[inline(always)]
fn ext_row<'a, T: HostFloat>(dims: &Dims, inp: &Inputs<'a, T>, b: usize, s: isize) -> Option<&'a [T]> {
    let (cd, w, di, k) = (dims.conv_dim(), dims.width(), dims.d_inner(), dims.d_conv);
    if s >= 0 {
        let r = b * dims.len + s as usize;
        Some(&inp.zx[r * w + di..r * w + di + cd])
    } else {
        let r = b * (k - 1) + (k as isize - 1 + s) as usize;
        inp.tail.map(|tail| &tail[r * cd..(r + 1) * cd])
    }
}

/// `wt[k][c] = w[c][k]`, so that the convolution's inner loop runs over contiguous channels.
fn transpose_conv<T: HostFloat>(dims: &Dims, w: &[T]) -> Vec<T> {
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
        let (l, h, k, w, di, cd) = (dims.len, dims.nheads, dims.d_conv, dims.width(), dims.d_inner(), dims.conv_dim());
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
            let raw = &inp.zx[r * w + di + cd..r * w + di + cd + h];
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

/// Where one head's inputs of each step lie in the kernel's row buffers: `x`, `B` and `C` in
/// `xa`'s row, `dt` and the decay in `dt`'s (see [`Saved`]). Both scans read through it.
struct HeadRows<'a, T> {
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
        let (h, p, g, n, di) = (dims.nheads, dims.headdim, dims.ngroups, dims.d_state, dims.d_inner());
        let gi = hh / (h / g);
        let (x, b_col, c_col) = (hh * p, di + gi * n, di + g * n + gi * n);
        Self { xa, dt, row0: b * dims.len, cd: dims.conv_dim(), x, b: b_col, c: c_col, hh, h, p, n }
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

multiversion! {
    /// The gated norm of the scan's output `y` (all rows) for the rows from `first` on, into
    /// `out`, with `1 / rms` into `rstd`.
    fn norm_rows<T>(dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, y: &[T], first: usize, out: &mut [T], rstd: &mut [T]) {
        let (g, w, di) = (dims.ngroups, dims.width(), dims.d_inner());
        for (i, (orow, rs)) in out.chunks_mut(di).zip(rstd.chunks_mut(g)).enumerate() {
            let r = first + i;
            gated_norm_row(dims, &y[r * di..(r + 1) * di], &inp.zx[r * w..r * w + di], prm.norm_w, orow, rs);
        }
    }
}

/// The forward pass: the gated norm's output `[batch, L, d_inner]`, the final scan state
/// `[batch, nheads, headdim, d_state]`, and what the backward needs.
///
/// With `keep = false` (no backward will follow) the SiLU's sigmoid is not kept: the returned
/// [`Saved`] is then only good for dropping.
pub(crate) fn forward<T: HostFloat>(dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, keep: bool) -> (Vec<T>, Vec<T>, Saved<T>) {
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

    // The gated norm, written straight into `out`.
    let ([out, rstd], _) = build_rows(rows, ROWS_PER_TASK, [di, g], |first, [out, rstd]| norm_rows(dims, inp, prm, &y, first, out, rstd));
    (out, fin, Saved { sx, xa, dt, y, rstd })
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

/// `dt = clamp(softplus(raw + bias), dt_lo, dt_hi)`, as in the generic path.
pub(crate) fn step_size<T: HostFloat>(dims: &Dims, raw: T, bias: T) -> T {
    clamp_dt(dims, softplus(raw + bias))
}

fn clamp_dt<T: HostFloat>(dims: &Dims, v: T) -> T {
    let v = if dims.dt_lo > 0.0 { v.max(c(dims.dt_lo)) } else { v };
    if dims.dt_hi.is_finite() {
        v.min(c(dims.dt_hi))
    } else {
        v
    }
}

/// What one task of the reverse scan hands on: the gradients of a block of consecutive heads of
/// one batch entry.
#[derive(Debug)]
pub(crate) struct BlockGrads<T> {
    /// The block's first head and its number of heads.
    first: usize,
    heads: usize,
    /// `[L, heads]`.
    gdt: Vec<T>,
    /// `[L, 2 ngroups d_state]`: the B and C columns, summed over the block's heads.
    gbc: Lines<T>,
    /// `[heads, headdim, d_state]`.
    gh0: Lines<T>,
    /// Per head.
    ga: Vec<T>,
    /// `[heads, headdim]` or `[heads, 1]`.
    gd: Vec<T>,
}

multiversion! {
    /// The norm's backward for the rows from `first` on: the gradient of `y` into `gy` and of `z`
    /// into the `z` columns of `gzx`; returns these rows' part of the norm weight's gradient.
    fn norm_backward_rows<T>(
        dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, saved: &Saved<T>, gout: &[T], first: usize,
        gy: &mut [T], gzx: &mut [T]
    ) -> Vec<T> {
        let (g, di, w) = (dims.ngroups, dims.d_inner(), dims.width());
        let gw = di / g;
        let mut gnw = vec![T::zero(); di];
        let mut sig = vec![T::zero(); di];
        for (i, (gyr, gzr)) in gy.chunks_mut(di).zip(gzx.chunks_mut(w)).enumerate() {
            let r = first + i;
            let z = &inp.zx[r * w..r * w + di];
            sigmoid_into(z, &mut sig);
            for gi in 0..g {
                let span = gi * gw..(gi + 1) * gw;
                let inv = saved.rstd[r * g + gi];
                let go = &gout[r * di..(r + 1) * di][span.clone()];
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
            let gy_at = |t: usize| &gy[(b * l + t) * di + hh * p..(b * l + t) * di + (hh + 1) * p];
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

multiversion! {
    /// For the rows from `first` on: the blocks' B and C gradients added into `gxa` (whose x
    /// columns the scan's tasks wrote), all back through the SiLU (so that `gxa` ends as the
    /// gradient of the convolution's output), and dt's gradient through softplus and clamp into
    /// the dt columns of `gzx`. Returns these rows' part of dt_bias's gradient.
    fn scatter_rows<T>(
        dims: &Dims, saved: &Saved<T>, blocks: &[BlockGrads<T>], nblk: usize, first: usize,
        gxa: &mut [T], gzx: &mut [T]
    ) -> Vec<T> {
        let (l, h, w, di, cd) = (dims.len, dims.nheads, dims.width(), dims.d_inner(), dims.conv_dim());
        let gn = dims.ngroups * dims.d_state;
        let mut dtb = vec![T::zero(); h];
        for (i, (row, gzr)) in gxa.chunks_mut(cd).zip(gzx.chunks_mut(w)).enumerate() {
            let r = first + i;
            let (b, t) = (r / l, r % l);
            for bg in &blocks[b * nblk..(b + 1) * nblk] {
                let (first, heads) = (bg.first, bg.heads);
                for (o, &v) in row[di..di + 2 * gn].iter_mut().zip(&bg.gbc[t * 2 * gn..(t + 1) * 2 * gn]) {
                    *o = *o + v;
                }
                for j in 0..heads {
                    let hh = first + j;
                    let graw = bg.gdt[t * heads + j] * saved.dt[r * 3 * h + 2 * h + hh];
                    gzr[di + cd + hh] = graw;
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

multiversion! {
    /// The convolution's backward for the rows from `first` on, given the gradient `gxc` of its
    /// output (all rows): the gradient of each input row into the `xBC` columns of `gzx` (each
    /// task writes only its own rows), and these rows' parts of the gradients of the transposed
    /// weight (`[d_conv, conv_dim]`) and of the bias.
    fn conv_backward_rows<T>(dims: &Dims, inp: &Inputs<T>, wt: &[T], gxc: &[T], first: usize, gzx: &mut [T]) -> (Vec<T>, Vec<T>) {
        let (l, k, w, di, cd) = (dims.len, dims.d_conv, dims.width(), dims.d_inner(), dims.conv_dim());
        let mut gw_t = vec![T::zero(); k * cd];
        let mut gb = vec![T::zero(); cd];
        for (i, gzr) in gzx.chunks_mut(w).enumerate() {
            let r = first + i;
            let (b, t) = (r / l, r % l);
            let gxr = &gxc[r * cd..(r + 1) * cd];
            for (o, &v) in gb.iter_mut().zip(gxr) {
                *o = *o + v;
            }
            let gin = &mut gzr[di..di + cd];
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

/// The backward pass: gradients of every input, given those of the norm's output (`gout`,
/// `[batch, L, d_inner]`) and of the final state (`gfin`, `[batch, nheads, headdim, d_state]`).
pub(crate) fn backward<T: HostFloat>(dims: &Dims, inp: &Inputs<T>, prm: &Params<T>, saved: &Saved<T>, gout: &[T], gfin: &[T]) -> Grads<T> {
    let (l, h, p, n) = (dims.len, dims.nheads, dims.headdim, dims.d_state);
    let (di, cd, w, k, rows) = (dims.d_inner(), dims.conv_dim(), dims.width(), dims.d_conv, dims.rows());
    let a: Vec<T> = prm.a_log.iter().map(|v| -v.exp()).collect();
    // Norm: gradient of y (into gy) and of z (into gzx, whose other columns the later passes
    // fill), and partial sums for the norm weight.
    let ([gy, mut gzx], norm_partials) =
        build_rows(rows, ROWS_PER_TASK, [di, w], |first, [gy, gzx]| norm_backward_rows(dims, inp, prm, saved, gout, first, gy, gzx));
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

/// A zeroed buffer whose first value starts a cache line. The scans load and store the state
/// as 64-byte vectors at every step: in a buffer that starts mid-line each of those touches two
/// lines and a store can no longer hand its value straight to the next step's load, which made
/// the forward scan about 1.4x slower (the allocator only promises 16 bytes).
#[derive(Debug)]
pub(crate) struct Lines<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: HostFloat> Lines<T> {
    /// `len` zeros.
    pub(crate) fn zeros(len: usize) -> Self {
        let extra = 64 / std::mem::size_of::<T>();
        let buf = vec![T::zero(); len + extra];
        // `align_offset` may decline (usize::MAX); the buffer is then merely unaligned.
        let start = buf.as_ptr().align_offset(64).min(extra);
        Self { buf, start, len }
    }
}

impl<T> std::ops::Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> std::ops::DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// A vector of `len` values built by the rayon pool, `chunk` values per task: [`build_rows`]
/// with one buffer of one value per row, so each task zeroes its chunk (in cache, just before
/// use) and hands it to `fill` with the chunk's offset. A single thread's `memset` of the large
/// buffers of a step would leave the other cores idle for as long as it takes.
pub(crate) fn build<T: HostFloat>(len: usize, chunk: usize, fill: impl Fn(usize, &mut [T]) + Sync + Send) -> Vec<T> {
    let ([v], _) = build_rows(len, chunk, [1], |at, [c]| fill(at, c));
    v
}

/// A buffer that parallel tasks fill in disjoint pieces (a scan task its head's columns of
/// every row, a row task its block of rows in [`build_rows`]), so that no task writes a buffer
/// of its own to be gathered after.
pub(crate) struct Pieces<'a, T> {
    at: *mut T,
    len: usize,
    _buf: std::marker::PhantomData<&'a mut [T]>,
}
// SAFETY: `put`'s callers write disjoint ranges; the buffer outlives the borrow.
unsafe impl<T: Send> Sync for Pieces<'_, T> {}

impl<'a, T: Copy> Pieces<'a, T> {
    /// Over values already initialised.
    pub(crate) fn new(buf: &'a mut [T]) -> Self {
        Self { at: buf.as_mut_ptr(), len: buf.len(), _buf: std::marker::PhantomData }
    }

    /// Over a vector's spare capacity, which the pieces are to initialise.
    pub(crate) fn uninit(buf: &'a mut [std::mem::MaybeUninit<T>]) -> Self {
        Self { at: buf.as_mut_ptr().cast(), len: buf.len(), _buf: std::marker::PhantomData }
    }

    /// Writes `v` at `at..at + v.len()`.
    ///
    /// # Safety
    /// No other task reads or writes that range while the pieces live.
    pub(crate) unsafe fn put(&self, at: usize, v: &[T]) {
        assert!(at + v.len() <= self.len, "piece {at}+{} outside a buffer of {}", v.len(), self.len);
        // SAFETY: inside the buffer (checked), and the caller owns the range.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.at.add(at), v.len()) }
    }
}

impl<T: HostFloat> Pieces<'_, T> {
    /// Zeroes `len` values from `at` and hands them to the calling task to fill.
    ///
    /// # Safety
    /// As [`Pieces::put`]: no other task reads or writes that range while the block lives.
    // The block is part of the buffer the pieces borrow mutably, handed to one task each.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn zeroed(&self, at: usize, len: usize) -> &mut [T] {
        assert!(at + len <= self.len, "block {at}+{len} outside a buffer of {}", self.len);
        // SAFETY: inside the buffer (checked), and the caller owns the range; `T` is `f32` or
        // `f64`, for which zero bytes are a valid value.
        unsafe {
            let p = self.at.add(at);
            std::ptr::write_bytes(p, 0, len);
            std::slice::from_raw_parts_mut(p, len)
        }
    }
}

/// `N` buffers of `rows` rows each (`widths[k]` values per row of buffer `k`) built by the rayon
/// pool in blocks of `per_task` rows: each task zeroes its block of every buffer and hands the
/// blocks, with the block's first row, to `fill`, which writes them while the zeroed lines are
/// still in cache. (Zeroed by [`zeros`] in a pass of its own, the buffers went to memory and
/// came back: each byte written twice to memory, 5 % of a medium train step.) Returns the
/// buffers and what `fill` returned per block, in row order.
pub(crate) fn build_rows<T: HostFloat, R: Send, const N: usize>(
    rows: usize,
    per_task: usize,
    widths: [usize; N],
    fill: impl Fn(usize, [&mut [T]; N]) -> R + Sync + Send,
) -> ([Vec<T>; N], Vec<R>) {
    let per_task = per_task.max(1);
    let mut bufs: [Vec<T>; N] = std::array::from_fn(|k| Vec::with_capacity(rows * widths[k]));
    let parts = {
        let pieces = bufs.each_mut().map(|b| Pieces::uninit(b.spare_capacity_mut()));
        (0..rows.div_ceil(per_task))
            .into_par_iter()
            .map(|task| {
                let (first, count) = (task * per_task, per_task.min(rows - task * per_task));
                // SAFETY: rows `first..first + count` of each buffer are this task's alone.
                let blocks: [&mut [T]; N] = std::array::from_fn(|k| unsafe { pieces[k].zeroed(first * widths[k], count * widths[k]) });
                fill(first, blocks)
            })
            .collect()
    };
    for (buf, &width) in bufs.iter_mut().zip(&widths) {
        // SAFETY: the blocks cover every row, and each task initialised its own (a panic in a
        // task propagates before this line).
        unsafe { buf.set_len(rows * width) };
    }
    (bufs, parts)
}

/// Values per task in [`build`]'s plain uses: large enough to amortise a task, small enough to
/// stay in the second-level cache.
pub(crate) const BUILD_CHUNK: usize = 1 << 14;

/// A vector of `len` zeros, written by the rayon pool (see [`build`]).
pub(crate) fn zeros<T: HostFloat>(len: usize) -> Vec<T> {
    build(len, BUILD_CHUNK, |_, _| {})
}

/// A copy of `src`, written by the rayon pool (see [`build`]).
pub(crate) fn filled<T: HostFloat>(src: &[T]) -> Vec<T> {
    build(src.len(), BUILD_CHUNK, |at, c| c.copy_from_slice(&src[at..at + c.len()]))
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

fn sum_partials<T: HostFloat>(parts: Vec<Vec<T>>, len: usize) -> Vec<T> {
    let mut total = vec![T::zero(); len];
    for part in parts {
        for (o, v) in total.iter_mut().zip(part) {
            *o = *o + v;
        }
    }
    total
}
