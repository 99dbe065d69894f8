//! Why a run failed, classified once and rendered once as a
//! [`tonic::Status`].
//!
//! Messages of client mistakes name the field and the bound, because the
//! gateway's developers read them. Internal failures get a generic public
//! message; their detail goes to the session's span, never to the client.

use tonic::{Code, Status};

use specmesh_kvcache::Exhausted;

/// A failed run.
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    /// A field of the `RunRequest` breaks the protocol or this verifier's
    /// bounds (vocabulary, context).
    #[error(transparent)]
    Invalid(#[from] specmesh_proto::FieldError),
    /// The draft plan names a drafter outside this verifier's `--drafters`.
    #[error(
        "draft endpoint `{endpoint}` is not one of this verifier's drafters (`--drafters` {configured}): \
         the gateway's and the verifiers' drafter lists must name the same members"
    )]
    UnknownDrafter {
        endpoint: String,
        configured: String,
    },
    /// Every session slot is taken.
    #[error("the verifier runs its limit of {max} sessions; retry later or on another verifier")]
    Busy { max: usize },
    /// The KV budget cannot hold the run, even after evicting kept caches.
    #[error(transparent)]
    OutOfKv(#[from] Exhausted),
    /// The drafter cannot draft as the request asked; its message says why
    /// (e.g. "the draft model X cannot draft for the target Y").
    #[error("the drafter refused the session: {0}")]
    DrafterRefused(String),
    /// The caller cancelled or went away: nothing to send.
    #[error("the caller is gone")]
    CallerGone,
    /// The batching thread stopped (it panicked): nothing can be verified.
    #[error("the model batcher has stopped")]
    BatcherGone,
    /// The model refused a step or a prefill: a bug, since every input was
    /// validated; the detail is logged, not sent.
    #[error("model: {0}")]
    Model(String),
    /// Any other bug; the detail is logged, not sent.
    #[error("internal error: {0}")]
    Internal(String),
}

impl VerifierError {
    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            VerifierError::Invalid(_) | VerifierError::UnknownDrafter { .. } => {
                Code::InvalidArgument
            }
            VerifierError::Busy { .. } | VerifierError::OutOfKv(_) => Code::ResourceExhausted,
            VerifierError::DrafterRefused(_) => Code::FailedPrecondition,
            VerifierError::CallerGone => Code::Cancelled,
            VerifierError::BatcherGone => Code::Unavailable,
            VerifierError::Model(_) | VerifierError::Internal(_) => Code::Internal,
        }
    }

    /// An invalid field.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> VerifierError {
        VerifierError::Invalid(specmesh_proto::FieldError::new(field, reason))
    }
}

impl From<VerifierError> for Status {
    fn from(e: VerifierError) -> Status {
        match e {
            VerifierError::Model(detail) | VerifierError::Internal(detail) => {
                tracing::error!(%detail, "run failed");
                Status::internal("internal verifier error")
            }
            e => Status::new(e.code(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_say_what_to_fix_and_internal_ones_do_not_leak() {
        let s = Status::from(VerifierError::invalid(
            "tokens[3]",
            "is 9, outside the vocabulary of 9",
        ));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "`tokens[3]` is 9, outside the vocabulary of 9");
        let s = Status::from(VerifierError::Busy { max: 2 });
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("limit of 2 sessions"));
        let s = Status::from(VerifierError::Model("index out of range at x.rs:3".into()));
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("x.rs"));
        assert_eq!(
            Status::from(VerifierError::BatcherGone).code(),
            Code::Unavailable
        );
    }
}
