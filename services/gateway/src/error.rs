//! The gateway's errors and their one mapping to gRPC statuses.
//!
//! Caller faults (bad input, overload, deadline) carry their full message;
//! server faults (a tokenizer failure, a verifier breaking the protocol)
//! reach the caller as a generic INTERNAL with the request id, while the
//! details go to the log (see `service.rs`).

use std::time::Duration;

use tonic::{Code, Status};

use crate::auth::AuthError;
use crate::quota::QuotaError;
use crate::validate::ValidationError;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The caller is not authenticated, or its key does not act for the
    /// tenant it named.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The tenant is over one of its quotas.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    #[error("the gateway is at its limit of {limit} concurrent requests; retry later")]
    Overloaded { limit: usize },
    #[error("the request did not finish within its deadline of {:.3}s", timeout.as_secs_f64())]
    DeadlineExceeded { timeout: Duration },
    /// No verifier could run (or keep running) the request.
    #[error("no verifier is available for the request ({attempts} attempted); retry later")]
    NoVerifier { attempts: u32 },
    /// The request needs what no verifier of this gateway serves (an older
    /// version that would ignore the field rather than refuse it).
    #[error(
        "no verifier serves {what}: the verifiers are older than this gateway; upgrade them, or \
         send the request without it"
    )]
    Unsupported { what: &'static str },
    /// A verifier refused the request for lack of capacity (KV memory,
    /// sessions); the caller may retry later.
    #[error("the verifier is out of capacity: {message}")]
    VerifierExhausted { message: String },
    /// A verifier refused the request as invalid (e.g. its own context
    /// limit is smaller than the gateway's).
    #[error("the verifier refused the request: {message}")]
    VerifierRejected { message: String },
    /// The request asks for speculation the deployment cannot do (a draft
    /// model the drafters lack, or one of another vocabulary than the
    /// target's); the message says which.
    #[error("{message}")]
    Precondition { message: String },
    /// A verifier failed in a way that moving elsewhere would not fix.
    #[error("the verifier failed with {code:?}: {message}")]
    VerifierFailed { code: Code, message: String },
    /// A verifier's events make no sense (e.g. a token outside the vocabulary).
    #[error("the verifier broke the session protocol: {0}")]
    Protocol(String),
    /// The gateway is shutting down: new requests go to another replica.
    #[error("the gateway is shutting down and takes no new requests: retry on another replica")]
    Draining,
    /// The gateway shut down before the request finished: its grace
    /// period for running requests ended.
    #[error(
        "the gateway shut down before the request finished (its grace period of {}s ended): retry",
        grace.as_secs()
    )]
    ShutDown { grace: Duration },
    /// The caller went away; nobody reads this.
    #[error("the client cancelled the request")]
    Cancelled,
}

impl GatewayError {
    /// The gRPC code the caller sees.
    pub fn code(&self) -> Code {
        match self {
            Self::Invalid(e) if e.is_internal() => Code::Internal,
            Self::Invalid(ValidationError::Tenant(e)) | Self::Auth(e) => e.code(),
            Self::Invalid(_) => Code::InvalidArgument,
            Self::Overloaded { .. } | Self::VerifierExhausted { .. } | Self::Quota(_) => {
                Code::ResourceExhausted
            }
            Self::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            Self::NoVerifier { .. } | Self::Draining | Self::ShutDown { .. } => Code::Unavailable,
            Self::Unsupported { .. } => Code::FailedPrecondition,
            Self::VerifierRejected { .. } => Code::InvalidArgument,
            Self::Precondition { .. } => Code::FailedPrecondition,
            Self::VerifierFailed { .. } | Self::Protocol(_) => Code::Internal,
            Self::Cancelled => Code::Cancelled,
        }
    }

    /// The request field at fault, as the gRPC API names it (see
    /// [`ValidationError::field`]).
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid(e) => e.field(),
            _ => None,
        }
    }

    /// Whether the error is the gateway's shutdown.
    pub fn is_shutdown(&self) -> bool {
        matches!(self, Self::Draining | Self::ShutDown { .. })
    }

    /// Seconds after which a refused request may succeed: the quota's
    /// estimate, or soon for a gateway at its concurrency limit.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Quota(q) => Some(q.retry_after_secs()),
            Self::Overloaded { .. } | Self::VerifierExhausted { .. } => Some(1),
            _ => None,
        }
    }

    /// The message the caller sees: a server fault's detail stays in the
    /// logs, the caller gets the request id to find it.
    pub fn public_message(&self, request_id: &str) -> String {
        if self.is_internal() {
            format!("internal error (request id {request_id})")
        } else {
            self.to_string()
        }
    }

    /// Whether the fault is on the server side (logged as an error, and
    /// hidden from the caller behind a generic message).
    pub fn is_internal(&self) -> bool {
        self.code() == Code::Internal
    }

    /// The status for a caller, naming `request_id` so the logs can be found.
    pub fn to_status(&self, request_id: &str) -> Status {
        let code = self.code();
        let mut status = Status::new(code, self.public_message(request_id));
        if let Self::Quota(q) = self {
            // Trailers, as HTTP's Retry-After: whole seconds.
            status
                .metadata_mut()
                .insert("retry-after", q.retry_after_secs().into());
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_faults_keep_their_message_and_server_faults_hide_it() {
        let s = GatewayError::Invalid(ValidationError::EmptyPrompt).to_status("r1");
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "`prompt` must not be empty")
        );
        let s = GatewayError::Overloaded { limit: 3 }.to_status("r1");
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "the gateway is at its limit of 3 concurrent requests; retry later"
        );
        let s = GatewayError::Protocol("token 99999 outside the vocabulary".into()).to_status("r1");
        assert_eq!(
            (s.code(), s.message()),
            (Code::Internal, "internal error (request id r1)")
        );
        let s =
            GatewayError::Invalid(ValidationError::WorkerFailed("panic".into())).to_status("r2");
        assert_eq!(s.code(), Code::Internal);
        let s = GatewayError::DeadlineExceeded {
            timeout: Duration::from_millis(1500),
        }
        .to_status("r");
        assert_eq!(s.code(), Code::DeadlineExceeded);
        assert_eq!(
            s.message(),
            "the request did not finish within its deadline of 1.500s"
        );
        assert_eq!(
            GatewayError::NoVerifier { attempts: 3 }
                .to_status("r")
                .code(),
            Code::Unavailable
        );
    }
}
