//! The OpenAI-compatible HTTP front (`--http-listen`): `POST
//! /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET
//! /health`, on axum in the gateway's runtime.
//!
//! Each request becomes a `GenerateRequest` ([`openai`]) and takes the
//! very path a gRPC request takes through the gateway's state (begin,
//! admit, generate: its headers carry the key and the trace context), so
//! validation, API keys, quotas, limits, placement and recovery are the
//! same code, not a copy. The gateway's errors map to HTTP statuses and
//! OpenAI's error shape once, in [`error`], with the parameter at fault.
//! Streaming answers are server-sent events in OpenAI's chunk format
//! ending with `data: [DONE]`; a client that goes away drops the stream,
//! which cancels the session on its verifier and frees its KV as for a
//! gRPC caller. Every answer names its request in `x-request-id`.

mod completions;
mod error;
mod layers;
mod listener;
pub mod openai;
mod tokens;

pub use layers::Limits;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tonic::metadata::MetadataMap;

use crate::service::{GenerationService, REQUEST_ID_HEADER};
use crate::state;
use error::ApiError;

/// What the handlers share.
#[derive(Clone)]
struct Front {
    state: Arc<state::State>,
    /// The served model's id, as `/v1/models` lists it and requests name it.
    model: Arc<str>,
}

/// The routes, over `service`, serving the model `model`, inside the
/// front's layers ([`layers`]).
pub fn router(service: GenerationService, model: &str, limits: Limits) -> Router {
    let front = Front {
        state: Arc::clone(service.state()),
        model: Arc::from(model),
    };
    // Every API route authenticates in a layer, before its body is read;
    // `/health` is for probes and tells nothing a probe may not know.
    let api = Router::new()
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(axum::middleware::from_fn_with_state(
            front.clone(),
            authenticate,
        ));
    let routes = Router::new()
        .merge(api)
        .route("/health", get(health))
        .fallback(|| async { ApiError::not_found("no such endpoint").into_response() })
        .with_state(front);
    layers::layered(routes, limits)
}

/// The id the front's layers gave the request.
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or_else(crate::state::new_request_id, str::to_owned)
}

/// Authenticates the caller from its `Authorization` header before the
/// handler reads the body: a caller without a valid key costs no parsing.
/// The handler finds the caller in the request's extensions.
async fn authenticate(
    State(front): State<Front>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut metadata = MetadataMap::new();
    if let Some(v) = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        metadata.insert("authorization", v);
    }
    let id = request_id(request.headers());
    match front.state.authenticate(&metadata, Some(&id)) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(r) => ApiError::from_gateway(&r.error, &r.request_id, false).into_response(),
    }
}

/// The model id: a catalog name as given, a file or directory by its name.
pub fn model_id(model: &std::path::Path) -> String {
    model.file_name().map_or_else(
        || model.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Binds `addr` and serves `router` in the background (over TLS when
/// `security` has it) until `shutdown` resolves, then stops accepting and
/// returns once its open requests have answered; prints `specmesh-gateway
/// http on URL` for launchers.
pub async fn serve(
    addr: std::net::SocketAddr,
    router: Router,
    security: &specmesh_server::Security,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the HTTP listener {addr} (`--http-listen`)"))?;
    let bound = listener.local_addr().context("reading the HTTP address")?;
    let (task, scheme) = match security {
        specmesh_server::Security::Tls(tls) => (
            spawn(
                listener::TlsListener::new(listener, Arc::clone(tls))?,
                router,
                shutdown,
            ),
            "https",
        ),
        specmesh_server::Security::Plaintext => (spawn(listener, router, shutdown), "http"),
    };
    let url = format!("{scheme}://{bound}");
    tracing::info!(%url, "serving the OpenAI-compatible HTTP API");
    specmesh_server::tell_launcher("specmesh-gateway", specmesh_server::Ready::Http, &url);
    Ok(task)
}

fn spawn<L>(
    listener: L,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the HTTP listener failed");
        }
    })
}

/// 200 while serving; 503 `draining` from the moment shutdown begins, so
/// a load balancer stops sending before the listener closes.
async fn health(State(front): State<Front>) -> Response {
    if front.state.is_draining() {
        let body = axum::Json(json!({"status": "draining"}));
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    axum::Json(json!({"status": "ok"})).into_response()
}

/// The served model, with vLLM's `root` and `max_model_len` (benchmark
/// clients size their prompts by it).
async fn models(State(front): State<Front>) -> impl IntoResponse {
    let max_model_len = front.state.validator().limits().max_context;
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": &*front.model, "object": "model", "created": 0, "owned_by": "specmesh",
            "root": &*front.model, "parent": null, "max_model_len": max_model_len,
        }],
    }))
}

/// A body of `T` for a route that names the model optionally.
fn parse_named<T: serde::de::DeserializeOwned>(
    front: &Front,
    body: &Bytes,
    model: impl Fn(&T) -> Option<&str>,
) -> Result<T, Box<ApiError>> {
    let parsed: T = serde_json::from_slice(body).map_err(|e| Box::new(ApiError::bad_json(&e)))?;
    match model(&parsed) {
        Some(m) if m != &*front.model => Err(Box::new(ApiError::unknown_model(m, &front.model))),
        _ => Ok(parsed),
    }
}

async fn tokenize(State(front): State<Front>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return layers::unread_body(&r),
    };
    let v = front.state.validator();
    parse_named(&front, &body, |r: &tokens::TokenizeRequest| {
        r.model.as_deref()
    })
    .and_then(|r| tokens::tokenize(v.tokenizer(), v.limits().max_context, r))
    .map_or_else(|e| e.into_response(), |j| axum::Json(j).into_response())
}

async fn detokenize(State(front): State<Front>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return layers::unread_body(&r),
    };
    let v = front.state.validator();
    parse_named(&front, &body, |r: &tokens::DetokenizeRequest| {
        r.model.as_deref()
    })
    .and_then(|r| tokens::detokenize(v.tokenizer(), r))
    .map_or_else(|e| e.into_response(), |j| axum::Json(j).into_response())
}
