//! A linear layer over the rows of a batch, `y = x w + b`, and its gradients, on host slices.
//!
//! Burn's broadcast `Linear` over `[batch, len, d_in]` runs `batch` small products and sums
//! `batch` partial weight gradients; flattened, its weight gradient is one product over all rows,
//! which gemm splits only along the small result (slower on two threads than on one). Here the
//! products are the kernels' own (`matmul.rs`): the weight gradient in shares of the rows, and no
//! transposed copy of `x`. `mamba2-model`'s `linear_rows` runs it on the CPU backends.

use crate::float::HostFloat;
use crate::matmul::{affine, column_sums, product, Mat};

/// The sizes of a linear layer over rows: `x` is `[rows, d_in]`, `w` is `[d_in, d_out]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearDims {
    /// Rows of `x` and of the output.
    pub rows: usize,
    /// Inputs per row.
    pub d_in: usize,
    /// Outputs per row.
    pub d_out: usize,
}

fn check<T>(d: LinearDims, x: &[T], w: &[T], b: Option<&[T]>) {
    assert_eq!(x.len(), d.rows * d.d_in, "linear: x holds {} values, not [{}, {}]", x.len(), d.rows, d.d_in);
    assert_eq!(w.len(), d.d_in * d.d_out, "linear: w holds {} values, not [{}, {}]", w.len(), d.d_in, d.d_out);
    if let Some(b) = b {
        assert_eq!(b.len(), d.d_out, "linear: the bias holds {} values, not {}", b.len(), d.d_out);
    }
}

/// `x w + b`, row-major `[rows, d_out]`.
pub fn forward<T: HostFloat>(d: LinearDims, x: &[T], w: &[T], b: Option<&[T]>) -> Vec<T> {
    check(d, x, w, b);
    affine(d.rows, d.d_out, d.d_in, Mat::rows(x, d.d_in), Mat::rows(w, d.d_out), b, None)
}

/// The gradients of `x`, `w` and `b` given the output's, `gy` (`[rows, d_out]`); each one is
/// computed only when wanted (else empty).
pub fn backward<T: HostFloat>(d: LinearDims, x: &[T], w: &[T], gy: &[T], want: [bool; 3]) -> [Vec<T>; 3] {
    check(d, x, w, None);
    assert_eq!(gy.len(), d.rows * d.d_out, "linear: the output's gradient holds {} values, not [{}, {}]", gy.len(), d.rows, d.d_out);
    let gx = if want[0] { product(d.rows, d.d_in, d.d_out, Mat::rows(gy, d.d_out), Mat::transposed(w, d.d_out)) } else { Vec::new() };
    let gw = if want[1] { product(d.d_in, d.d_out, d.rows, Mat::transposed(x, d.d_in), Mat::rows(gy, d.d_out)) } else { Vec::new() };
    let gb = if want[2] { column_sums(gy, d.d_out) } else { Vec::new() };
    [gx, gw, gb]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output and gradients against the sums written out (f64).
    #[test]
    fn forward_and_gradients_equal_the_sums() {
        let d = LinearDims { rows: 7, d_in: 5, d_out: 3 };
        let wave = |n: usize, f: f64| (0..n).map(|i| (i as f64 * f).sin()).collect::<Vec<f64>>();
        let (x, w, b, gy) = (wave(35, 0.7), wave(15, 0.3), wave(3, 1.1), wave(21, 0.9));
        let y = forward(d, &x, &w, Some(&b));
        let [gx, gw, gb] = backward(d, &x, &w, &gy, [true; 3]);
        let close = |a: f64, e: f64| (a - e).abs() <= 1e-12;
        for r in 0..7 {
            for o in 0..3 {
                assert!(close(y[r * 3 + o], b[o] + (0..5).map(|i| x[r * 5 + i] * w[i * 3 + o]).sum::<f64>()));
            }
            for i in 0..5 {
                assert!(close(gx[r * 5 + i], (0..3).map(|o| gy[r * 3 + o] * w[i * 3 + o]).sum::<f64>()));
            }
        }
        for i in 0..5 {
            for o in 0..3 {
                assert!(close(gw[i * 3 + o], (0..7).map(|r| x[r * 5 + i] * gy[r * 3 + o]).sum::<f64>()));
            }
        }
        for o in 0..3 {
            assert!(close(gb[o], (0..7).map(|r| gy[r * 3 + o]).sum::<f64>()));
        }
        let [gx, gw, gb] = backward(d, &x, &w, &gy, [false, true, false]);
        assert!(gx.is_empty() && gb.is_empty() && gw.len() == 15);
    }
}
