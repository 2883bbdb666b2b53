use burn::prelude::*;

use crate::activation::silu;
use crate::error::{expect_divides, expect_shape, ShapeError};

/// Where the SiLU gate of [`rms_norm_gated`] is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateOrder {
    /// `norm(x * silu(z)) * w`: mamba_ssm's default (`norm_before_gate = false`), used by every
    /// released checkpoint.
    GateThenNorm,
    /// `norm(x) * w * silu(z)` (`norm_before_gate = true`).
    NormThenGate,
}

/// Root-mean-square norm over the last dimension, computed group by group, with an optional
/// SiLU gate.
///
/// The last dimension (`d` channels) is cut into `ngroups` consecutive groups of `d / ngroups`
/// channels; each group is divided by `sqrt(mean(v^2) + eps)` on its own, then every channel is
/// scaled by `weight`. With one group and no gate this is the plain RMSNorm of the residual
/// stack. Normalising all `d` channels at once when `ngroups > 1` is a known divergence from the
/// reference.
///
/// # Shapes
/// - `x`, `gate`: `[..., d]`
/// - `weight`: `[d]`
/// - output: `[..., d]`
pub fn rms_norm_gated<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gate: Option<(Tensor<B, D>, GateOrder)>,
    weight: Tensor<B, 1>,
    ngroups: usize,
    eps: f64,
) -> Result<Tensor<B, D>, ShapeError> {
    let dims = x.dims();
    let d = dims[D - 1];
    expect_shape("norm weight", &weight.dims(), &[d])?;
    expect_divides("norm groups into channels", ngroups, d)?;
    let (x, late_gate) = match gate {
        Some((z, order)) => {
            expect_shape("norm gate", &z.dims(), &dims)?;
            match order {
                GateOrder::GateThenNorm => (x * silu(z), None),
                GateOrder::NormThenGate => (x, Some(silu(z))),
            }
        }
        None => (x, None),
    };
    let rows = dims[..D - 1].iter().product::<usize>();
    let grouped = x.reshape([rows, ngroups, d / ngroups]);
    let inv_rms = grouped.clone().powi_scalar(2).mean_dim(2).add_scalar(eps).sqrt().recip();
    let normed = (grouped * inv_rms).reshape(dims) * weight.unsqueeze::<D>();
    Ok(match late_gate {
        Some(g) => normed * g,
        None => normed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close, to_vec, TestBackend};

    fn sig(v: f64) -> f64 {
        1.0 / (1.0 + (-v).exp())
    }

    #[test]
    fn plain_rms_norm_matches_hand_values() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 2>::from_data([[3.0, 4.0]], &device);
        let w = Tensor::<TestBackend, 1>::from_data([1.0, 2.0], &device);
        let out = rms_norm_gated(x, None, w, 1, 0.0).unwrap();
        // rms = sqrt((9 + 16) / 2)
        let r = 12.5f64.sqrt();
        assert_close(&to_vec(out), &[3.0 / r, 8.0 / r], 1e-15);
    }

    #[test]
    fn groups_are_normalised_separately_with_both_gate_orders() {
        let device = Default::default();
        let xs = [1.0, 2.0, 10.0, -20.0];
        let zs = [0.5, -1.0, 2.0, 0.0];
        let x = Tensor::<TestBackend, 2>::from_data([xs], &device);
        let z = Tensor::<TestBackend, 2>::from_data([zs], &device);
        let w = Tensor::<TestBackend, 1>::from_data([1.0, 0.5, 2.0, 1.0], &device);
        let eps = 1e-5;
        let silu = |v: f64| v * sig(v);
        let ws = [1.0, 0.5, 2.0, 1.0];
        let norm = |v: [f64; 4]| -> Vec<f64> {
            let r0 = ((v[0] * v[0] + v[1] * v[1]) / 2.0 + eps).sqrt();
            let r1 = ((v[2] * v[2] + v[3] * v[3]) / 2.0 + eps).sqrt();
            vec![v[0] / r0 * ws[0], v[1] / r0 * ws[1], v[2] / r1 * ws[2], v[3] / r1 * ws[3]]
        };

        let gated: [f64; 4] = std::array::from_fn(|i| xs[i] * silu(zs[i]));
        let out = rms_norm_gated(x.clone(), Some((z.clone(), GateOrder::GateThenNorm)), w.clone(), 2, eps).unwrap();
        assert_close(&to_vec(out), &norm(gated), 1e-14);

        let expected: Vec<f64> = norm(xs).iter().zip(zs).map(|(n, z)| n * silu(z)).collect();
        let out = rms_norm_gated(x, Some((z, GateOrder::NormThenGate)), w, 2, eps).unwrap();
        assert_close(&to_vec(out), &expected, 1e-14);
    }

    #[test]
    fn rejects_groups_that_do_not_divide_channels() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 2>::zeros([1, 6], &device);
        let w = Tensor::<TestBackend, 1>::ones([6], &device);
        assert_eq!(
            rms_norm_gated(x, None, w, 4, 1e-5).unwrap_err(),
            ShapeError::NotDivisible { what: "norm groups into channels", divisor: 4, total: 6 }
        );
    }
}
