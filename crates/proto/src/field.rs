//! The error of a wire message that breaks the protocol, naming the field
//! as the sender wrote it (`start.tokens[3]`, `sampling.top_p`), and the
//! checks every message shares.

use crate::limits::MAX_ID_BYTES;

/// A field of a wire message that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {reason}")]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Refuses an id (`session_id`, `tenant`, `cache_key`) over
/// [`MAX_ID_BYTES`].
pub fn check_id(field: &str, value: &str) -> Result<(), FieldError> {
    if value.len() > MAX_ID_BYTES {
        return Err(FieldError::new(
            field,
            format!("must be at most {MAX_ID_BYTES} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// Refuses the first token of `tokens` at or above `vocab`.
pub fn check_tokens(field: &str, tokens: &[u32], vocab: u32) -> Result<(), FieldError> {
    match tokens.iter().position(|&t| t >= vocab) {
        Some(i) => Err(FieldError::new(
            format!("{field}[{i}]"),
            format!("is {}, outside the vocabulary of {vocab}", tokens[i]),
        )),
        None => Ok(()),
    }
}
