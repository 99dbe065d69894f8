//! Errors in OpenAI's shape (`{"error": {"message", "type", "param",
//! "code"}}`) with the HTTP status a client of OpenAI's API expects; the
//! gRPC status of the shared service maps here, once.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tonic::Code;

use super::openai::BadRequest;

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

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> ApiError {
        let (status, kind) = match s.code() {
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
        let retry_after = s
            .metadata()
            .get("retry-after")
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
            .or_else(|| {
                // Overload without a quota's own estimate: soon.
                (s.code() == Code::ResourceExhausted).then(|| HeaderValue::from_static("1"))
            });
        ApiError {
            retry_after,
            ..ApiError::new(status, kind, s.message())
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
    fn statuses_map_to_openais_and_keep_retry_after() {
        let mut s = tonic::Status::resource_exhausted("tenant over quota");
        s.metadata_mut().insert("retry-after", "7".parse().unwrap());
        let e = ApiError::from(s);
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        for (code, http) in [
            (Code::InvalidArgument, 400),
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Internal, 500),
        ] {
            let e = ApiError::from(tonic::Status::new(code, "m"));
            assert_eq!(e.status.as_u16(), http, "{code:?}");
            assert_eq!(e.body()["error"]["message"], "m");
        }
        let e = ApiError::unknown_model("gpt-4", "smollm2-135m");
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
    }
}
