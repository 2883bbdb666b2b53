//! Reading tensors back as `f64` and measuring how far apart two results are.
//!
//! Tests all over the workspace state their tolerances in the one measure defined here, the
//! relative difference `max |a - b| / max |b|`, so a tolerance means the same thing everywhere.

use burn::prelude::*;

/// The tensor's values in row-major order, converted to `f64` whatever the backend's float type.
pub fn to_f64_vec<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f64> {
    x.into_data().convert::<f64>().to_vec::<f64>().expect("converted data is f64")
}

/// `max |got - reference| / max |reference|` (and the plain maximum difference when the
/// reference is all zeros). NaN anywhere gives NaN, so that a NaN never passes a tolerance.
///
/// # Panics
/// When the lengths differ: that is a bug in the calling test, not a numerical difference.
pub fn rel_diff(got: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(got.len(), reference.len(), "compared slices differ in length");
    let mut diff = 0.0f64;
    let mut scale = 0.0f64;
    for (&g, &r) in got.iter().zip(reference) {
        if g.is_nan() || r.is_nan() {
            return f64::NAN;
        }
        diff = diff.max((g - r).abs());
        scale = scale.max(r.abs());
    }
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

/// [`rel_diff`] between two tensors of the same shape.
pub fn tensor_rel_diff<B: Backend, const D: usize>(got: Tensor<B, D>, reference: Tensor<B, D>) -> f64 {
    assert_eq!(got.dims(), reference.dims(), "compared tensors differ in shape");
    rel_diff(&to_f64_vec(got), &to_f64_vec(reference))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_diff_scales_by_the_reference_and_propagates_nan() {
        assert_eq!(rel_diff(&[1.0, 2.5], &[1.0, 2.0]), 0.25);
        assert_eq!(rel_diff(&[0.5], &[0.0]), 0.5);
        assert!(rel_diff(&[f64::NAN], &[1.0]).is_nan());
    }
}
