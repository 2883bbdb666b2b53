use mamba2_tensor::ShapeError;
use thiserror::Error;

/// The scan was called with inputs that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SsdError {
    /// A shape or size is wrong; the inner error names the tensor and both shapes.
    #[error("invalid SSD input: {0}")]
    Shape(#[from] ShapeError),
}
