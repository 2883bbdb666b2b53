use burn::prelude::*;

/// Above this input, softplus returns its input unchanged (PyTorch's default threshold).
pub const SOFTPLUS_THRESHOLD: f64 = 20.0;

/// `softplus(v) = ln(1 + e^v)`, and `v` itself for `v > 20`, as in PyTorch.
///
/// The exponential only ever sees inputs clamped to the threshold: for large `v` the unused
/// branch would otherwise hold `inf`, and its zero gradient times `inf` is NaN in the backward.
///
/// # Shapes
/// - `x`: any; output: the same.
pub fn softplus<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let above = x.clone().greater_elem(SOFTPLUS_THRESHOLD);
    let smooth = x.clone().clamp_max(SOFTPLUS_THRESHOLD).exp().log1p();
    smooth.mask_where(above, x)
}

/// The inverse of [`softplus`] for positive inputs: `y + ln(-expm1(-y))`, and `y` for `y > 20`.
///
/// Used to initialise `dt_bias` so that `softplus(dt_bias) = dt0`. `-expm1(-y)` is computed as
/// `2 tanh(y/2) / (1 + tanh(y/2))`, an identity that keeps full precision for the small `dt0`
/// (1e-4 and up) where `1 - exp(-y)` would cancel.
///
/// # Shapes
/// - `y`: any, entries > 0; output: the same.
pub fn inverse_softplus<B: Backend, const D: usize>(y: Tensor<B, D>) -> Tensor<B, D> {
    let above = y.clone().greater_elem(SOFTPLUS_THRESHOLD);
    let t = y.clone().clamp_max(SOFTPLUS_THRESHOLD).div_scalar(2.0).tanh();
    let neg_expm1 = t.clone().mul_scalar(2.0).div(t.add_scalar(1.0));
    (y.clone() + neg_expm1.log()).mask_where(above, y)
}

/// The logistic function `1 / (1 + e^-v)`, computed as `(1 + tanh(v / 2)) / 2`.
///
/// Burn 0.21's default `sigmoid` (used by NdArray) computes in f32 whatever the tensor's float
/// type, which would cap every f64 check of this project at about 1e-8. The tanh identity is
/// exact, stays in the tensor's own precision, and has a finite gradient for every input.
pub fn sigmoid<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.div_scalar(2.0).tanh().add_scalar(1.0).div_scalar(2.0)
}

/// `v * sigmoid(v)`, with this crate's full-precision [`sigmoid`].
pub fn silu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clone() * sigmoid(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close, to_vec, TestAutodiff, TestBackend};

    #[test]
    fn softplus_matches_hand_computed_values_and_threshold() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 1>::from_data([-30.0, -1.0, 0.0, 1.0, 19.0, 20.5, 1000.0], &device);
        let out = to_vec(softplus(x));
        let expected = [
            (-30.0f64).exp().ln_1p(),
            (-1.0f64).exp().ln_1p(),
            std::f64::consts::LN_2,
            1.0f64.exp().ln_1p(),
            19.0f64.exp().ln_1p(),
            20.5,
            1000.0,
        ];
        assert_close(&out, &expected, 1e-15);
    }

    #[test]
    fn softplus_gradient_is_finite_past_the_threshold() {
        let device = Default::default();
        let x = Tensor::<TestAutodiff, 1>::from_data([-800.0, 0.0, 50.0, 800.0], &device).require_grad();
        let loss = {
            let _building = crate::graph::recording();
            softplus(x.clone()).sum()
        };
        let grads = crate::graph::backward(loss);
        let g = to_vec(x.grad(&grads).unwrap());
        assert_close(&g, &[0.0, 0.5, 1.0, 1.0], 1e-15);
    }

    #[test]
    fn sigmoid_and_silu_keep_f64_precision() {
        let device = Default::default();
        let xs = [-40.0, -3.0, -1e-3, 0.0, 0.7, 5.0, 40.0];
        let x = Tensor::<TestBackend, 1>::from_data(xs, &device);
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let expected: Vec<f64> = xs.iter().map(|&v| sig(v)).collect();
        assert_close(&to_vec(sigmoid(x.clone())), &expected, 1e-15);
        let expected: Vec<f64> = xs.iter().map(|&v| v * sig(v)).collect();
        assert_close(&to_vec(silu(x)), &expected, 1e-15);
    }

    #[test]
    fn sigmoid_gradient_is_finite_and_exact() {
        let device = Default::default();
        let xs = [-800.0, -2.0, 0.0, 3.0, 800.0];
        let x = Tensor::<TestAutodiff, 1>::from_data(xs, &device).require_grad();
        let loss = {
            let _building = crate::graph::recording();
            sigmoid(x.clone()).sum()
        };
        let grads = crate::graph::backward(loss);
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let expected: Vec<f64> = xs.iter().map(|&v| sig(v) * (1.0 - sig(v))).collect();
        assert_close(&to_vec(x.grad(&grads).unwrap()), &expected, 1e-15);
    }

    #[test]
    fn inverse_softplus_inverts_softplus() {
        let device = Default::default();
        let ys = [1e-4, 1e-3, 0.05, 0.1, 1.0, 5.0, 25.0];
        let y = Tensor::<TestBackend, 1>::from_data(ys, &device);
        let inv = inverse_softplus(y);
        // Hand values: ln(expm1(y)) from std's expm1, which is exact to an ulp.
        let expected: Vec<f64> = ys.iter().map(|&y: &f64| if y > 20.0 { y } else { y.exp_m1().ln() }).collect();
        assert_close(&to_vec(inv.clone()), &expected, 1e-13);
        assert_close(&to_vec(softplus(inv)), &ys, 1e-13);
    }
}
