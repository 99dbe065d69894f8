//! Why a draft stream ended, classified once and rendered once as a
//! [`tonic::Status`].
//!
//! Messages of client mistakes name the message and field
//! (`start.tokens[3]`, `outcome.path[1]`) and the bound, because the
//! verifier's developers read them. Internal failures get a generic public
//! message; their detail goes to the session's span, never to the client.

use std::time::Duration;

use tonic::{Code, Status};

/// A failed draft stream.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    /// A field of `start` or `outcome` breaks the protocol.
    #[error("`{field}` {reason}")]
    Invalid { field: String, reason: String },
    /// The stream's first message was not a `start`.
    #[error("the first message must be `start`, got {got}")]
    ExpectedStart { got: &'static str },
    /// A second `start` arrived on a running stream.
    #[error("`start` may only be the first message of a stream")]
    RepeatedStart,
    /// The verifier opened a stream and sent nothing.
    #[error("no `start` within {0:?} of opening the stream")]
    StartTimeout(Duration),
    /// The verifier closed the stream before it started.
    #[error("the stream ended before `start`")]
    NoStart,
    /// The session asks for drafting this drafter cannot do (the draft
    /// model it has none of, or one whose vocabulary is not the target's).
    #[error("{0}")]
    Precondition(String),
    /// Every session slot is taken.
    #[error("the drafter serves at most {max} sessions at once; retry on another drafter")]
    Busy { max: usize },
    /// The process is stopping and the grace period is over.
    #[error("the drafter is shutting down")]
    ShuttingDown,
    /// A bug or a dead worker; the detail is logged, not sent.
    #[error("internal error: {0}")]
    Internal(String),
}

impl DrafterError {
    /// A protocol violation in `field`.
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> DrafterError {
        DrafterError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            DrafterError::Invalid { .. }
            | DrafterError::ExpectedStart { .. }
            | DrafterError::RepeatedStart
            | DrafterError::NoStart => Code::InvalidArgument,
            DrafterError::StartTimeout(_) => Code::DeadlineExceeded,
            DrafterError::Busy { .. } => Code::ResourceExhausted,
            DrafterError::Precondition(_) => Code::FailedPrecondition,
            DrafterError::ShuttingDown => Code::Unavailable,
            DrafterError::Internal(_) => Code::Internal,
        }
    }
}

impl From<specmesh_proto::FieldError> for DrafterError {
    fn from(e: specmesh_proto::FieldError) -> DrafterError {
        DrafterError::Invalid {
            field: e.field,
            reason: e.reason,
        }
    }
}

impl From<DrafterError> for Status {
    fn from(e: DrafterError) -> Status {
        match e {
            DrafterError::Internal(detail) => {
                tracing::error!(%detail, "draft stream failed");
                Status::internal("internal drafter error")
            }
            e => Status::new(e.code(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_carry_their_field_and_internal_ones_do_not_leak() {
        let s = Status::from(DrafterError::invalid(
            "start.vocab_size",
            "must be >= 1, got 0",
        ));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "`start.vocab_size` must be >= 1, got 0");
        let s = Status::from(DrafterError::Internal("worker panicked at x.rs:3".into()));
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("x.rs"));
        assert_eq!(
            Status::from(DrafterError::Busy { max: 2 }).code(),
            Code::ResourceExhausted
        );
    }
}
