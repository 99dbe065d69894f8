//! Why a model drafter could not be built. Messages say what to change.

/// Refused drafter configurations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DraftModelError {
    #[error(
        "the draft model has a vocabulary of {draft} tokens but the target's trees use {target}: \
         a draft model must share the target's tokenizer (use a smaller model of the same family, \
         or a layer-truncated self-draft of the target)"
    )]
    VocabSize { draft: usize, target: u32 },
    #[error("draft option `{field}` is {value}: {reason}")]
    BadOption {
        field: &'static str,
        value: usize,
        reason: &'static str,
    },
}
