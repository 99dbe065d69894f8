//! The `specmesh.v1.Generation` service: admission, deadlines, validation,
//! then the decode loop, with the result returned whole (`Generate`) or
//! streamed (`GenerateStream`).
//!
//! Admission is a semaphore with no queue: over the limit, a request is
//! refused at once with RESOURCE_EXHAUSTED, and a granted permit lives until
//! the response (or the stream) ends. The deadline is the shorter of the
//! caller's `grpc-timeout` and the configured default; past it the caller
//! gets DEADLINE_EXCEEDED and the verifier call is cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use specmesh_proto::v1::generation_server::Generation;
use specmesh_proto::v1::{
    FinishReason, GenerateChunk, GenerateRequest, GenerateResponse, SpeculationStats, Usage,
};
use specmesh_server::discovery::SourceError;
use specmesh_server::{AbortOnDrop, Dialer, Security};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span, error, field, info, info_span};

use crate::auth::{Caller, Callers};
use crate::config::{Config, ConfigError, DEFAULT_MAX_NEW_TOKENS};
use crate::decode::{ClientGone, DecodeLoop, DeltaSink, RequestContext, Summary};
use crate::error::GatewayError;
use crate::health::Role;
use crate::members::{ClientSettings, Members};
use crate::metrics::{GatewayMetrics, MemberMetrics};
use crate::model::ModelMeta;
use crate::output::Delta;
use crate::quota::{QuotaPermit, Quotas};
use crate::resolve::{self, Sources};
use crate::validation::{Limits, ValidGenerateRequest, Validator};

/// Chunks buffered between the decode loop and a slow streaming client;
/// beyond this the loop waits (and so does the verifier, through gRPC flow
/// control).
const STREAM_BUFFER: usize = 16;

/// Response metadata naming the request in the gateway's logs.
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// The Generation service; cheap to clone.
#[derive(Debug, Clone)]
pub struct GenerationService {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    validator: Validator,
    decode: DecodeLoop,
    limiter: Arc<Semaphore>,
    max_concurrent: usize,
    default_timeout: Duration,
    metrics: GatewayMetrics,
    /// The verifiers and drafters now (their health watches stop with it).
    members: Arc<Members>,
    /// Who may call (API keys), as which tenant.
    callers: Callers,
    /// Per-tenant limits.
    quotas: Arc<Quotas>,
    /// Re-resolves `dns:///` entries for as long as the service lives.
    _resolve: Option<AbortOnDrop>,
}

impl GenerationService {
    /// Builds the service: verifier channels connect lazily (the service
    /// kit's client channel, with HTTP/2 pings that notice a silently dead
    /// pod), so a verifier that is down at start only fails the requests
    /// placed on it, and a lost one's sessions move elsewhere.
    /// `security`: how it talks to its members (TLS or plaintext).
    /// `callers`: who may call, as which tenant (API keys).
    pub fn new(
        config: &Config,
        model: ModelMeta,
        security: Security,
        callers: Callers,
    ) -> Result<Self, ConfigError> {
        // `Config::try_from` checks this range; a hand-built Config is
        // clamped rather than allowed to panic the semaphore.
        let max_concurrent = config
            .max_concurrent_requests
            .clamp(1, Semaphore::MAX_PERMITS);
        let max_context = match config.max_context {
            Some(cap) => cap.min(model.max_context),
            None => model.max_context,
        };
        let limits = Limits {
            max_context,
            max_new_tokens: config.max_new_tokens,
            default_max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
            max_draft_tokens: config.max_draft_tokens,
        };
        let members = Arc::new(Members::new(ClientSettings {
            dialer: Dialer {
                security,
                connect_timeout: config.connect_timeout,
            },
            max_message_bytes: config.max_message_bytes,
            verifier_tls_name: config.verifier_tls_name.clone(),
            drafter_tls_name: config.drafter_tls_name.clone(),
        }));
        let sources = Sources {
            verifiers: config.verifiers.clone(),
            drafters: config.drafters.clone(),
            interval: config.resolve_interval,
        };
        // The static entries are the initial members; one that cannot be
        // dialed fails the start.
        for (role, flag) in [(Role::Verifier, "verifiers"), (Role::Drafter, "drafters")] {
            if let Some(e) = members.set(role, &sources.initial(role)).into_iter().next() {
                return Err(SourceError::BadEndpoint {
                    flag,
                    endpoint: e.endpoint,
                    reason: e.reason,
                }
                .into());
            }
        }
        // Resolving needs a runtime; a service built outside one (never the
        // server's case) has its static members only.
        let resolve = (sources.is_dynamic() && tokio::runtime::Handle::try_current().is_ok())
            .then(|| AbortOnDrop(tokio::spawn(resolve::run(members.clone(), sources))));
        let metrics = GatewayMetrics::new();
        let decode = DecodeLoop::new(
            members.clone(),
            model.tokenizer.clone(),
            config.max_replacements,
        )
        .with_placement_wait(config.placement_wait)
        .with_metrics(metrics.clone());
        Ok(GenerationService {
            shared: Arc::new(Shared {
                validator: Validator::new(model.tokenizer, limits),
                decode,
                limiter: Arc::new(Semaphore::new(max_concurrent)),
                max_concurrent,
                default_timeout: config.request_timeout,
                metrics,
                members,
                callers,
                quotas: Quotas::new(config.quotas),
                _resolve: resolve,
            }),
        })
    }

    /// Registers the gateway's metrics with `registry` (`--metrics-listen`).
    pub fn register_metrics(&self, registry: &prometheus::Registry) {
        self.shared.metrics.register(registry);
        specmesh_server::metrics::register(
            registry,
            MemberMetrics::new(self.shared.members.clone()),
        );
    }

    /// The limits requests are validated against (the effective context).
    pub fn limits(&self) -> Limits {
        *self.shared.validator.limits()
    }

    /// Requests holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.shared.max_concurrent - self.shared.limiter.available_permits()
    }
}

#[tonic::async_trait]
impl Generation for GenerationService {
    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<GenerateResponse>, Status> {
        let (ctx, span) = self.shared.begin("Generate", &request);
        let shared = &self.shared;
        let work = async {
            let caller = shared.callers.authenticate(request.metadata())?;
            let _permit = shared.admit()?;
            let valid = shared.validate(&caller, request.into_inner()).await?;
            let quota = shared.quota(&valid)?;
            let mut collected = Collector::default();
            let summary = shared.decode.run(&valid, &ctx, &mut collected).await?;
            quota.charge(u64::from(summary.usage.completion_tokens));
            Ok::<_, GatewayError>(collected.into_response(summary, &ctx))
        };
        let result = tokio::time::timeout_at(ctx.deadline.into(), work)
            .instrument(span.clone())
            .await
            .unwrap_or(Err(GatewayError::DeadlineExceeded {
                timeout: ctx.timeout,
            }));
        let _entered = span.enter();
        match result {
            Ok(response) => {
                log_finished(
                    &ctx,
                    response.finish_reason(),
                    response.usage.unwrap_or_default(),
                    response.speculation.unwrap_or_default(),
                );
                let mut response = Response::new(response);
                tag(response.metadata_mut(), &ctx);
                Ok(response)
            }
            Err(e) => Err(fail(&shared.metrics, &e, &ctx)),
        }
    }

    type GenerateStreamStream = ReceiverStream<Result<GenerateChunk, Status>>;

    async fn generate_stream(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        let (ctx, span) = self.shared.begin("GenerateStream", &request);
        let shared = self.shared.clone();
        let admitted = async {
            let caller = shared.callers.authenticate(request.metadata())?;
            let permit = shared.admit()?;
            let valid = shared.validate(&caller, request.into_inner()).await?;
            let quota = shared.quota(&valid)?;
            Ok::<_, GatewayError>(((permit, quota), valid))
        };
        let admitted = tokio::time::timeout_at(ctx.deadline.into(), admitted)
            .instrument(span.clone())
            .await
            .unwrap_or(Err(GatewayError::DeadlineExceeded {
                timeout: ctx.timeout,
            }));
        let (permit, valid) = match admitted {
            Ok(v) => v,
            Err(e) => {
                let _entered = span.enter();
                return Err(fail(&shared.metrics, &e, &ctx));
            }
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let stream_span = info_span!(parent: &span, "stream");
        let task_ctx = ctx.clone();
        tokio::spawn(
            async move { shared.stream(valid, task_ctx, permit, tx, span).await }
                .instrument(stream_span),
        );
        let mut response = Response::new(ReceiverStream::new(rx));
        tag(response.metadata_mut(), &ctx);
        Ok(response)
    }
}

impl Shared {
    /// Names the request, opens its span (continuing the caller's trace)
    /// and fixes its deadline.
    fn begin<T>(&self, rpc: &'static str, request: &Request<T>) -> (RequestContext, Span) {
        let arrived = Instant::now();
        let request_id = new_request_id();
        let span = info_span!(
            "request",
            rpc,
            request_id = %request_id,
            session_id = field::Empty,
            tenant = field::Empty,
            prompt_tokens = field::Empty,
            max_new_tokens = field::Empty,
        );
        specmesh_server::telemetry::adopt(&span, request);
        let (timeout, early) = match client_timeout(request.metadata()) {
            // tonic's transport answers CANCELLED at the caller's deadline;
            // end a little sooner so the caller reads DEADLINE_EXCEEDED.
            Some(t) if t <= self.default_timeout => (t, (t / 10).min(DEADLINE_MARGIN)),
            _ => (self.default_timeout, Duration::ZERO),
        };
        // Config bounds the default timeout, so this cannot overflow; a
        // far-future fallback keeps it panic-free regardless.
        let deadline = arrived
            .checked_add(timeout - early)
            .unwrap_or_else(|| arrived + Duration::from_secs(86_400 * 365));
        let ctx = RequestContext {
            request_id,
            arrived,
            deadline,
            timeout,
        };
        (ctx, span)
    }

    /// Takes a concurrency permit, or refuses the request at once.
    fn admit(&self) -> Result<OwnedSemaphorePermit, GatewayError> {
        self.limiter
            .clone()
            .try_acquire_owned()
            .map_err(|_| GatewayError::Overloaded {
                limit: self.max_concurrent,
            })
    }

    /// Takes the tenant's quota for the request, or refuses it.
    fn quota(&self, valid: &ValidGenerateRequest) -> Result<QuotaPermit, GatewayError> {
        Ok(self.quotas.admit(
            &valid.tenant,
            valid.prompt_tokens.len() as u64,
            Instant::now(),
        )?)
    }

    /// Validates the request and fixes its tenant: the caller's key's,
    /// never another the request names.
    async fn validate(
        &self,
        caller: &Caller,
        request: GenerateRequest,
    ) -> Result<ValidGenerateRequest, GatewayError> {
        let span = info_span!("validate", prompt_tokens = field::Empty);
        let mut valid = self
            .validator
            .validate(request)
            .instrument(span.clone())
            .await?;
        valid.tenant = caller.tenant(&valid.tenant)?;
        span.record("prompt_tokens", valid.prompt_tokens.len());
        let request_span = Span::current();
        if let Some(id) = &valid.session_id {
            request_span.record("session_id", id.as_str());
        }
        if !valid.tenant.is_empty() {
            request_span.record("tenant", valid.tenant.as_str());
        }
        request_span.record("prompt_tokens", valid.prompt_tokens.len());
        request_span.record("max_new_tokens", valid.max_new_tokens);
        Ok(valid)
    }

    /// Runs a streaming request to its end; the permit is held until then.
    /// A client that goes away cancels the generation (and so the verifier
    /// call) at once.
    async fn stream(
        self: Arc<Self>,
        valid: ValidGenerateRequest,
        ctx: RequestContext,
        (_permit, quota): (OwnedSemaphorePermit, QuotaPermit),
        tx: mpsc::Sender<Result<GenerateChunk, Status>>,
        request_span: Span,
    ) {
        let mut sink = ChunkSink {
            tx: tx.clone(),
            sent: 0,
        };
        let run = tokio::time::timeout_at(
            ctx.deadline.into(),
            self.decode.run(&valid, &ctx, &mut sink),
        );
        let outcome = tokio::select! {
            () = tx.closed() => {
                info!("the client went away; cancelling the generation");
                return;
            }
            outcome = run => outcome.unwrap_or(Err(GatewayError::DeadlineExceeded { timeout: ctx.timeout })),
        };
        let last = match outcome {
            Ok(summary) => {
                quota.charge(u64::from(summary.usage.completion_tokens));
                let _entered = request_span.enter();
                log_finished(
                    &ctx,
                    summary.finish_reason,
                    summary.usage,
                    summary.speculation,
                );
                Ok(last_chunk(summary, sink.sent))
            }
            Err(e) => Err(fail(&self.metrics, &e, &ctx)),
        };
        // The client may be gone by now; nothing is left to cancel.
        let _ = tx.send(last).await;
    }
}

/// Keeps `tonic`'s own deadline from answering first (see `Shared::begin`).
const DEADLINE_MARGIN: Duration = Duration::from_millis(25);

/// Collects a whole completion for `Generate`.
#[derive(Debug, Default)]
struct Collector {
    text: String,
    token_ids: Vec<u32>,
}

impl DeltaSink for Collector {
    async fn send(&mut self, delta: Delta) -> Result<(), ClientGone> {
        self.text.push_str(&delta.text);
        self.token_ids.extend(delta.token_ids);
        Ok(())
    }
}

impl Collector {
    fn into_response(mut self, summary: Summary, ctx: &RequestContext) -> GenerateResponse {
        self.text.push_str(&summary.last.text);
        self.token_ids.extend(summary.last.token_ids);
        let total = ctx.arrived.elapsed().as_secs_f64();
        GenerateResponse {
            text: self.text,
            token_ids: self.token_ids,
            finish_reason: summary.finish_reason.into(),
            usage: Some(summary.usage),
            speculation: Some(summary.speculation),
            // No token at all (EOS first): the answer was complete at the end.
            time_to_first_token_seconds: summary
                .time_to_first_token
                .map_or(total, |t| t.as_secs_f64()),
            total_seconds: total,
        }
    }
}

/// Streams deltas as `GenerateChunk`s.
#[derive(Debug)]
struct ChunkSink {
    tx: mpsc::Sender<Result<GenerateChunk, Status>>,
    /// Token ids sent so far: the next chunk's `token_offset`.
    sent: u32,
}

impl DeltaSink for ChunkSink {
    async fn send(&mut self, delta: Delta) -> Result<(), ClientGone> {
        let offset = self.sent;
        self.sent = offset.saturating_add(delta.token_ids.len() as u32);
        let chunk = GenerateChunk {
            text: delta.text,
            token_ids: delta.token_ids,
            token_offset: offset,
            ..Default::default()
        };
        self.tx.send(Ok(chunk)).await.map_err(|_| ClientGone)
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
    }
}

/// Logs a finished request once (in the request span).
fn log_finished(ctx: &RequestContext, reason: FinishReason, usage: Usage, spec: SpeculationStats) {
    info!(
        finish_reason = reason.as_str_name(),
        completion_tokens = usage.completion_tokens,
        verify_steps = spec.verify_steps,
        accepted_per_step = spec.mean_accepted_per_step,
        seconds = ctx.arrived.elapsed().as_secs_f64(),
        "request finished"
    );
}

/// Logs a failed request (server faults as errors, with their detail) and
/// renders its status.
fn fail(metrics: &GatewayMetrics, err: &GatewayError, ctx: &RequestContext) -> Status {
    metrics.failed(err.code());
    if err.is_internal() {
        error!(error = %err, "request failed");
    } else {
        info!(code = ?err.code(), error = %err, "request refused");
    }
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

/// A random UUID (version 4) naming a request.
fn new_request_id() -> String {
    let mut x: u128 = rand::random();
    x = (x & !(0xf << 76)) | (0x4 << 76);
    x = (x & !(0x3 << 62)) | (0x2 << 62);
    let h = format!("{x:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The caller's `grpc-timeout` (gRPC over HTTP/2: up to 8 digits and a unit
/// H, M, S, m, u or n). Malformed values are ignored, as tonic does.
fn client_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let raw = metadata.get("grpc-timeout")?.as_bytes();
    let (unit, digits) = raw.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
