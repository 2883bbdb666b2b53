use burn::prelude::*;

use crate::error::{expect_positive, expect_shape, ShapeError};

/// Causal depthwise convolution over time, channel by channel, as a cross-correlation whose last
/// tap multiplies the current step:
/// `out[t, c] = bias[c] + sum_k weight[c, k] * x[t - (K-1) + k, c]`.
///
/// Steps before the start read `left` (the last `K-1` inputs of an earlier call, so that a
/// sequence split in two gives the same output as in one piece) or zeros.
///
/// # Shapes
/// - `x`: `[batch, L, C]`
/// - `weight`: `[C, K]`; `bias`: `[C]`
/// - `left`: `[batch, K-1, C]`
/// - output: `[batch, L, C]`
pub fn causal_conv1d<B: Backend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    left: Option<Tensor<B, 3>>,
) -> Result<Tensor<B, 3>, ShapeError> {
    let [batch, len, channels] = x.dims();
    let [_, k] = weight.dims();
    expect_positive("conv kernel size", k)?;
    expect_shape("conv weight", &weight.dims(), &[channels, k])?;
    if let Some(b) = &bias {
        expect_shape("conv bias", &b.dims(), &[channels])?;
    }
    let padded = if k == 1 {
        x
    } else {
        let left = match left {
            Some(l) => {
                expect_shape("conv left context", &l.dims(), &[batch, k - 1, channels])?;
                l
            }
            None => Tensor::zeros([batch, k - 1, channels], &x.device()),
        };
        Tensor::cat(vec![left, x], 1)
    };
    // weight_t[k] is the [1, 1, C] row of tap k.
    let weight_t = weight.transpose().reshape([k, 1, 1, channels]);
    let mut out = padded.clone().narrow(1, 0, len) * weight_t.clone().narrow(0, 0, 1).squeeze_dim::<3>(0);
    for tap in 1..k {
        out = out + padded.clone().narrow(1, tap, len) * weight_t.clone().narrow(0, tap, 1).squeeze_dim::<3>(0);
    }
    Ok(match bias {
        Some(b) => out + b.reshape([1, 1, channels]),
        None => out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{to_vec, TestBackend};

    #[test]
    fn matches_hand_computed_values_with_and_without_context() {
        let device = Default::default();
        // One channel, kernel [1, 10, 100]: out[t] = x[t-2] + 10 x[t-1] + 100 x[t] + 0.5.
        let x = Tensor::<TestBackend, 3>::from_data([[[1.0], [2.0], [3.0]]], &device);
        let w = Tensor::<TestBackend, 2>::from_data([[1.0, 10.0, 100.0]], &device);
        let b = Tensor::<TestBackend, 1>::from_data([0.5], &device);
        let out = causal_conv1d(x.clone(), w.clone(), Some(b.clone()), None).unwrap();
        assert_eq!(to_vec(out), [100.5, 210.5, 321.5]);
        let left = Tensor::<TestBackend, 3>::from_data([[[7.0], [8.0]]], &device);
        let out = causal_conv1d(x, w, Some(b), Some(left)).unwrap();
        assert_eq!(to_vec(out), [7.0 + 80.0 + 100.0 + 0.5, 8.0 + 10.0 + 200.0 + 0.5, 321.5]);
    }

    #[test]
    fn rejects_wrong_weight_and_context_shapes() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 3>::zeros([2, 5, 3], &device);
        let w = Tensor::<TestBackend, 2>::zeros([4, 4], &device);
        assert!(matches!(causal_conv1d(x.clone(), w, None, None), Err(ShapeError::Mismatch { what: "conv weight", .. })));
        let w = Tensor::<TestBackend, 2>::zeros([3, 4], &device);
        let left = Tensor::<TestBackend, 3>::zeros([2, 2, 3], &device);
        assert_eq!(
            causal_conv1d(x, w, None, Some(left)).unwrap_err(),
            ShapeError::Mismatch { what: "conv left context", expected: vec![2, 3, 3], got: vec![2, 2, 3] }
        );
    }
}
