//! Sums whose rounding does not depend on the thread pool.
//!
//! Burn's Flex backend sums an `f32` tensor of 4 Mi elements or more as a rayon reduction over
//! chunks, and rayon joins the chunk sums in a tree shaped by which tasks were stolen: two
//! identical runs then report losses that differ in the last bits (a forecaster with dropout at
//! H 720: 0.6419081030935354, 0.6419081050437896, 0.6419081040686625 in three runs). Every row
//! of a `sum_dim` is summed by one task, so summing rows first and then the row sums gives the
//! same bits on every run.

use burn::prelude::*;

/// Tensors with fewer elements are summed by `sum` as they are (every backend sums those on one
/// thread); a quarter of Flex's parallel threshold, so that a lower one in a later Burn still
/// falls above it.
pub const ORDERED_ABOVE: usize = 1 << 20;

/// The sum of every element of `t`, as `t.sum()`, in an order that is the same on every run:
/// large tensors are summed along their last dimension first, then over those row sums.
///
/// # Shapes
/// - `t`: any; the result: `[1]`.
pub fn ordered_sum<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 1> {
    let n = t.shape().num_elements();
    if n < ORDERED_ABOVE {
        return t.sum();
    }
    let last = t.dims()[D - 1].max(1);
    let rows = t.reshape([n / last, last]).sum_dim(1).reshape([n / last]);
    ordered_sum(rows)
}

/// The mean of every element of `t`, as `t.mean()`, in an order that is the same on every run:
/// large tensors are averaged along their last dimension first, then over those row means (all
/// rows hold as many values, so that is the mean). Small tensors are `t.mean()` itself, whose
/// gradient keeps `1 / n` in the tensor's precision (a `div_scalar` by `n` moved an f64
/// gradient by 6e-9 of its size).
///
/// # Shapes
/// - `t`: any; the result: `[1]`.
pub fn ordered_mean<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 1> {
    let n = t.shape().num_elements();
    if n < ORDERED_ABOVE {
        return t.mean();
    }
    let last = t.dims()[D - 1].max(1);
    let rows = t.reshape([n / last, last]).mean_dim(1).reshape([n / last]);
    ordered_mean(rows)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::prelude::*;

    /// The sum of 8 Mi values equals the f64 sum to f32 rounding, and is the same bits on every
    /// call (Flex's own `sum` of the same tensor was seen to differ between calls).
    #[test]
    fn a_large_sum_is_the_same_on_every_call() {
        let device = Default::default();
        let n = 8 << 20;
        let values: Vec<f32> = (0..n as u64).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 + 1e-4).collect();
        let exact: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let t = Tensor::<Flex, 1>::from_data(TensorData::new(values, [n]), &device).reshape([2048, 4096]);
        let first = super::ordered_sum(t.clone()).into_scalar();
        assert!((f64::from(first) - exact).abs() <= 1e-5 * exact, "{first} against {exact}");
        for _ in 0..20 {
            assert_eq!(super::ordered_sum(t.clone()).into_scalar().to_bits(), first.to_bits());
        }
        let mean = super::ordered_mean(t).into_scalar();
        assert!((f64::from(mean) - exact / n as f64).abs() <= 1e-5 * exact / n as f64);
    }

    /// Small tensors are summed exactly as `sum` sums them.
    #[test]
    fn a_small_sum_is_sum() {
        let t = Tensor::<Flex, 2>::from_data([[1.5f32, 2.0], [3.25, -0.5]], &Default::default());
        assert_eq!(super::ordered_sum(t.clone()).into_scalar(), t.sum().into_scalar());
    }
}
