//! Errors of the model runtime. Messages name the file, key or bound involved
//! so the user knows what to fix.

use std::path::PathBuf;

use crate::block::BlockError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model file not found: {path}")]
    NotFound { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not a GGUF file ({reason}); pass a .gguf file or a Hugging Face model directory"
    )]
    NotGguf { path: PathBuf, reason: String },
    #[error("{path} is truncated: {what}; download it again")]
    Truncated { path: PathBuf, what: String },
    #[error("{path} is not a readable safetensors file ({reason})")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error(
        "no *.safetensors files in {dir}: pass a GGUF file or a Hugging Face model directory with its weights"
    )]
    NoWeights { dir: PathBuf },
    #[error("unsupported architecture `{arch}` in {path}: supported are {supported}")]
    UnsupportedArchitecture {
        path: PathBuf,
        arch: String,
        supported: &'static str,
    },
    #[error("{path}: missing or invalid metadata `{key}`: {reason}")]
    Metadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: cannot load tensor `{name}`: {reason}")]
    Tensor {
        path: PathBuf,
        name: String,
        reason: String,
    },
    #[error("invalid block: {0}")]
    Block(#[from] BlockError),
    #[error("token id {token} is out of range: the vocabulary has {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error(
        "context overflow: {len} committed + {new} new tokens exceed the model's context of {max} tokens"
    )]
    ContextOverflow { len: usize, new: usize, max: usize },
    #[error(
        "the sequence has {staged} uncommitted tokens: call commit() or discard() before the next forward"
    )]
    Uncommitted { staged: usize },
    #[error("invalid commit: {0}")]
    InvalidCommit(String),
    #[error("sequence was created for {seq} layers but this model runs {model}")]
    LayerMismatch { seq: usize, model: usize },
    #[error("invalid option: {0}")]
    InvalidOption(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// The first line of a candle error: with `RUST_BACKTRACE` set, candle
/// appends a backtrace to its message, which does not belong in a one-line
/// error for the user.
pub(crate) fn candle_reason(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}
