//! The single error type of the crate: every way that loading a tokenizer,
//! encoding, decoding or rendering a chat template can fail on bad input.

use std::path::PathBuf;

/// Everything that can go wrong in `specmesh-tokenizer`.
///
/// Messages are lowercase, name the metadata key / file / field involved and
/// say what is wrong with it, so they can be shown to an operator verbatim.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be opened or read.
    #[error("failed to read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The GGUF header or metadata section could not be parsed.
    #[error("{} is not a readable GGUF file ({message}): pass a .gguf file or a Hugging Face model directory", path.display())]
    GgufParse { path: PathBuf, message: String },

    /// A metadata key that the tokenizer needs is absent.
    #[error("gguf metadata key `{key}` is missing")]
    MissingKey { key: String },

    /// A metadata key holds a value of the wrong type.
    #[error("gguf metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    /// A metadata value has the right type but an impossible value.
    #[error("gguf metadata key `{key}` is invalid: {reason}")]
    InvalidValue { key: String, reason: String },

    /// `tokenizer.ggml.token_type` holds a value outside the known types.
    #[error(
        "gguf metadata key `tokenizer.ggml.token_type` has value {value} at index {index}, \
         expected 1 (normal), 2 (unknown), 3 (control), 4 (user-defined), 5 (unused) or 6 (byte)"
    )]
    InvalidTokenType { index: usize, value: i64 },

    /// A feature of the model's tokenizer that this crate does not implement.
    #[error("unsupported {key} `{value}`: {reason}")]
    Unsupported {
        key: String,
        value: String,
        reason: String,
    },

    /// A Hugging Face tokenizer file is malformed.
    #[error("invalid {}: {reason}", path.display())]
    InvalidHfFile { path: PathBuf, reason: String },

    /// The underlying `tokenizers` pipeline rejected the vocabulary.
    #[error("failed to build the tokenizer pipeline: {0}")]
    Build(String),

    /// The underlying `tokenizers` pipeline failed while encoding.
    #[error("failed to encode text: {0}")]
    Encode(String),

    /// A token id passed to decode is not in the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    UnknownTokenId { id: u32, vocab_size: usize },

    /// `encode_for_model` needs a BOS token but the model declares none.
    #[error("the model asks for a bos token (add_bos_token = true) but defines no bos token id")]
    MissingBos,

    /// The model ships no chat template.
    #[error("the model has no chat template ({origin})")]
    NoChatTemplate { origin: &'static str },

    /// The chat template failed to parse or render (including `raise_exception`).
    #[error("chat template failed to render: {0}")]
    Template(String),
}
