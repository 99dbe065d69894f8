//! The gRPC front: `specmesh.v1.Generation` over [`State`]. `Generate`
//! answers once with the whole output, `GenerateStream` with a chunk per
//! delta and a last chunk carrying the finish reason and statistics; both
//! begin, admit and generate through the state like the HTTP front, and
//! render its errors as statuses here, once, naming the request id.

use std::sync::Arc;

use specmesh_proto::v1::generation_server::Generation;
use specmesh_proto::v1::{GenerateChunk, GenerateRequest, GenerateResponse};
use specmesh_server::Security;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use crate::auth::{Caller, Callers};
use crate::config::{Config, ConfigError};
use crate::error::GatewayError;
use crate::model::ModelMeta;
use crate::state::{Event, Generated, State};
use crate::stream::{RequestContext, Summary};
use crate::validate::Limits;

/// Response metadata naming the request in the gateway's logs.
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// Chunks buffered towards a slow streaming client.
const STREAM_BUFFER: usize = 16;

/// The Generation service; cheap to clone.
#[derive(Debug, Clone)]
pub struct GenerationService {
    state: Arc<State>,
}

impl GenerationService {
    /// The service over a new [`State`] (see [`State::new`]).
    pub fn new(
        config: &Config,
        model: ModelMeta,
        security: Security,
        callers: Callers,
    ) -> Result<Self, ConfigError> {
        Ok(GenerationService {
            state: Arc::new(State::new(config, model, security, callers)?),
        })
    }

    /// The state every front shares.
    pub(crate) fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Registers the gateway's metrics with `registry` (`--metrics-listen`).
    pub fn register_metrics(&self, registry: &prometheus::Registry) {
        self.state.register_metrics(registry);
    }

    /// The limits requests are validated against (the effective context).
    pub fn limits(&self) -> Limits {
        self.state.limits()
    }

    /// Requests holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight()
    }

    /// The layer that authenticates calls before their message is decoded.
    pub fn authenticator(&self) -> Authenticate {
        Authenticate(Arc::clone(&self.state))
    }

    /// The caller [`Authenticate`] found (served without the layer, as
    /// when embedded: authenticated here).
    fn caller(
        &self,
        extensions: &tonic::Extensions,
        metadata: &MetadataMap,
        ctx: &RequestContext,
    ) -> Result<Caller, Status> {
        match extensions.get::<Caller>() {
            Some(caller) => Ok(caller.clone()),
            None => self
                .state
                .authenticate(metadata, Some(&ctx.request_id))
                .map_err(|r| status(&r.error, ctx)),
        }
    }
}

/// Authenticates a call from its metadata before its message is decoded
/// (an interceptor runs on the headers alone), so a caller without a valid
/// key costs no decoding of up to `--max-message-bytes`; the handler finds
/// the caller in the request's extensions.
#[derive(Debug, Clone)]
pub struct Authenticate(Arc<State>);

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let caller = self.0.authenticate(request.metadata(), None).map_err(|r| {
            let mut status = r.error.to_status(&r.request_id);
            if let Ok(v) = MetadataValue::try_from(r.request_id.as_str()) {
                status.metadata_mut().insert(REQUEST_ID_HEADER, v);
            }
            status
        })?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

#[tonic::async_trait]
impl Generation for GenerationService {
    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<GenerateResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        let (ctx, span) = self.state.begin("Generate", &metadata);
        let caller = self.caller(&extensions, &metadata, &ctx)?;
        let admitted = self
            .state
            .admit(&caller, request, &ctx, &span)
            .await
            .map_err(|e| status(&e, &ctx))?;
        match self.state.generate(admitted, ctx.clone(), span).await {
            Ok(generated) => {
                let mut response = Response::new(response(generated, &ctx));
                tag(response.metadata_mut(), &ctx);
                Ok(response)
            }
            Err(e) => Err(status(&e, &ctx)),
        }
    }

    type GenerateStreamStream = ReceiverStream<Result<GenerateChunk, Status>>;

    async fn generate_stream(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        let (ctx, span) = self.state.begin("GenerateStream", &metadata);
        let caller = self.caller(&extensions, &metadata, &ctx)?;
        let admitted = self
            .state
            .admit(&caller, request, &ctx, &span)
            .await
            .map_err(|e| status(&e, &ctx))?;
        let mut events = self.state.generate_stream(admitted, ctx.clone(), span);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let task_ctx = ctx.clone();
        // Forwards events as chunks; a client that goes away closes `tx`,
        // which drops `events` and so cancels the generation.
        tokio::spawn(async move {
            let mut sent = 0u32;
            loop {
                let event = tokio::select! {
                    () = tx.closed() => return,
                    event = events.recv() => event,
                };
                let Some(event) = event else { return };
                let (chunk, last) = match event {
                    Ok(Event::Delta(delta)) => {
                        let offset = sent;
                        sent = sent.saturating_add(delta.token_ids.len() as u32);
                        let chunk = GenerateChunk {
                            text: delta.text,
                            token_ids: delta.token_ids,
                            logprobs: delta.logprobs,
                            tool_calls: delta.tool_calls,
                            token_offset: offset,
                            ..Default::default()
                        };
                        (Ok(chunk), false)
                    }
                    Ok(Event::Done(summary)) => (Ok(last_chunk(summary, sent)), true),
                    Err(e) => (Err(status(&e, &task_ctx)), true),
                };
                if tx.send(chunk).await.is_err() || last {
                    return;
                }
            }
        });
        let mut response = Response::new(ReceiverStream::new(rx));
        tag(response.metadata_mut(), &ctx);
        Ok(response)
    }
}

/// The whole answer of `Generate`.
fn response(generated: Generated, ctx: &RequestContext) -> GenerateResponse {
    let Generated {
        text,
        token_ids,
        logprobs,
        tool_calls,
        summary,
    } = generated;
    let total = ctx.arrived.elapsed().as_secs_f64();
    GenerateResponse {
        text,
        token_ids,
        finish_reason: summary.finish_reason.into(),
        usage: Some(summary.usage),
        speculation: Some(summary.speculation),
        // No token at all (EOS first): the answer was complete at the end.
        time_to_first_token_seconds: summary
            .time_to_first_token
            .map_or(total, |t| t.as_secs_f64()),
        total_seconds: total,
        logprobs,
        tool_calls,
    }
}

/// The last chunk: the final output with the finish reason and statistics,
/// after `offset` token ids sent in earlier chunks.
fn last_chunk(summary: Summary, offset: u32) -> GenerateChunk {
    GenerateChunk {
        text: summary.last.text,
        token_ids: summary.last.token_ids,
        finish_reason: summary.finish_reason.into(),
        usage: Some(summary.usage),
        speculation: Some(summary.speculation),
        token_offset: offset,
        logprobs: summary.last.logprobs,
        tool_calls: summary.last.tool_calls,
    }
}

/// The error as the caller's status, tagged with the request id.
fn status(err: &GatewayError, ctx: &RequestContext) -> Status {
    let mut status = err.to_status(&ctx.request_id);
    tag(status.metadata_mut(), ctx);
    status
}

/// Adds the request id to response metadata.
fn tag(metadata: &mut MetadataMap, ctx: &RequestContext) {
    if let Ok(v) = MetadataValue::try_from(ctx.request_id.as_str()) {
        metadata.insert(REQUEST_ID_HEADER, v);
    }
}

#[cfg(test)]
mod tests;
