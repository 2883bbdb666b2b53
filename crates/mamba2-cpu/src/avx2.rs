//! The sigmoid with AVX2 and FMA, for CPUs without AVX-512 (AMD before Zen 4, most desktop
//! Intel parts). Left to the compiler, `1 / (1 + exp(-x))` is a library call per value: on an
//! AVX2-only machine that was about a tenth of a train step. `avx512.rs` has the same function
//! for 512-bit registers, and `float::sigmoid` is the plain reference both are tested against.

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::sigmoid_slice;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::any::TypeId;
    use std::arch::x86_64::*;

    /// `out[i] = sigmoid(x[i])` for `f32` and `f64`; the tail after the last whole vector is
    /// left to the caller. Returns how many values were done.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    pub(crate) unsafe fn sigmoid_slice<T: bytemuck::Pod>(x: &[T], out: &mut [T]) -> usize {
        let n = x.len().min(out.len());
        let (x, out) = (&x[..n], &mut out[..n]);
        if TypeId::of::<T>() == TypeId::of::<f32>() {
            // SAFETY: the caller vouches for the CPU; `T` is f32, so the casts are identities.
            unsafe { slice_ps(bytemuck::cast_slice(x), bytemuck::cast_slice_mut(out)) }
        } else if TypeId::of::<T>() == TypeId::of::<f64>() {
            // SAFETY: as above, with `T` f64.
            unsafe { slice_pd(bytemuck::cast_slice(x), bytemuck::cast_slice_mut(out)) }
        } else {
            0
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn slice_ps(x: &[f32], out: &mut [f32]) -> usize {
        let n = x.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            // SAFETY: i + 8 <= n <= both lengths.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), sigmoid_ps(_mm256_loadu_ps(x.as_ptr().add(i)))) };
        }
        n
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn slice_pd(x: &[f64], out: &mut [f64]) -> usize {
        let n = x.len() / 4 * 4;
        for i in (0..n).step_by(4) {
            // SAFETY: i + 4 <= n <= both lengths.
            unsafe { _mm256_storeu_pd(out.as_mut_ptr().add(i), sigmoid_pd(_mm256_loadu_pd(x.as_ptr().add(i)))) };
        }
        n
    }

    /// The coefficients `1 / i!` of exp's Taylor series, `i < N`.
    const fn taylor<const N: usize>() -> [f64; N] {
        let mut coef = [1.0; N];
        let mut i = 1;
        while i < N {
            coef[i] = coef[i - 1] / i as f64;
            i += 1;
        }
        coef
    }

    // exp(x) = 2^k exp(r) with k = round(x / ln 2) and |r| <= ln 2 / 2, exp(r) by its Taylor
    // series (degree 7 for f32, 13 for f64, as in avx512.rs), and 2^k written into the exponent
    // bits. Without AVX-512's `scalef`, 2^k must be a normal number, so the input is clamped to
    // where it is (|x| <= 87 for f32, 708 for f64): beyond, 1 + exp(x) is 1 to the last place at
    // one end, and the sigmoid is below 2^-125 (f32) or 2^-1020 (f64) at the other.

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sigmoid_ps(v: __m256) -> __m256 {
        const COEF: usize = 8;
        let one = _mm256_set1_ps(1.0);
        let x = _mm256_sub_ps(_mm256_setzero_ps(), v);
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(87.0));
        let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        ));
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428_606_8e-6), r);
        const TAYLOR: [f64; COEF] = taylor::<COEF>();
        let coef = TAYLOR;
        let mut p = _mm256_set1_ps(coef[COEF - 1] as f32);
        for &c in coef[..COEF - 1].iter().rev() {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c as f32));
        }
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)));
        _mm256_div_ps(one, _mm256_add_ps(one, _mm256_mul_ps(p, _mm256_castsi256_ps(bits))))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sigmoid_pd(v: __m256d) -> __m256d {
        const COEF: usize = 14;
        let one = _mm256_set1_pd(1.0);
        let x = _mm256_sub_pd(_mm256_setzero_pd(), v);
        let x = _mm256_min_pd(_mm256_max_pd(x, _mm256_set1_pd(-708.0)), _mm256_set1_pd(708.0));
        let k = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_pd(
            x,
            _mm256_set1_pd(std::f64::consts::LOG2_E),
        ));
        let r = _mm256_fnmadd_pd(k, _mm256_set1_pd(0.693_147_180_369_123_8), x);
        let r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.908_214_929_270_587_7e-10), r);
        const TAYLOR: [f64; COEF] = taylor::<COEF>();
        let coef = TAYLOR;
        let mut p = _mm256_set1_pd(coef[COEF - 1]);
        for &c in coef[..COEF - 1].iter().rev() {
            p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c));
        }
        let k64 = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k));
        let bits = _mm256_slli_epi64::<52>(_mm256_add_epi64(k64, _mm256_set1_epi64x(1023)));
        _mm256_div_pd(one, _mm256_add_pd(one, _mm256_mul_pd(p, _mm256_castsi256_pd(bits))))
    }
}
