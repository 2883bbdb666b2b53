use burn::prelude::*;

use crate::error::{expect_positive, ShapeError};

/// Pads `x` with zeros at the end of dimension `dim` up to the next multiple of `multiple`.
///
/// Returns the padded tensor (unchanged when the length already is a multiple) and the original
/// length, so that callers can slice the padding off again. Zero is the padding value the chunked
/// scan needs: with `dt = 0` a padded step neither decays the state nor writes into it.
///
/// # Shapes
/// - `x`: any shape with `x.dims()[dim] = len`
/// - output: the same shape with `dim` of length `ceil(len / multiple) * multiple`
pub fn pad_to_multiple<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    dim: usize,
    multiple: usize,
) -> Result<(Tensor<B, D>, usize), ShapeError> {
    expect_positive("pad multiple", multiple)?;
    if dim >= D {
        return Err(ShapeError::BadDim { what: "pad_to_multiple", dim, rank: D });
    }
    let mut dims = x.dims();
    let len = dims[dim];
    let padded = len.div_ceil(multiple) * multiple;
    if padded == len {
        return Ok((x, len));
    }
    dims[dim] = padded - len;
    let zeros = Tensor::<B, D>::zeros(dims, &x.device());
    Ok((Tensor::cat(vec![x, zeros], dim), len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{to_vec, TestBackend};

    #[test]
    fn pads_with_zeros_to_the_next_multiple() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 2>::from_data([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &device);
        let (p, len) = pad_to_multiple(x.clone(), 1, 4).unwrap();
        assert_eq!(len, 3);
        assert_eq!(p.dims(), [2, 4]);
        assert_eq!(to_vec(p), [1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0]);
        let (same, len) = pad_to_multiple(x, 0, 2).unwrap();
        assert_eq!((same.dims(), len), ([2, 3], 2));
    }

    #[test]
    fn rejects_zero_multiple_and_bad_dim() {
        let x = Tensor::<TestBackend, 2>::zeros([2, 3], &Default::default());
        assert_eq!(pad_to_multiple(x.clone(), 1, 0).unwrap_err(), ShapeError::Zero { what: "pad multiple" });
        assert!(matches!(pad_to_multiple(x, 2, 4), Err(ShapeError::BadDim { dim: 2, rank: 2, .. })));
    }
}
