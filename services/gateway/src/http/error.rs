//! Errors in OpenAI's shape (`{"error": {"message", "type", "param",
//! "code"}}`) with the HTTP status a client of OpenAI's API expects; the
//! gateway's errors map here, once, straight from [`GatewayError`].

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tonic::Code;

use super::openai::BadRequest;
use crate::error::GatewayError;

#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    message: String,
    param: Option<String>,
    retry_after: Option<HeaderValue>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            code: None,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    pub fn not_found(message: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn bad_json(e: &serde_json::Error) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the body is not a valid request: {e}"),
        )
    }

    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{asked}` does not exist here; this server serves `{served}`"),
            )
        }
    }

    /// The gateway failed (a bug, logged).
    pub fn internal(message: &str) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// An error a tower layer of the HTTP front answered (`said`: its
    /// plain-text body, maybe empty), as OpenAI's.
    pub fn from_layer(status: StatusCode, said: &str) -> ApiError {
        let (kind, code, message) = match status {
            StatusCode::PAYLOAD_TOO_LARGE => (
                "invalid_request_error",
                Some("request_too_large"),
                "the request body is larger than the gateway accepts (`--max-message-bytes`)"
                    .to_string(),
            ),
            StatusCode::REQUEST_TIMEOUT => (
                "invalid_request_error",
                Some("timeout"),
                "the request body did not arrive in time (`--http-body-timeout-ms`)".to_string(),
            ),
            StatusCode::GATEWAY_TIMEOUT => (
                "server_error",
                Some("timeout"),
                "the request took longer than the gateway's request timeout".to_string(),
            ),
            s => {
                let kind = if s.is_server_error() {
                    "server_error"
                } else {
                    "invalid_request_error"
                };
                let message = if said.is_empty() {
                    s.canonical_reason().unwrap_or("error").to_string()
                } else {
                    said.to_string()
                };
                (kind, None, message)
            }
        };
        ApiError {
            code,
            ..ApiError::new(status, kind, message)
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": self.code,
        }})
    }
}

impl From<BadRequest> for ApiError {
    fn from(e: BadRequest) -> ApiError {
        ApiError {
            param: e.param,
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", e.message)
        }
    }
}

impl ApiError {
    /// A gateway error as OpenAI's: the HTTP status its code means, the
    /// parameter at fault by OpenAI's name (`chat`: the request was a chat
    /// completion), `Retry-After` when a retry may succeed.
    pub fn from_gateway(e: &GatewayError, request_id: &str, chat: bool) -> ApiError {
        let (status, kind) = match e.code() {
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "authentication_error"),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, "permission_error"),
            Code::NotFound => (StatusCode::NOT_FOUND, "invalid_request_error"),
            Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"),
            Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            Code::Cancelled => (
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
                "cancelled",
            ),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        if e.is_shutdown() {
            // OpenAI's shape for a replica going away: retry elsewhere.
            return ApiError {
                code: Some("draining"),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    e.public_message(request_id),
                )
            };
        }
        ApiError {
            param: e.field().and_then(|f| super::openai::param(f, chat)),
            retry_after: e.retry_after_secs().map(HeaderValue::from),
            ..ApiError::new(status, kind, e.public_message(request_id))
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(v) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_errors_map_to_openais_with_param_and_retry_after() {
        use crate::validate::ValidationError;
        let e = ApiError::from_gateway(&GatewayError::Overloaded { limit: 2 }, "r", true);
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let invalid = GatewayError::Invalid(ValidationError::MaxNewTokens { max: 8, got: 9 });
        let e = ApiError::from_gateway(&invalid, "r", true);
        assert_eq!(e.status.as_u16(), 400);
        assert_eq!(e.body()["error"]["param"], "max_tokens");
        assert_eq!(
            e.body()["error"]["message"],
            "`max_new_tokens` must be at most 8, got 9"
        );
        let e = ApiError::from_gateway(
            &GatewayError::Invalid(ValidationError::EmptyChat),
            "r",
            true,
        );
        assert_eq!(e.body()["error"]["param"], "messages");
        let e = ApiError::from_gateway(
            &GatewayError::Invalid(ValidationError::EmptyPrompt),
            "r",
            false,
        );
        assert_eq!(e.body()["error"]["param"], "prompt");
        for (err, http) in [
            (GatewayError::NoVerifier { attempts: 1 }, 503),
            (
                GatewayError::DeadlineExceeded {
                    timeout: std::time::Duration::from_secs(1),
                },
                504,
            ),
            (GatewayError::Protocol("bad".into()), 500),
        ] {
            let e = ApiError::from_gateway(&err, "r9", false);
            assert_eq!(e.status.as_u16(), http, "{err:?}");
            assert!(e.body()["error"]["param"].is_null());
        }
        let e = ApiError::from_gateway(&GatewayError::Protocol("bad".into()), "r9", false);
        assert_eq!(
            e.body()["error"]["message"],
            "internal error (request id r9)"
        );
        let e = ApiError::unknown_model("gpt-4", "smollm2-135m");
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
        for err in [
            GatewayError::Draining,
            GatewayError::ShutDown {
                grace: std::time::Duration::from_secs(2),
            },
        ] {
            let e = ApiError::from_gateway(&err, "r", true);
            assert_eq!(e.status.as_u16(), 503);
            assert_eq!(e.body()["error"]["type"], "server_error");
            assert_eq!(e.body()["error"]["code"], "draining");
        }
    }
}
