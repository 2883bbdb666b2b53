//! AVX-512 versions of the scan's inner loops, written with explicit vector operations.
//!
//! The plain loops in `scan.rs` and `float.rs` are what every CPU runs and what these are tested against. Left
//! to itself the compiler turned them into 2-wide operations without fused multiply-adds, a
//! fraction of what the vector unit does per cycle; these loops use full 512-bit registers and
//! FMAs, and are taken when the CPU has AVX-512 and `d_state` is a multiple of the vector width
//! (16 for `f32`, 8 for `f64`). The reductions over `d_state` change order, so results agree with
//! the plain loops to rounding, not bit for bit.

/// The vector operations the loops need, for `f32` and `f64`. Sealed: it lives in a private
/// module and is implemented for those two types only.
#[cfg(target_arch = "x86_64")]
pub trait Lanes: Copy + Sized {
    #[doc(hidden)]
    type V: Copy;
    /// Values per vector.
    #[doc(hidden)]
    const W: usize;
    #[doc(hidden)]
    unsafe fn vzero() -> Self::V;
    #[doc(hidden)]
    unsafe fn vsplat(v: Self) -> Self::V;
    #[doc(hidden)]
    unsafe fn vload(p: *const Self) -> Self::V;
    /// `W` bf16 values widened to `Self` (exactly: a bf16 is the high half of an f32).
    #[doc(hidden)]
    unsafe fn vload_bf16(p: *const half::bf16) -> Self::V;
    #[doc(hidden)]
    unsafe fn vstore(p: *mut Self, v: Self::V);
    #[doc(hidden)]
    unsafe fn vmul(a: Self::V, b: Self::V) -> Self::V;
    #[doc(hidden)]
    unsafe fn vadd(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, rounded once.
    #[doc(hidden)]
    unsafe fn vfma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    #[doc(hidden)]
    unsafe fn vsum(v: Self::V) -> Self;
    /// `out[i] = vsum(v[i])` for `W` vectors: one transposing tree of shuffles where it pays.
    #[doc(hidden)]
    unsafe fn vsums(v: &[Self::V], out: *mut Self);
    /// `1 / (1 + exp(-v))` per lane, to within a few units in the last place.
    #[doc(hidden)]
    unsafe fn vsigmoid(v: Self::V) -> Self::V;
}

/// Elsewhere the plain loops run; the trait only keeps `HostFloat`'s bounds the same.
#[cfg(not(target_arch = "x86_64"))]
pub trait Lanes {}
#[cfg(not(target_arch = "x86_64"))]
impl Lanes for f32 {}
#[cfg(not(target_arch = "x86_64"))]
impl Lanes for f64 {}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::*;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    macro_rules! lanes {
        ($t:ty, $v:ty, $w:expr, $zero:ident, $set1:ident, $load:ident, $load16:ident, $store:ident, $mul:ident, $add:ident, $fma:ident, $sum:ident, $sums:ident, $sigmoid:ident) => {
            impl Lanes for $t {
                type V = $v;
                const W: usize = $w;
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vzero() -> $v {
                    $zero()
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vsplat(v: $t) -> $v {
                    $set1(v)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vload(p: *const $t) -> $v {
                    $load(p)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vload_bf16(p: *const half::bf16) -> $v {
                    $load16(p)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vstore(p: *mut $t, v: $v) {
                    $store(p, v)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vmul(a: $v, b: $v) -> $v {
                    $mul(a, b)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vadd(a: $v, b: $v) -> $v {
                    $add(a, b)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vfma(a: $v, b: $v, c: $v) -> $v {
                    $fma(a, b, c)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vsum(v: $v) -> $t {
                    $sum(v)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vsums(v: &[$v], out: *mut $t) {
                    $sums(v, out)
                }
                #[inline]
                #[target_feature(enable = "avx512f")]
                unsafe fn vsigmoid(v: $v) -> $v {
                    $sigmoid(v)
                }
            }
        };
    }
    /// A bf16 is the high half of an f32: widen to 32 bits and shift up.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_bf16_ps(p: *const half::bf16) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()))))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_bf16_pd(p: *const half::bf16) -> __m512d {
        _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())))))
    }

    lanes!(
        f32,
        __m512,
        16,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        load_bf16_ps,
        _mm512_storeu_ps,
        _mm512_mul_ps,
        _mm512_add_ps,
        _mm512_fmadd_ps,
        _mm512_reduce_add_ps,
        sums_ps,
        sigmoid_ps
    );
    lanes!(
        f64,
        __m512d,
        8,
        _mm512_setzero_pd,
        _mm512_set1_pd,
        _mm512_loadu_pd,
        load_bf16_pd,
        _mm512_storeu_pd,
        _mm512_mul_pd,
        _mm512_add_pd,
        _mm512_fmadd_pd,
        _mm512_reduce_add_pd,
        sums_pd,
        sigmoid_pd
    );

    /// The sums of 16 vectors of f32 at once: each level adds the two halves of pairs of
    /// vectors (512-bit halves, then 128-bit quarters, then pairs, then single lanes), so that
    /// 15 additions and 30 shuffles replace 16 separate reductions (about 130 operations).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sums_ps(v: &[__m512], out: *mut f32) {
        assert!(v.len() == 16);
        // s[i]: lanes 0..8 hold partial sums of v[2i], lanes 8..16 of v[2i + 1].
        let s: [__m512; 8] = std::array::from_fn(|i| {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(a, b), _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b))
        });
        // r[j]: quarter k holds 4 partial sums of v[4j + k].
        let r: [__m512; 4] = std::array::from_fn(|j| {
            let (a, b) = (s[2 * j], s[2 * j + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b))
        });
        // w[m]: quarter k holds 2 partial sums of v[8m + k], then 2 of v[8m + 4 + k].
        let w: [__m512; 2] = std::array::from_fn(|m| {
            let (a, b) = (_mm512_castps_pd(r[2 * m]), _mm512_castps_pd(r[2 * m + 1]));
            _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)))
        });
        // f: quarter k holds the sums of v[k], v[4 + k], v[8 + k], v[12 + k], so position 4k + e
        // holds the sum of v[4e + k]; one permutation puts each at its own index.
        let f = _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(w[0], w[1]), _mm512_shuffle_ps::<0b11_01_11_01>(w[0], w[1]));
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, f));
    }

    /// f64 keeps the plain reductions.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sums_pd(v: &[__m512d], out: *mut f64) {
        assert!(v.len() == 8);
        for (i, &x) in v.iter().enumerate() {
            *out.add(i) = _mm512_reduce_add_pd(x);
        }
    }

    // exp(x) = 2^k exp(r) with k = round(x / ln 2) and |r| <= ln 2 / 2, exp(r) by its Taylor
    // series (degree 7 for f32, 13 for f64: the first omitted term is below half a unit in the
    // last place), and 2^k applied by `scalef`, which also gives 0 and infinity at the ends.
    // The input is clamped to where exp over- or underflows anyway, which keeps r small (for
    // f32, to where 1 + exp stays finite, for the reciprocal below).
    macro_rules! sigmoid {
        ($name:ident, $t:ty, $v:ty, $set1:ident, $max:ident, $min:ident, $mul:ident, $fma:ident, $fnmadd:ident,
         $round:ident, $scalef:ident, $add:ident, $recip:ident, $sub:ident, $lo:expr, $hi:expr, $ln2_hi:expr, $ln2_lo:expr, $degree:expr) => {
            #[inline]
            #[target_feature(enable = "avx512f")]
            unsafe fn $name(v: $v) -> $v {
                let one = $set1(1.0);
                let x = $sub($set1(0.0), v);
                let x = $min($max(x, $set1($lo)), $set1($hi));
                let k = $round::<0>($mul(x, $set1(std::f64::consts::LOG2_E as $t)));
                let r = $fnmadd(k, $set1($ln2_hi), x);
                let r = $fnmadd(k, $set1($ln2_lo), r);
                // Horner on the coefficients 1 / i!, from the highest: one fused add per degree.
                let mut coef = [1.0 as $t; $degree + 1];
                for i in 1..=$degree {
                    coef[i] = coef[i - 1] / i as $t;
                }
                let mut p = $set1(coef[$degree]);
                for i in (0..$degree).rev() {
                    p = $fma(p, r, $set1(coef[i]));
                }
                $recip($add(one, $scalef(p, k)))
            }
        };
    }
    /// `1 / d` for `1 <= d < 2^127`: the 14-bit estimate and one Newton step (relative error
    /// about 2^-28, below f32's rounding), instead of a division, which occupies its port for
    /// several times as long.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn recip_ps(d: __m512) -> __m512 {
        let y = _mm512_rcp14_ps(d);
        _mm512_mul_ps(y, _mm512_fnmadd_ps(d, y, _mm512_set1_ps(2.0)))
    }

    /// f64 keeps the division: two Newton steps would cost about as much.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn recip_pd(d: __m512d) -> __m512d {
        _mm512_div_pd(_mm512_set1_pd(1.0), d)
    }

    sigmoid!(
        sigmoid_ps,
        f32,
        __m512,
        _mm512_set1_ps,
        _mm512_max_ps,
        _mm512_min_ps,
        _mm512_mul_ps,
        _mm512_fmadd_ps,
        _mm512_fnmadd_ps,
        _mm512_roundscale_ps,
        _mm512_scalef_ps,
        _mm512_add_ps,
        recip_ps,
        _mm512_sub_ps,
        -104.0,
        87.0,
        0.693_145_75,
        1.428_606_8e-6,
        7
    );
    sigmoid!(
        sigmoid_pd,
        f64,
        __m512d,
        _mm512_set1_pd,
        _mm512_max_pd,
        _mm512_min_pd,
        _mm512_mul_pd,
        _mm512_fmadd_pd,
        _mm512_fnmadd_pd,
        _mm512_roundscale_pd,
        _mm512_scalef_pd,
        _mm512_add_pd,
        recip_pd,
        _mm512_sub_pd,
        -746.0,
        710.0,
        0.693_147_180_369_123_8,
        1.908_214_929_270_587_7e-10,
        13
    );

    /// `out[i] = sigmoid(x[i])`; the tail after the last whole vector is left to the caller.
    /// Returns how many values were done.
    ///
    /// # Safety
    /// The CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn sigmoid_slice<T: Lanes>(x: &[T], out: &mut [T]) -> usize {
        let n = x.len().min(out.len()) / T::W * T::W;
        for i in (0..n).step_by(T::W) {
            // SAFETY: i + W <= n <= both lengths.
            T::vstore(out.as_mut_ptr().add(i), T::vsigmoid(T::vload(x.as_ptr().add(i))));
        }
        n
    }

    /// Vectors per column panel of a packed matrix ([`pack_panels`]).
    const PANEL: usize = 4;

    /// Columns per panel for `T`.
    pub(crate) fn panel_width<T: Lanes>() -> usize {
        PANEL * T::W
    }

    /// `w` (`[d_in, d_out]`, row-major) as column panels of [`panel_width`] columns: panel `q`
    /// holds columns `q * pw..(q + 1) * pw` of every row, row after row, zero-padded at the
    /// right edge. A panel is contiguous, so a matrix-vector product reads memory in order.
    pub(crate) fn pack_panels<T: Lanes + num_traits::Zero>(w: &[T], d_in: usize, d_out: usize) -> Vec<T> {
        let pw = panel_width::<T>();
        let np = d_out.div_ceil(pw);
        let mut out = vec![T::zero(); np * d_in * pw];
        for q in 0..np {
            for i in 0..d_in {
                for c in 0..pw.min(d_out - q * pw) {
                    out[(q * d_in + i) * pw + c] = w[i * d_out + q * pw + c];
                }
            }
        }
        out
    }

    /// What a panel stores: `T` itself, or bf16 (half the bytes; widened to `T` on load, which is
    /// exact).
    pub(crate) trait PanelWeight<T: Lanes>: Copy {
        /// `T::W` stored values from `p` as one vector.
        ///
        /// # Safety
        /// The CPU supports AVX-512F and `p` points at `T::W` readable values.
        unsafe fn vload_w(p: *const Self) -> T::V;
    }

    impl<T: Lanes> PanelWeight<T> for T {
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn vload_w(p: *const T) -> T::V {
            T::vload(p)
        }
    }

    impl<T: Lanes> PanelWeight<T> for half::bf16 {
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn vload_w(p: *const half::bf16) -> T::V {
            T::vload_bf16(p)
        }
    }

    /// `out = x W` with `W` packed by [`pack_panels`]. Each panel's columns are summed in
    /// registers over all rows, two rows at a time into separate sums, so that the additions
    /// do not wait on each other.
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `panels` was packed for `x.len()` rows and `out.len()` columns
    /// with `T`'s panel width.
    // The register arrays `even` and `odd` are indexed in step with the panel's vectors, one
    // index for three places; iterators would hide that, not remove it.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn matvec_panels<T: Lanes + num_traits::Zero, E: PanelWeight<T>>(x: &[T], panels: &[E], out: &mut [T]) {
        let pw = panel_width::<T>();
        let (d_in, d_out) = (x.len(), out.len());
        let np = d_out.div_ceil(pw);
        assert_eq!(panels.len(), np * d_in * pw);
        for q in 0..np {
            let base = panels.as_ptr().add(q * d_in * pw);
            let mut even = [T::vzero(); PANEL];
            let mut odd = [T::vzero(); PANEL];
            let pairs = d_in / 2;
            for i in 0..pairs {
                // SAFETY: rows 2i and 2i + 1 are below d_in; the panel has d_in rows of pw.
                let (x0, x1) = (T::vsplat(x[2 * i]), T::vsplat(x[2 * i + 1]));
                let (r0, r1) = (base.add(2 * i * pw), base.add((2 * i + 1) * pw));
                for j in 0..PANEL {
                    even[j] = T::vfma(x0, E::vload_w(r0.add(j * T::W)), even[j]);
                    odd[j] = T::vfma(x1, E::vload_w(r1.add(j * T::W)), odd[j]);
                }
            }
            if !d_in.is_multiple_of(2) {
                let (xl, rl) = (T::vsplat(x[d_in - 1]), base.add((d_in - 1) * pw));
                for j in 0..PANEL {
                    even[j] = T::vfma(xl, E::vload_w(rl.add(j * T::W)), even[j]);
                }
            }
            let c0 = q * pw;
            let mut block = [T::zero(); 64];
            for j in 0..PANEL {
                T::vstore(block.as_mut_ptr().add(j * T::W), T::vadd(even[j], odd[j]));
            }
            let width = pw.min(d_out - c0);
            out[c0..c0 + width].copy_from_slice(&block[..width]);
        }
    }

    /// Whether the vector loops can run for rows of `n` values of `T` on this CPU.
    #[inline]
    pub(crate) fn usable<T: Lanes>(n: usize) -> bool {
        n > 0 && n.is_multiple_of(T::W) && std::is_x86_feature_detected!("avx512f")
    }

    /// As `scan::head_forward`. `d_state` is walked in blocks of up to [`BLOCK`] vectors whose
    /// `B` and `C` stay in registers across the rows, so that each element of the state costs one
    /// load rather than three.
    ///
    /// # Safety
    /// The CPU supports AVX-512F and `b.len()` is a multiple of `T::W` ([`usable`]).
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn head_forward<T: Lanes + num_traits::Float>(
        state: &mut [T],
        x: &[T],
        b: &[T],
        c: &[T],
        decay: T,
        dt: T,
        y: &mut [T],
    ) {
        let (n, p) = (b.len(), x.len());
        assert!(state.len() == p * n && c.len() == n && y.len() == p);
        for v0 in (0..n).step_by(BLOCK * T::W) {
            // SAFETY: the block's vectors lie inside `d_state` (n is a multiple of W, `usable`).
            let (h, bv, cv) = (state.as_mut_ptr().add(v0), b.as_ptr().add(v0), c.as_ptr().add(v0));
            match (n - v0) / T::W {
                1 => forward_block::<T, 1>(h, n, bv, cv, x, decay, dt, y, v0 == 0),
                2 => forward_block::<T, 2>(h, n, bv, cv, x, decay, dt, y, v0 == 0),
                3 => forward_block::<T, 3>(h, n, bv, cv, x, decay, dt, y, v0 == 0),
                _ => forward_block::<T, BLOCK>(h, n, bv, cv, x, decay, dt, y, v0 == 0),
            }
        }
    }

    /// [`head_forward`] over `NB` vectors of `d_state`: `h` points at the block's first element
    /// of row 0 (rows `n` apart), `b` and `c` at the block's. Sets `y` on the first block and
    /// adds to it on later ones.
    ///
    /// # Safety
    /// As [`head_forward`]; every row's block lies inside the state.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn forward_block<T: Lanes + num_traits::Float, const NB: usize>(
        h: *mut T,
        n: usize,
        b: *const T,
        c: *const T,
        x: &[T],
        decay: T,
        dt: T,
        y: &mut [T],
        first: bool,
    ) {
        let p = x.len();
        let dec = T::vsplat(decay);
        let bs: [T::V; NB] = std::array::from_fn(|j| T::vload(b.add(j * T::W)));
        let cs: [T::V; NB] = std::array::from_fn(|j| T::vload(c.add(j * T::W)));
        // Rows in groups of W where they divide evenly, for one transposing sum per group.
        let group = if p.is_multiple_of(T::W) { T::W } else { 1 };
        let mut accs = [T::vzero(); 16];
        for p0 in (0..p).step_by(group) {
            for (r, out) in accs[..group].iter_mut().enumerate() {
                let pi = p0 + r;
                let xdt = T::vsplat(x[pi] * dt);
                let mut acc = T::vzero();
                for j in 0..NB {
                    let hv = h.add(pi * n + j * T::W);
                    let v = T::vfma(dec, T::vload(hv), T::vmul(xdt, bs[j]));
                    T::vstore(hv, v);
                    acc = T::vfma(v, cs[j], acc);
                }
                *out = acc;
            }
            put_row_sums(&accs[..group], &mut y[p0..p0 + group], first);
        }
    }

    /// Each vector's sum (one per row of a group: one row, or W rows summed by one transposing
    /// tree, [`Lanes::vsums`]) into `out`: set on a row's first block of `d_state`, added to on
    /// the later ones.
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `accs` holds 1 or `T::W` vectors, as many as `out` has values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn put_row_sums<T: Lanes + num_traits::Float>(accs: &[T::V], out: &mut [T], first: bool) {
        assert!(accs.len() == out.len() && (accs.len() == 1 || accs.len() == T::W));
        if accs.len() == 1 {
            let v = T::vsum(accs[0]);
            out[0] = if first { v } else { out[0] + v };
        } else if first {
            T::vsums(accs, out.as_mut_ptr());
        } else {
            let mut sums = [<T as num_traits::Zero>::zero(); 16];
            T::vsums(accs, sums.as_mut_ptr());
            for (o, &v) in out.iter_mut().zip(&sums) {
                *o = *o + v;
            }
        }
    }

    /// As `scan::head_state_gc`, in blocks of `d_state` as [`head_forward`]: the block's `B`
    /// and its part of the gradient of `C` stay in registers across the rows.
    ///
    /// # Safety
    /// As [`head_forward`].
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn head_state_gc<T: Lanes + num_traits::Float>(
        state: &mut [T],
        x: &[T],
        b: &[T],
        c: &[T],
        decay: T,
        dt: T,
        gy: &[T],
        gc: &mut [T],
    ) -> T {
        let (n, p) = (b.len(), x.len());
        assert!(state.len() == p * n && gy.len() == p && c.len() == n && gc.len() == n);
        let mut q = <T as num_traits::Zero>::zero();
        for v0 in (0..n).step_by(BLOCK * T::W) {
            // SAFETY: as in `head_forward`.
            let (h, bv) = (state.as_mut_ptr().add(v0), b.as_ptr().add(v0));
            let (cv, gcv) = (c.as_ptr().add(v0), gc.as_mut_ptr().add(v0));
            q = q + match (n - v0) / T::W {
                1 => state_gc_block::<T, 1>(h, n, bv, cv, x, decay, dt, gy, gcv),
                2 => state_gc_block::<T, 2>(h, n, bv, cv, x, decay, dt, gy, gcv),
                3 => state_gc_block::<T, 3>(h, n, bv, cv, x, decay, dt, gy, gcv),
                _ => state_gc_block::<T, BLOCK>(h, n, bv, cv, x, decay, dt, gy, gcv),
            };
        }
        q
    }

    /// [`head_state_gc`] over `NB` vectors of `d_state`, pointers as in [`forward_block`];
    /// `c` and `gc` point at the block's first element. Returns the block's part of `gy . (h C)`.
    ///
    /// # Safety
    /// As [`forward_block`]; `c` and `gc` cover `NB W` elements.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn state_gc_block<T: Lanes + num_traits::Float, const NB: usize>(
        h: *mut T,
        n: usize,
        b: *const T,
        c: *const T,
        x: &[T],
        decay: T,
        dt: T,
        gy: &[T],
        gc: *mut T,
    ) -> T {
        let dec = T::vsplat(decay);
        let bs: [T::V; NB] = std::array::from_fn(|j| T::vload(b.add(j * T::W)));
        let mut acc = [T::vzero(); NB];
        for (pi, (&xv, &gv)) in x.iter().zip(gy).enumerate() {
            let (xdt, g) = (T::vsplat(xv * dt), T::vsplat(gv));
            for j in 0..NB {
                let o = h.add(pi * n + j * T::W);
                let v = T::vfma(dec, T::vload(o), T::vmul(xdt, bs[j]));
                T::vstore(o, v);
                acc[j] = T::vfma(g, v, acc[j]);
            }
        }
        let mut q = T::vzero();
        for (j, &v) in acc.iter().enumerate() {
            T::vstore(gc.add(j * T::W), T::vadd(T::vload(gc.add(j * T::W)), v));
            q = T::vfma(v, T::vload(c.add(j * T::W)), q);
        }
        T::vsum(q)
    }

    /// Vectors of `d_state` kept in registers at a time in the reverse step and the sweeps.
    const BLOCK: usize = 4;

    /// As `scan::head_reverse`. `d_state` is walked in blocks of up to [`BLOCK`] vectors, so
    /// that the block's `B`, `C` and running gradient of `B` stay in registers across the rows.
    ///
    /// # Safety
    /// As [`head_forward`].
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn head_reverse<T: Lanes + num_traits::Float>(
        gh: &mut [T],
        gy: &[T],
        x: &[T],
        b: &[T],
        c: &[T],
        decay: T,
        dt: T,
        gb: &mut [T],
        sb: &mut [T],
    ) {
        let (n, p) = (b.len(), sb.len());
        assert!(gh.len() == p * n && gy.len() >= p && x.len() >= p && c.len() == n && gb.len() == n);
        let step = Step { gh: gh.as_mut_ptr(), gy, x, dec: T::vsplat(decay), dt, n };
        for v0 in (0..n).step_by(BLOCK * T::W) {
            // SAFETY: the block's vectors lie inside `d_state` (n is a multiple of W, `usable`).
            let (bv, cv, gbv) = (b.as_ptr().add(v0), c.as_ptr().add(v0), gb.as_mut_ptr().add(v0));
            // A block size known at compile time keeps the block's sums in registers; with a
            // run-time size they lived on the stack, loaded and stored around every fused add.
            match (n - v0) / T::W {
                1 => reverse_block::<T, 1>(&step, v0, bv, cv, gbv, sb),
                2 => reverse_block::<T, 2>(&step, v0, bv, cv, gbv, sb),
                3 => reverse_block::<T, 3>(&step, v0, bv, cv, gbv, sb),
                _ => reverse_block::<T, BLOCK>(&step, v0, bv, cv, gbv, sb),
            }
        }
    }

    /// What every block of one reverse step shares.
    struct Step<'a, T: Lanes> {
        gh: *mut T,
        gy: &'a [T],
        x: &'a [T],
        dec: T::V,
        dt: T,
        n: usize,
    }

    /// [`head_reverse`] over the `NB` vectors of `d_state` from `v0` on; `b`, `c` and `gb` point
    /// at the block's first element. Sets `sb` on the first block and adds to it on later ones.
    ///
    /// # Safety
    /// As [`head_forward`]; `v0 + NB W <= n` and the pointers cover `NB W` elements.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn reverse_block<T: Lanes + num_traits::Float, const NB: usize>(
        s: &Step<T>,
        v0: usize,
        b: *const T,
        c: *const T,
        gb: *mut T,
        sb: &mut [T],
    ) {
        let (n, p) = (s.n, sb.len());
        let mut acc_b: [T::V; NB] = std::array::from_fn(|j| T::vload(gb.add(j * T::W)));
        let bs: [T::V; NB] = std::array::from_fn(|j| T::vload(b.add(j * T::W)));
        let cs: [T::V; NB] = std::array::from_fn(|j| T::vload(c.add(j * T::W)));
        // Rows in groups of W where they divide evenly, for one transposing sum per group.
        let group = if p % T::W == 0 { T::W } else { 1 };
        let mut accs_sb = [T::vzero(); 16];
        for p0 in (0..p).step_by(group) {
            for (r, acc_sb) in accs_sb[..group].iter_mut().enumerate() {
                let pi = p0 + r;
                let gyp = T::vsplat(s.gy[pi]);
                let xdt = T::vsplat(s.x[pi] * s.dt);
                let mut acc = T::vzero();
                for j in 0..NB {
                    // SAFETY: pi * n + v0 + (j + 1) W <= p * n, checked by the caller.
                    let o = pi * n + v0 + j * T::W;
                    let g = T::vfma(gyp, cs[j], T::vload(s.gh.add(o)));
                    acc = T::vfma(g, bs[j], acc);
                    acc_b[j] = T::vfma(xdt, g, acc_b[j]);
                    T::vstore(s.gh.add(o), T::vmul(g, s.dec));
                }
                *acc_sb = acc;
            }
            put_row_sums(&accs_sb[..group], &mut sb[p0..p0 + group], v0 == 0);
        }
        for (j, &v) in acc_b.iter().enumerate() {
            T::vstore(gb.add(j * T::W), v);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn inputs() -> Vec<f64> {
        let mut v: Vec<f64> = (-4000..4000).map(|i| i as f64 * 0.0371).collect();
        v.extend([-800.0, -750.0, -120.0, -103.9, -88.0, 0.0, 88.0, 103.9, 120.0, 750.0, 800.0, 1e30, -1e30]);
        v
    }

    /// Relative error against `1 / (1 + exp(-x))` in f64, for values from the square root of
    /// `T`'s smallest normal number up (below it, where `exp(-x)` overflows `T`, the plain
    /// `1 / (1 + exp(-x))` in `T` gives 0 as well); absolute error below that.
    fn worst<T: Lanes + num_traits::Float>(tolerance: f64) {
        let x = inputs();
        let xt: Vec<T> = x.iter().map(|&v| T::from(v).unwrap()).collect();
        let mut out = vec![T::zero(); xt.len()];
        // SAFETY: only called after the CPU check below.
        let done = unsafe { sigmoid_slice(&xt, &mut out) };
        assert_eq!(done, xt.len() / T::W * T::W);
        let mut worst = 0.0f64;
        for (i, (&xv, &got)) in xt.iter().zip(&out).take(done).enumerate() {
            let want = 1.0 / (1.0 + (-xv.to_f64().unwrap()).exp());
            let got = got.to_f64().unwrap();
            let err = (got - want).abs() / want.max(T::min_positive_value().sqrt().to_f64().unwrap());
            assert!(err <= tolerance, "x[{i}] = {}: sigmoid {got}, want {want}", x[i]);
            worst = worst.max(err);
        }
        println!("worst relative error {worst:e}");
    }

    #[test]
    fn vector_sigmoid_is_accurate_over_the_whole_range() {
        if !std::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512 on this CPU: the vector sigmoid is not used here");
            return;
        }
        worst::<f32>(5e-7);
        worst::<f64>(1e-14);
    }

    /// `vsums` puts each vector's own sum at its own index (the f32 tree's shuffles and final
    /// permutation), against the plain reduction of each vector.
    fn sums_match<T: Lanes + num_traits::Float>() {
        let values: Vec<T> = (0..T::W * T::W).map(|i| T::from(((i * 37) % 101) as f64 - 50.0).unwrap()).collect();
        // SAFETY: only called after the CPU check below; every load reads W values of `values`.
        unsafe {
            let v: Vec<T::V> = values.chunks(T::W).map(|c| T::vload(c.as_ptr())).collect();
            let mut out = vec![T::zero(); T::W];
            T::vsums(&v, out.as_mut_ptr());
            for (i, (&got, c)) in out.iter().zip(values.chunks(T::W)).enumerate() {
                let want = c.iter().fold(T::zero(), |a, &b| a + b);
                assert!(got == want, "vector {i}: {:?} instead of {:?}", got.to_f64(), want.to_f64());
            }
        }
    }

    #[test]
    fn transposed_sums_keep_each_vector_at_its_index() {
        if !std::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512 on this CPU: the vector sums are not used here");
            return;
        }
        sums_match::<f32>();
        sums_match::<f64>();
    }
}
