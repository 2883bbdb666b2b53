//! Dense products on host buffers, for the projections of the CPU path: the `gemm` crate (the
//! one Burn's Flex backend calls too), writing into buffers the kernel owns, so that no tensor is
//! allocated, zero-filled and copied again around each product.

use crate::buffers::{build, filled, BUILD_CHUNK};
use crate::float::HostFloat;
use rayon::prelude::*;

/// A matrix read from a slice: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A row-major matrix with `cols` columns.
    pub fn rows(data: &'a [T], cols: usize) -> Self {
        Self { data, rs: cols, cs: 1 }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [T], cols: usize) -> Self {
        Self { data, rs: 1, cs: cols }
    }

    /// Whether an `r x c` matrix read this way stays inside the slice.
    fn fits(&self, r: usize, c: usize) -> bool {
        r == 0 || c == 0 || (r - 1) * self.rs + (c - 1) * self.cs < self.data.len()
    }
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` with `accumulate`; `dst` is row-major `[m, n]`,
/// `lhs` is `[m, k]` and `rhs` `[k, n]`. Runs on the rayon pool.
pub(crate) fn matmul<T: HostFloat>(dst: &mut [T], m: usize, n: usize, k: usize, lhs: Mat<T>, rhs: Mat<T>, accumulate: bool) {
    matmul_on(dst, m, n, k, lhs, rhs, accumulate, true)
}

/// As [`matmul`], on the calling thread alone (inside a task of the pool that runs many).
pub(crate) fn matmul_serial<T: HostFloat>(dst: &mut [T], m: usize, n: usize, k: usize, lhs: Mat<T>, rhs: Mat<T>, accumulate: bool) {
    matmul_on(dst, m, n, k, lhs, rhs, accumulate, false)
}

#[allow(clippy::too_many_arguments)]
fn matmul_on<T: HostFloat>(dst: &mut [T], m: usize, n: usize, k: usize, lhs: Mat<T>, rhs: Mat<T>, accumulate: bool, pool: bool) {
    assert!(dst.len() == m * n, "matmul: a [{m}, {n}] product does not fit a buffer of {}", dst.len());
    if k == 0 {
        if !accumulate {
            dst.fill(T::zero());
        }
        return;
    }
    // SAFETY: `dst` holds `m * n` elements and is borrowed mutably.
    unsafe { gemm_raw(dst.as_mut_ptr(), m, n, k, lhs, rhs, accumulate, pool) }
}

/// `lhs · rhs` in a new row-major `[m, n]` buffer that the product writes directly: no zero fill
/// first, which for the large activations of a step costs as much as a pass over them.
pub(crate) fn product<T: HostFloat>(m: usize, n: usize, k: usize, lhs: Mat<T>, rhs: Mat<T>) -> Vec<T> {
    if k == 0 {
        return vec![T::zero(); m * n];
    }
    let mut dst = Vec::with_capacity(m * n);
    // SAFETY: the spare capacity holds `m * n` elements; with `accumulate = false` gemm writes
    // every one of them and reads none, so all are initialised when the length is set.
    unsafe {
        gemm_raw(dst.spare_capacity_mut().as_mut_ptr().cast::<T>(), m, n, k, lhs, rhs, false, true);
        dst.set_len(m * n);
    }
    dst
}

/// A linear layer's output `[m, n]`: `lhs · rhs`, plus `bias` (`[n]`) on every row and
/// `residual` (`[m, n]`) when given. Those are written first, by the rayon pool, and the product
/// is added to them.
pub(crate) fn affine<T: HostFloat>(
    m: usize,
    n: usize,
    k: usize,
    lhs: Mat<T>,
    rhs: Mat<T>,
    bias: Option<&[T]>,
    residual: Option<&[T]>,
) -> Vec<T> {
    // Whole rows per task, so that the bias lines up with each row's start.
    let chunk = n.max(1) * BUILD_CHUNK.div_ceil(n.max(1));
    let mut dst = match (bias, residual) {
        (None, None) => return product(m, n, k, lhs, rhs),
        (Some(bias), None) => build(m * n, chunk, |_, c| c.chunks_mut(n).for_each(|row| row.copy_from_slice(bias))),
        (None, Some(res)) => filled(&res[..m * n]),
        (Some(bias), Some(res)) => build(m * n, chunk, |at, c| {
            let src = &res[at..at + c.len()];
            for (row, src) in c.chunks_mut(n).zip(src.chunks(n)) {
                for ((o, &r), &b) in row.iter_mut().zip(src).zip(bias) {
                    *o = r + b;
                }
            }
        }),
    };
    matmul(&mut dst, m, n, k, lhs, rhs, true);
    dst
}

/// The product into `dst`, which must point to `m * n` writable elements (read too with
/// `accumulate`), nothing else borrowing them; `k > 0`. On the rayon pool with `pool`, else on
/// the calling thread.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw<T: HostFloat>(dst: *mut T, m: usize, n: usize, k: usize, lhs: Mat<T>, rhs: Mat<T>, accumulate: bool, pool: bool) {
    assert!(lhs.fits(m, k) && rhs.fits(k, n), "matmul: [{m}, {k}] x [{k}, {n}] does not fit its operands");
    if m == 0 || n == 0 {
        return;
    }
    let parts = if pool { k_parts(m, n, k) } else { 1 };
    if parts <= 1 {
        let parallelism = if pool { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
        // SAFETY: as this function's.
        unsafe { gemm_call(dst, m, n, k, lhs, rhs, accumulate, parallelism) };
        return;
    }
    // A weight's gradient is a small `[m, n]` summed over many rows (`k`): gemm splits only
    // `m` and `n` among its threads, and on two cores such a product ran slower than on one
    // (`[32, 164]` over 21,504 rows: 5.8 ms, against 4.4 ms on one thread). Each thread sums
    // its own share of the rows instead, and the shares are added (2.7 ms).
    let step = k.div_ceil(parts);
    let shares: Vec<Vec<T>> = (0..k.div_ceil(step))
        .into_par_iter()
        .map(|p| {
            let (k0, kk) = (p * step, step.min(k - p * step));
            let lhs = Mat { data: &lhs.data[k0 * lhs.cs..], ..lhs };
            let rhs = Mat { data: &rhs.data[k0 * rhs.rs..], ..rhs };
            let mut share = Vec::with_capacity(m * n);
            // SAFETY: the share's spare capacity holds `m * n` elements, all written (and none
            // read) by a product that does not accumulate; the operands' ranges were checked
            // above, and `k0 + kk <= k`.
            unsafe {
                gemm_call(share.spare_capacity_mut().as_mut_ptr().cast::<T>(), m, n, kk, lhs, rhs, false, gemm::Parallelism::None);
                share.set_len(m * n);
            }
            share
        })
        .collect();
    for i in 0..m * n {
        let sum = shares.iter().fold(T::zero(), |acc, s| acc + s[i]);
        // SAFETY: `i < m * n`, inside `dst`, which the caller vouches for; it is read only when
        // accumulating, where it holds values.
        unsafe {
            let at = dst.add(i);
            at.write(if accumulate { *at + sum } else { sum });
        }
    }
}

/// In how many shares of its rows a product `[m, k] x [k, n]` is computed on the rayon pool: one
/// (gemm's own split of `m` and `n`) unless the result is small beside the rows it sums.
fn k_parts(m: usize, n: usize, k: usize) -> usize {
    let threads = rayon::current_num_threads();
    if threads > 1 && k >= 8 * m.max(n) && m * n * k >= 1 << 20 {
        threads.min(k / 1024).max(1)
    } else {
        1
    }
}

/// # Safety
/// As [`gemm_raw`]'s, with the operands' ranges checked.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_call<T: HostFloat>(
    dst: *mut T,
    m: usize,
    n: usize,
    k: usize,
    lhs: Mat<T>,
    rhs: Mat<T>,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    // SAFETY: every index the product reads lies inside its operand (checked by the caller), the
    // caller vouches for `dst`, and `T` is f32 or f64, which gemm supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The column sums of the row-major `[rows, cols]` matrix `data`.
pub(crate) fn column_sums<T: HostFloat>(data: &[T], cols: usize) -> Vec<T> {
    let rows = data.len().checked_div(cols).unwrap_or(0);
    let ones = vec![T::one(); rows];
    product(1, cols, rows, Mat::rows(&ones, rows), Mat::rows(data, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the textbook triple loop, for every layout the projections use.
    #[test]
    fn products_match_the_triple_loop() {
        let (m, n, k) = (37, 23, 41);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64 - 6.0) * 0.1).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64 - 5.0) * 0.1).collect();
        let naive = |at: &dyn Fn(usize, usize) -> f64, bt: &dyn Fn(usize, usize) -> f64| {
            let mut out = vec![0.0; m * n];
            for i in 0..m {
                for j in 0..n {
                    out[i * n + j] = (0..k).map(|q| at(i, q) * bt(q, j)).sum();
                }
            }
            out
        };
        let close = |x: &[f64], y: &[f64]| x.iter().zip(y).all(|(p, q)| (p - q).abs() <= 1e-12);
        let mut dst = vec![0.0; m * n];
        matmul(&mut dst, m, n, k, Mat::rows(&a, k), Mat::rows(&b, n), false);
        assert!(close(&dst, &naive(&|i, q| a[i * k + q], &|q, j| b[q * n + j])));
        // a read as [k, m] transposed, b as [n, k] transposed, accumulating onto the last result.
        let before = dst.clone();
        matmul(&mut dst, m, n, k, Mat::transposed(&a, m), Mat::transposed(&b, k), true);
        let t = naive(&|i, q| a[q * m + i], &|q, j| b[j * k + q]);
        let want: Vec<f64> = before.iter().zip(&t).map(|(p, q)| p + q).collect();
        assert!(close(&dst, &want));
        assert!(close(&product(m, n, k, Mat::rows(&a, k), Mat::rows(&b, n)), &naive(&|i, q| a[i * k + q], &|q, j| b[q * n + j])));
        // On the calling thread: the same, written fresh and accumulated.
        let mut serial = vec![7.0; m * n];
        matmul_serial(&mut serial, m, n, k, Mat::transposed(&a, m), Mat::transposed(&b, k), false);
        assert!(close(&serial, &t));
        matmul_serial(&mut serial, m, n, k, Mat::transposed(&a, m), Mat::transposed(&b, k), true);
        assert!(close(&serial, &t.iter().map(|v| 2.0 * v).collect::<Vec<_>>()));
        assert_eq!(product(m, n, 0, Mat::rows(&a, 0), Mat::rows(&b, n)), vec![0.0; m * n]);
        let sums = column_sums(&b, n);
        assert!(close(&sums, &(0..n).map(|j| (0..k).map(|q| b[q * n + j]).sum()).collect::<Vec<f64>>()));
    }

    /// A small result summed over many rows is computed in shares of the rows on two threads
    /// (see `gemm_raw`): the same as the triple loop, written fresh and accumulated, in both
    /// layouts a weight's gradient uses.
    #[test]
    fn products_over_many_rows_in_shares_match_the_triple_loop() {
        let (m, n, k) = (5, 7, 40_000);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool of two");
        assert!(pool.install(|| k_parts(m, n, k)) > 1, "the shared path is the one tested");
        let a: Vec<f64> = (0..k * m).map(|i| ((i * 7 % 13) as f64 - 6.0) * 0.1).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64 - 5.0) * 0.1).collect();
        // a is [k, m] row-major, read transposed as [m, k]; b is [k, n].
        let want: Vec<f64> = (0..m * n).map(|e| (0..k).map(|q| a[q * m + e / n] * b[q * n + e % n]).sum()).collect();
        let scale = want.iter().fold(0.0f64, |s, v| s.max(v.abs()));
        let close = |x: &[f64], y: &[f64]| x.iter().zip(y).all(|(p, q)| (p - q).abs() <= 1e-12 * scale);
        let got = pool.install(|| product(m, n, k, Mat::transposed(&a, m), Mat::rows(&b, n)));
        assert!(close(&got, &want), "{got:?} vs {want:?}");
        let mut acc = vec![1.5; m * n];
        pool.install(|| matmul(&mut acc, m, n, k, Mat::transposed(&a, m), Mat::rows(&b, n), true));
        assert!(close(&acc, &want.iter().map(|v| v + 1.5).collect::<Vec<_>>()));
    }
}
