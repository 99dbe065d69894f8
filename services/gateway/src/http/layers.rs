//! The HTTP front's tower layers (tower-http), outermost first:
//!
//! 1. **request id**: every request gets a new id in `x-request-id`,
//!    replacing one the caller sent (the id names the gateway's session
//!    and completion, so it must be unique and ours), and every answer
//!    carries it back;
//! 2. **trace**: a span per request (`http`: method, path, request id)
//!    continuing the caller's `traceparent`, in which the gateway's
//!    `request` span runs, and a log line per answer (status, latency);
//!    probes of `/health` at debug level, so they do not flood the log;
//! 3. **error shape**: what the layers below answer in plain text (a body
//!    too large, too slow, a panic) is rewritten into OpenAI's error object,
//!    so every error a client sees has one shape;
//! 4. **catch panic**: a handler that panics answers 500 and the listener
//!    serves on;
//! 5. **timeouts**: a whole request within the gateway's request timeout
//!    plus a margin (the gateway answers its own deadline first; this is the
//!    backstop), and its body within `--http-body-timeout-ms` (a client that
//!    stops sending holds a connection, not a task, for no longer);
//! 6. **body limit**: `--max-message-bytes`, as for gRPC, checked before the
//!    body is read whole.

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::PropagateRequestIdLayer;
use tower_http::set_header::SetRequestHeaderLayer;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::error::ApiError;
use crate::service::REQUEST_ID_HEADER;

/// What the layers enforce.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body (bytes).
    pub max_body_bytes: usize,
    /// The whole request's backstop: longer than the gateway's own
    /// request timeout, which answers first.
    pub backstop: Duration,
    /// Reading the request's body.
    pub body_timeout: Duration,
}

/// `router` inside the layers.
pub fn layered(router: Router, limits: Limits) -> Router {
    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);
    // `Router::layer` wraps what is there: the first call is innermost.
    // The limit layer bounds every body; axum's own 2 MB default would cut
    // below it.
    router
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(limits.max_body_bytes))
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            limits.backstop,
        ))
        .layer(CatchPanicLayer::custom(panicked))
        .layer(axum::middleware::map_response(openai_shape))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(span_for)
                .on_request(())
                .on_response(answered)
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestHeaderLayer::overriding(
            request_id,
            |_: &Request| HeaderValue::from_str(&crate::state::new_request_id()).ok(),
        ))
}

/// The request's span, continuing the caller's trace.
fn span_for(request: &Request) -> Span {
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (method, path) = (request.method().as_str(), request.uri().path());
    let span = if path == "/health" {
        tracing::debug_span!("http", method, path, request_id)
    } else {
        tracing::info_span!("http", method, path, request_id)
    };
    let metadata = tonic::metadata::MetadataMap::from_headers(request.headers().clone());
    specmesh_server::telemetry::adopt_metadata(&span, &metadata);
    span
}

/// One log line per answer (not for probes: their span is disabled).
fn answered(response: &Response, latency: Duration, span: &Span) {
    if !span.is_disabled() {
        tracing::info!(
            status = response.status().as_u16(),
            latency_ms = latency.as_secs_f64() * 1e3,
            "answered"
        );
    }
}

fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a handler of the HTTP front panicked; the request got a 500");
    ApiError::internal("the gateway failed on this request; it is logged, retry it").into_response()
}

/// A body that could not be read, as OpenAI's error: 408 when it stopped
/// arriving (the body timeout), 413 when it outgrew the limit, else 400.
pub fn unread_body(rejection: &axum::extract::rejection::BytesRejection) -> Response {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(e) = cause {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return ApiError::from_layer(StatusCode::REQUEST_TIMEOUT, "").into_response();
        }
        cause = e.source();
    }
    ApiError::from_layer(rejection.status(), &rejection.body_text()).into_response()
}

/// Errors the layers below answered in plain text (or empty), in OpenAI's
/// error shape; JSON answers pass untouched.
async fn openai_shape(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&text).trim().to_string();
    let mut shaped = ApiError::from_layer(status, &said).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            shaped.headers_mut().insert(name, value.clone());
        }
    }
    shaped
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::{get, post};
    use tower::ServiceExt as _;

    use super::*;

    async fn panics() -> &'static str {
        panic!("a bug")
    }

    fn app() -> Router {
        let router = Router::new()
            .route("/panic", get(panics))
            .route(
                "/echo",
                post(|body: axum::body::Bytes| async move { body.len().to_string() }),
            )
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    "late"
                }),
            );
        layered(
            router,
            Limits {
                max_body_bytes: 1024,
                backstop: Duration::from_millis(10),
                body_timeout: Duration::from_secs(1),
            },
        )
    }

    async fn call(request: Request) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
        let response = app().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (parts.status, parts.headers, json)
    }

    #[tokio::test]
    async fn a_panic_is_an_openai_500_and_the_router_serves_on() {
        let (status, headers, body) =
            call(Request::get("/panic").body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["type"], "server_error", "{body}");
        assert!(headers.contains_key(REQUEST_ID_HEADER));
        let (status, _, _) = call(Request::post("/echo").body(Body::from("abc")).unwrap()).await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_an_openai_413() {
        let (status, _, body) = call(
            Request::post("/echo")
                .body(Body::from(vec![b'x'; 2048]))
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(body["error"]["code"], "request_too_large", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("max-message-bytes"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn the_backstop_answers_504() {
        let (status, _, body) = call(Request::get("/slow").body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(body["error"]["code"], "timeout", "{body}");
    }

    #[tokio::test]
    async fn the_request_id_is_ours_and_comes_back() {
        let (_, headers, _) = call(
            Request::post("/echo")
                .header(REQUEST_ID_HEADER, "caller-chosen")
                .body(Body::from("abc"))
                .unwrap(),
        )
        .await;
        let id = headers[REQUEST_ID_HEADER].to_str().unwrap();
        assert_ne!(id, "caller-chosen");
        assert_eq!(id.len(), 36, "{id}");
    }
}
