//! The OpenAI-compatible HTTP front (`--http-listen`): `POST
//! /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET
//! /health`, on axum in the gateway's runtime.
//!
//! Each request becomes a `GenerateRequest` ([`openai`]) and goes through
//! the very `Generation` service the gRPC API serves (its `authorization`
//! header carried as metadata), so validation, API keys, quotas, limits,
//! placement and recovery are the same code, not a copy. gRPC statuses map
//! to HTTP statuses and OpenAI's error shape once, in [`error`]. Streaming
//! answers are server-sent events in OpenAI's chunk format ending with
//! `data: [DONE]`; a client that goes away drops the stream, which cancels
//! the session on its verifier and frees its KV as for a gRPC caller.

mod error;
mod listener;
pub mod openai;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_server::Generation;
use tokio_stream::{Stream, StreamExt};

use crate::service::GenerationService;
use error::ApiError;
use openai::{ChatRequest, CompletionRequest};

/// What the handlers share.
#[derive(Clone)]
struct Front {
    service: GenerationService,
    /// The served model's id, as `/v1/models` lists it and requests name it.
    model: Arc<str>,
}

/// The routes, over `service`, serving the model `model`.
pub fn router(service: GenerationService, model: &str) -> Router {
    let front = Front {
        service,
        model: Arc::from(model),
    };
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .fallback(|| async { ApiError::not_found("no such endpoint").into_response() })
        .with_state(front)
}

/// The model id: a catalog name as given, a file or directory by its name.
pub fn model_id(model: &std::path::Path) -> String {
    model.file_name().map_or_else(
        || model.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Binds `addr` and serves `router` in the background (over TLS when
/// `security` has it) for as long as the returned task runs; prints
/// `specmesh-gateway http on URL` for launchers.
pub async fn serve(
    addr: std::net::SocketAddr,
    router: Router,
    security: &specmesh_server::Security,
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
            ),
            "https",
        ),
        specmesh_server::Security::Plaintext => (spawn(listener, router), "http"),
    };
    let url = format!("{scheme}://{bound}");
    tracing::info!(%url, "serving the OpenAI-compatible HTTP API");
    specmesh_server::tell_launcher(&format!("specmesh-gateway http on {url}"));
    Ok(task)
}

fn spawn<L>(listener: L, router: Router) -> tokio::task::JoinHandle<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "the HTTP listener failed");
        }
    })
}

async fn health() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

async fn models(State(front): State<Front>) -> impl IntoResponse {
    axum::Json(json!({
        "object": "list",
        "data": [{"id": &*front.model, "object": "model", "created": 0, "owned_by": "specmesh"}],
    }))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What the handlers need of either request: the gRPC request and the
/// shared parameters.
trait OpenAiRequest: serde::de::DeserializeOwned {
    fn common(&self) -> &openai::Common;
    fn to_wire(&self) -> Result<v1::GenerateRequest, openai::BadRequest>;
}

impl OpenAiRequest for ChatRequest {
    fn common(&self) -> &openai::Common {
        &self.common
    }
    fn to_wire(&self) -> Result<v1::GenerateRequest, openai::BadRequest> {
        ChatRequest::to_wire(self)
    }
}

impl OpenAiRequest for CompletionRequest {
    fn common(&self) -> &openai::Common {
        &self.common
    }
    fn to_wire(&self) -> Result<v1::GenerateRequest, openai::BadRequest> {
        CompletionRequest::to_wire(self)
    }
}

/// A request ready for the service, and how to answer it.
struct Prepared {
    call: tonic::Request<v1::GenerateRequest>,
    stream: bool,
    include_usage: bool,
}

/// The request as gRPC: the body parsed, the model checked, the caller's
/// credentials carried over.
fn prepare<T: OpenAiRequest>(
    front: &Front,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Prepared, Box<ApiError>> {
    let parsed: T = serde_json::from_slice(body).map_err(|e| Box::new(ApiError::bad_json(&e)))?;
    let request = parsed.to_wire().map_err(|e| Box::new(ApiError::from(e)))?;
    let common = parsed.common();
    if common.model != *front.model {
        return Err(Box::new(ApiError::unknown_model(
            &common.model,
            &front.model,
        )));
    }
    let mut call = tonic::Request::new(request);
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        call.metadata_mut().insert("authorization", v);
    }
    Ok(Prepared {
        call,
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
    })
}

async fn chat(State(front): State<Front>, headers: HeaderMap, body: Bytes) -> Response {
    let prepared = prepare::<ChatRequest>(&front, &headers, &body);
    respond(front, prepared, Kind::Chat).await
}

async fn completions(State(front): State<Front>, headers: HeaderMap, body: Bytes) -> Response {
    let prepared = prepare::<CompletionRequest>(&front, &headers, &body);
    respond(front, prepared, Kind::Completion).await
}

#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn id(self, request_id: &str) -> String {
        match self {
            Kind::Chat => format!("chatcmpl-{request_id}"),
            Kind::Completion => format!("cmpl-{request_id}"),
        }
    }

    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// One choice carrying `text`.
    fn choice(self, stream: bool, text: &str, finish: Option<&str>) -> Value {
        match (self, stream) {
            (Kind::Chat, false) => json!({
                "index": 0, "message": {"role": "assistant", "content": text},
                "finish_reason": finish, "logprobs": null,
            }),
            (Kind::Chat, true) => json!({
                "index": 0, "delta": {"content": text}, "finish_reason": finish, "logprobs": null,
            }),
            (Kind::Completion, _) => json!({
                "index": 0, "text": text, "finish_reason": finish, "logprobs": null,
            }),
        }
    }
}

fn request_id(metadata: &tonic::metadata::MetadataMap) -> String {
    metadata
        .get(crate::service::REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown")
        .to_owned()
}

async fn respond(front: Front, prepared: Result<Prepared, Box<ApiError>>, kind: Kind) -> Response {
    let Prepared {
        call: request,
        stream,
        include_usage,
    } = match prepared {
        Ok(p) => p,
        Err(e) => return (*e).into_response(),
    };
    let model = front.model.to_string();
    if !stream {
        return match front.service.generate(request).await {
            Ok(response) => {
                let id = kind.id(&request_id(response.metadata()));
                let r = response.into_inner();
                let finish = openai::finish_reason(r.finish_reason);
                axum::Json(json!({
                    "id": id,
                    "object": kind.object(false),
                    "created": now(),
                    "model": model,
                    "choices": [kind.choice(false, &r.text, finish)],
                    "usage": openai::Usage::from(r.usage.unwrap_or_default()),
                    "specmesh": openai::Speculation::from(r.speculation.unwrap_or_default()),
                }))
                .into_response()
            }
            Err(status) => ApiError::from(status).into_response(),
        };
    }
    match front.service.generate_stream(request).await {
        Ok(response) => {
            let id = kind.id(&request_id(response.metadata()));
            let chunks = response.into_inner();
            let events = sse(chunks, kind, id, model, include_usage);
            Sse::new(events)
                .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
                .into_response()
        }
        Err(status) => ApiError::from(status).into_response(),
    }
}

/// The chunks as OpenAI's events: a role delta first (chat), a delta per
/// chunk, the finish reason, the usage when asked, then `[DONE]`; an error
/// mid-stream is an event holding OpenAI's error object (the SDKs raise
/// it). A task forwards them; when the client goes away its channel closes,
/// the task ends and drops the gRPC stream, which cancels the session.
fn sse(
    mut chunks: impl Stream<Item = Result<v1::GenerateChunk, tonic::Status>> + Send + Unpin + 'static,
    kind: Kind,
    id: String,
    model: String,
    include_usage: bool,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let created = now();
    let frame = move |choices: Vec<Value>, usage: Option<openai::Usage>, extra: Option<Value>| {
        let mut v = json!({
            "id": id, "object": kind.object(true), "created": created, "model": model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        if let Some(s) = extra {
            v["specmesh"] = s;
        }
        Event::default().data(v.to_string())
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(16);
    tokio::spawn(async move {
        let send = |e: Event| tx.send(Ok(e));
        if matches!(kind, Kind::Chat) {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": null, "logprobs": null});
            if send(frame(vec![role], None, None)).await.is_err() {
                return;
            }
        }
        while let Some(chunk) = chunks.next().await {
            let c = match chunk {
                Ok(c) => c,
                Err(status) => {
                    let _ = send(Event::default().data(ApiError::from(status).body().to_string()))
                        .await;
                    return;
                }
            };
            let finish = openai::finish_reason(c.finish_reason);
            if !c.text.is_empty() || finish.is_some() {
                let extra = finish
                    .and(c.speculation)
                    .map(|s| json!(openai::Speculation::from(s)));
                if send(frame(vec![kind.choice(true, &c.text, finish)], None, extra))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if finish.is_some() && include_usage {
                let usage = Some(c.usage.unwrap_or_default().into());
                if send(frame(Vec::new(), usage, None)).await.is_err() {
                    return;
                }
            }
        }
        let _ = send(Event::default().data("[DONE]")).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
