use mamba2_ssd::SsdError;
use mamba2_tensor::ShapeError;
use thiserror::Error;

use crate::ConfigError;

/// Everything that can go wrong building, running, loading or saving a model.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The config is inconsistent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An input or state has the wrong shape.
    #[error("{0}")]
    Shape(#[from] ShapeError),
    /// The scan rejected its inputs.
    #[error(transparent)]
    Ssd(#[from] SsdError),
    /// Output rows were asked of a sequence that does not have them
    /// ([`Mamba2Stack::forward_picked`](crate::Mamba2Stack::forward_picked)).
    #[error("{n} rows {every} apart, ending at the last: not rows of a sequence of {len} (at least one row, 1 or more apart)")]
    Picks {
        /// Rows asked per sequence.
        n: usize,
        /// Rows between them.
        every: usize,
        /// The sequence's length.
        len: usize,
    },
    /// The rows given lack what the model reads (values known ahead, say).
    #[error("{why}")]
    Input {
        /// What is missing, in a sentence.
        why: String,
    },
    /// A state was made for another batch size or config.
    #[error("state does not fit: {why}")]
    State {
        /// What does not fit.
        why: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// Weights could not be moved between backends ([`crate::transfer_weights`]).
    #[error("moving weights between backends: {why}")]
    Transfer {
        /// The recorder's message.
        why: String,
    },
    /// An HF `config.json` is not usable.
    #[error("HF config: {why}")]
    HfConfig {
        /// What is wrong.
        why: String,
    },
    /// A checkpoint file is not a readable safetensors file.
    #[error("{path}: not a valid safetensors file: {why}")]
    Safetensors {
        /// The file.
        path: String,
        /// The parser's message.
        why: String,
    },
    /// A tensor the model needs is absent from the checkpoint.
    #[error("checkpoint lacks tensor `{name}`")]
    MissingTensor {
        /// The checkpoint name.
        name: String,
    },
    /// The checkpoint has a tensor the model does not know.
    #[error("checkpoint has unexpected tensor `{name}`")]
    UnexpectedTensor {
        /// The checkpoint name.
        name: String,
    },
    /// A checkpoint tensor has the wrong shape.
    #[error("checkpoint tensor `{name}` has shape {got:?}, the config needs {expected:?}")]
    TensorShape {
        /// The checkpoint name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        got: Vec<usize>,
    },
    /// A checkpoint tensor has a type that cannot be read as floats.
    #[error("checkpoint tensor `{name}` has unsupported dtype {dtype}")]
    TensorDtype {
        /// The checkpoint name.
        name: String,
        /// The dtype in the file.
        dtype: String,
    },
    /// One of our own checkpoints is not readable.
    #[error("{path}: {why}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}
