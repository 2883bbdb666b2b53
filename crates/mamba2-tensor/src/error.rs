use thiserror::Error;

/// A helper was called with shapes or sizes that do not fit together.
///
/// Every variant carries the offending values so that the message alone is enough to find the
/// caller's mistake.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShapeError {
    /// A size that must be positive was zero.
    #[error("{what} must be at least 1, got 0")]
    Zero {
        /// The name of the size.
        what: &'static str,
    },
    /// A size does not divide another one.
    #[error("{what}: {divisor} does not divide {total}")]
    NotDivisible {
        /// What the two sizes are.
        what: &'static str,
        /// The size that should divide `total`.
        divisor: usize,
        /// The size that should be a multiple of `divisor`.
        total: usize,
    },
    /// A tensor has the wrong shape.
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    Mismatch {
        /// The name of the tensor.
        what: &'static str,
        /// The shape that was required.
        expected: Vec<usize>,
        /// The shape that was given.
        got: Vec<usize>,
    },
    /// A dimension index is past the tensor's rank.
    #[error("{what}: dimension {dim} is out of range for a tensor of rank {rank}")]
    BadDim {
        /// The operation.
        what: &'static str,
        /// The dimension asked for.
        dim: usize,
        /// The rank of the tensor.
        rank: usize,
    },
}

/// Returns `Err(Mismatch)` unless `got == expected`.
pub fn expect_shape(what: &'static str, got: &[usize], expected: &[usize]) -> Result<(), ShapeError> {
    if got == expected {
        Ok(())
    } else {
        Err(ShapeError::Mismatch { what, expected: expected.to_vec(), got: got.to_vec() })
    }
}

/// Returns `Err(Zero)` when `value == 0`.
pub fn expect_positive(what: &'static str, value: usize) -> Result<(), ShapeError> {
    if value == 0 {
        Err(ShapeError::Zero { what })
    } else {
        Ok(())
    }
}

/// Returns `Err(NotDivisible)` unless `divisor` divides `total` (and is positive).
pub fn expect_divides(what: &'static str, divisor: usize, total: usize) -> Result<(), ShapeError> {
    if divisor == 0 || !total.is_multiple_of(divisor) {
        Err(ShapeError::NotDivisible { what, divisor, total })
    } else {
        Ok(())
    }
}
