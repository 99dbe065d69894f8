//! `POST /v1/chat/completions` and `POST /v1/completions`: the body
//! parsed into the gRPC API's request, admitted and run on the shared
//! [`State`](crate::state::State), and answered in OpenAI's shapes, whole
//! or as server-sent events.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use specmesh_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::metadata::MetadataMap;

use super::error::ApiError;
use super::openai::{self, ChatRequest, CompletionRequest};
use super::{Front, layers};
use crate::auth::Caller;
use crate::error::GatewayError;
use crate::service::REQUEST_ID_HEADER;
use crate::state::Event;

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

/// A request ready for the gateway, and how to answer it.
struct Prepared {
    request: v1::GenerateRequest,
    /// The caller's headers: its key, its trace context.
    metadata: MetadataMap,
    stream: bool,
    include_usage: bool,
}

/// The request as the gRPC API's: the body parsed, the model checked.
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
    Ok(Prepared {
        request,
        metadata: MetadataMap::from_headers(headers.clone()),
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
    })
}

pub(super) async fn chat(
    State(front): State<Front>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle::<ChatRequest>(front, &caller, &headers, body, Kind::Chat).await
}

pub(super) async fn completions(
    State(front): State<Front>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle::<CompletionRequest>(front, &caller, &headers, body, Kind::Completion).await
}

/// A request of either kind: its body read (or why not), parsed, answered.
async fn handle<T: OpenAiRequest>(
    front: Front,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return layers::unread_body(&r),
    };
    let prepared = prepare::<T>(&front, headers, &body);
    respond(front, caller, prepared, kind).await
}

#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Completion,
}

impl Kind {
    /// The request's name in its span.
    fn rpc(self) -> &'static str {
        match self {
            Kind::Chat => "ChatCompletions",
            Kind::Completion => "Completions",
        }
    }

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

    /// One choice carrying `text` (and its tokens' `logprobs`).
    fn choice(self, stream: bool, text: &str, finish: Option<&str>, logprobs: Value) -> Value {
        match (self, stream) {
            (Kind::Chat, false) => json!({
                "index": 0, "message": {"role": "assistant", "content": text},
                "finish_reason": finish, "logprobs": logprobs,
            }),
            (Kind::Chat, true) => json!({
                "index": 0, "delta": {"content": text}, "finish_reason": finish,
                "logprobs": logprobs,
            }),
            (Kind::Completion, _) => json!({
                "index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs,
            }),
        }
    }

    fn is_chat(self) -> bool {
        matches!(self, Kind::Chat)
    }

    /// The gateway's error in OpenAI's shape.
    fn error(self, e: &GatewayError, request_id: &str) -> ApiError {
        ApiError::from_gateway(e, request_id, matches!(self, Kind::Chat))
    }
}

async fn respond(
    front: Front,
    caller: &Caller,
    prepared: Result<Prepared, Box<ApiError>>,
    kind: Kind,
) -> Response {
    let Prepared {
        request,
        metadata,
        stream,
        include_usage,
    } = match prepared {
        Ok(p) => p,
        Err(e) => return (*e).into_response(),
    };
    let logprobs = request.logprobs;
    let state = &front.state;
    let id = metadata
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or_else(crate::state::new_request_id, str::to_owned);
    let (ctx, span) = state.begin_http(kind.rpc(), &metadata, id);
    let request_id = ctx.request_id.clone();
    let admitted = match state.admit(caller, request, &ctx, &span).await {
        Ok(a) => a,
        Err(e) => return kind.error(&e, &request_id).into_response(),
    };
    let model = front.model.to_string();
    if stream {
        let events = state.generate_stream(admitted, ctx, span);
        let events = sse(
            events,
            kind,
            request_id.clone(),
            model,
            include_usage,
            logprobs,
        );
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response()
    } else {
        match state.generate(admitted, ctx, span).await {
            Ok(g) => {
                let finish = openai::finish_reason(g.summary.finish_reason.into());
                let lp = openai::choice_logprobs(&g.logprobs, kind.is_chat(), logprobs, 0);
                let mut choice = kind.choice(false, &g.text, finish, lp);
                if !g.tool_calls.is_empty() {
                    let message = &mut choice["message"];
                    message["tool_calls"] = openai::tools::message_calls(&g.tool_calls);
                    if g.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                axum::Json(json!({
                    "id": kind.id(&request_id),
                    "object": kind.object(false),
                    "created": now(),
                    "model": model,
                    "choices": [choice],
                    "usage": openai::Usage::from(g.summary.usage),
                    "metrics": openai::vllm_metrics(&g.summary.speculation),
                    "specmesh": openai::Speculation::from(&g.summary.speculation),
                }))
                .into_response()
            }
            Err(e) => kind.error(&e, &request_id).into_response(),
        }
    }
}

/// The events as OpenAI's: a role delta first (chat), a delta per
/// delta, the finish reason, the usage when asked, then `[DONE]`; an error
/// mid-stream is an event holding OpenAI's error object (the SDKs raise
/// it). A task forwards them; when the client goes away its channel closes,
/// the task ends and drops `events`, which cancels the generation.
fn sse(
    mut events: mpsc::Receiver<Result<Event, GatewayError>>,
    kind: Kind,
    request_id: String,
    model: String,
    include_usage: bool,
    logprobs: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let created = now();
    let id = kind.id(&request_id);
    let frame = move |choices: Vec<Value>,
                      usage: Option<openai::Usage>,
                      spec: Option<&v1::SpeculationStats>| {
        let mut v = json!({
            "id": id, "object": kind.object(true), "created": created, "model": model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        if let Some(s) = spec {
            v["specmesh"] = json!(openai::Speculation::from(s));
            v["metrics"] = openai::vllm_metrics(s);
        }
        SseEvent::default().data(v.to_string())
    };
    let (tx, rx) = mpsc::channel::<Result<SseEvent, Infallible>>(16);
    tokio::spawn(async move {
        let send = |e: SseEvent| tx.send(Ok(e));
        if matches!(kind, Kind::Chat) {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": null, "logprobs": null});
            if send(frame(vec![role], None, None)).await.is_err() {
                return;
            }
        }
        // Text sent so far: the legacy logprobs' `text_offset`.
        let mut sent = 0;
        // Tool calls sent so far: the next one's `index`.
        let mut calls = 0;
        let call_frames = |d: &crate::output::Delta, calls: &mut usize| {
            let deltas = openai::tools::call_deltas(&d.tool_calls, *calls);
            *calls += d.tool_calls.len();
            deltas
                .into_iter()
                .map(|delta| {
                    let choice = json!({"index": 0, "delta": delta, "finish_reason": null,
                                        "logprobs": null});
                    frame(vec![choice], None, None)
                })
                .collect::<Vec<_>>()
        };
        while let Some(event) = events.recv().await {
            let frames = match event {
                Ok(Event::Delta(d))
                    if d.text.is_empty() && d.logprobs.is_empty() && d.tool_calls.is_empty() =>
                {
                    continue;
                }
                Ok(Event::Delta(d)) => {
                    let mut frames = Vec::new();
                    if !d.text.is_empty() || !d.logprobs.is_empty() {
                        let lp =
                            openai::choice_logprobs(&d.logprobs, kind.is_chat(), logprobs, sent);
                        sent += d.text.len();
                        frames.push(frame(
                            vec![kind.choice(true, &d.text, None, lp)],
                            None,
                            None,
                        ));
                    }
                    frames.extend(call_frames(&d, &mut calls));
                    frames
                }
                Ok(Event::Done(summary)) => {
                    let finish = openai::finish_reason(summary.finish_reason.into());
                    let lp = openai::choice_logprobs(
                        &summary.last.logprobs,
                        kind.is_chat(),
                        logprobs,
                        sent,
                    );
                    let spec = summary.speculation;
                    // The statistics ride one frame, as vLLM's do: the usage
                    // chunk when asked, else the last one (clients such as
                    // AIPerf drop a request whose stats come twice).
                    let on_finish = (!include_usage).then_some(&spec);
                    let mut frames = Vec::new();
                    if summary.last.tool_calls.is_empty() {
                        frames.push(frame(
                            vec![kind.choice(true, &summary.last.text, finish, lp)],
                            None,
                            on_finish,
                        ));
                    } else {
                        // Text, then the calls, then the finish reason.
                        if !summary.last.text.is_empty() || !summary.last.logprobs.is_empty() {
                            frames.push(frame(
                                vec![kind.choice(true, &summary.last.text, None, lp)],
                                None,
                                None,
                            ));
                        }
                        frames.extend(call_frames(&summary.last, &mut calls));
                        frames.push(frame(
                            vec![json!({"index": 0, "delta": {}, "finish_reason": finish,
                                        "logprobs": null})],
                            None,
                            on_finish,
                        ));
                    }
                    if include_usage {
                        frames.push(frame(Vec::new(), Some(summary.usage.into()), Some(&spec)));
                    }
                    frames.push(SseEvent::default().data("[DONE]"));
                    frames
                }
                Err(e) => {
                    vec![SseEvent::default().data(kind.error(&e, &request_id).body().to_string())]
                }
            };
            for f in frames {
                if send(f).await.is_err() {
                    return;
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
