//! What every request shares, and the one path each takes whichever front
//! it came through (gRPC or the OpenAI HTTP front): [`State::begin`] names
//! it and fixes its deadline, [`State::admit`] lets it in, and
//! [`State::generate_stream`] runs it; `generate` is `generate_stream`
//! collected (the shape of text-generation-inference's router). Each front
//! renders [`Event`]s and [`GatewayError`]s its own way, directly.
//!
//! Admission, once: the caller's key (checked by each front's layer before
//! the body is read, [`State::authenticate`]), then a concurrency permit (a
//! semaphore with no queue: over the limit a request is refused at once),
//! then validation (which takes the caller, so the tenant is the key's and
//! nothing is changed after), then the tenant's quota. The permit lives
//! until the generation ends. The deadline is the shorter of the caller's
//! (`grpc-timeout`) and the configured default; past it the caller gets
//! DEADLINE_EXCEEDED and the verifier call is cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use specmesh_proto::v1::GenerateRequest;
use specmesh_server::discovery::SourceError;
use specmesh_server::{AbortOnDrop, Dialer, Security};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tonic::metadata::MetadataMap;
use tracing::{Instrument, Span, field, info_span};

use crate::auth::{Caller, Callers};
use crate::config::{Config, ConfigError, DEFAULT_MAX_NEW_TOKENS};
use crate::error::GatewayError;
use crate::health::Role;
use crate::members::{ClientSettings, Members};
use crate::metrics::{GatewayMetrics, MemberMetrics};
use crate::model::ModelMeta;
use crate::quota::{QuotaPermit, Quotas};
use crate::resolve::{self, Sources};
use crate::stream::{DecodeLoop, RequestContext};
use crate::validate::{Limits, ValidGenerateRequest, Validator};

mod pipeline;

pub use pipeline::{Event, Generated};

/// Events buffered between the decode loop and a slow streaming client;
/// beyond this the loop waits (and so does the verifier, through gRPC flow
/// control).
const STREAM_BUFFER: usize = 16;

/// Keeps `tonic`'s own deadline from answering first (see [`State::begin`]).
const DEADLINE_MARGIN: Duration = Duration::from_millis(25);

/// What every request of the process shares.
#[derive(Debug)]
pub struct State {
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
    /// Re-resolves `dns:///` entries for as long as the state lives.
    _resolve: Option<AbortOnDrop>,
    /// Shutting down: no new requests (see [`State::drain`]).
    draining: AtomicBool,
    /// Becomes `true` when the grace period is over: running generations
    /// end with [`GatewayError::ShutDown`].
    closing: watch::Sender<bool>,
    grace: Duration,
}

/// A request let in: valid, within the concurrency limit and its tenant's
/// quota. Dropping it gives both back.
#[derive(Debug)]
pub struct Admitted {
    pub valid: ValidGenerateRequest,
    _permit: OwnedSemaphorePermit,
    quota: QuotaPermit,
}

/// A caller refused before its request was read, and the id its refusal
/// was logged under.
#[derive(Debug)]
pub struct Refused {
    pub error: GatewayError,
    pub request_id: String,
}

impl State {
    /// What requests are validated with: the model's tokenizer and the
    /// server's limits (the HTTP front's `/tokenize` reads them too).
    pub fn validator(&self) -> &Validator {
        &self.validator
    }
}

impl State {
    /// Builds the state: verifier channels connect lazily (the service
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
    ) -> Result<State, ConfigError> {
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
        // Resolving needs a runtime; a state built outside one (never the
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
        Ok(State {
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
            draining: AtomicBool::new(false),
            closing: watch::channel(false).0,
            grace: config.endpoints.shutdown_grace,
        })
    }

    /// Registers the gateway's metrics with `registry` (`--metrics-listen`).
    pub fn register_metrics(&self, registry: &prometheus::Registry) {
        self.metrics.register(registry);
        specmesh_server::metrics::register(registry, MemberMetrics::new(self.members.clone()));
        if let Callers::Keys(ring) = &self.callers {
            specmesh_server::metrics::register(registry, ring.loaded_gauge());
        }
    }

    /// The limits requests are validated against (the effective context).
    pub fn limits(&self) -> Limits {
        *self.validator.limits()
    }

    /// Requests holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.max_concurrent - self.limiter.available_permits()
    }

    /// Shutdown began: every front refuses new requests
    /// ([`GatewayError::Draining`]; the HTTP `/health` answers 503), and
    /// running ones go on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether shutdown began.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The grace period is over: generations still running end with
    /// [`GatewayError::ShutDown`], a last event their callers read.
    pub fn close(&self) {
        self.drain();
        self.closing.send_replace(true);
    }

    /// Resolves once [`State::close`] was called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut closing = self.closing.subscribe();
        async move {
            let _ = closing.wait_for(|c| *c).await;
        }
    }

    /// Every tenant's quota use (shared with the peer gateways).
    pub fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// Names the request, opens its span (continuing the trace its
    /// `metadata` carries) and fixes its deadline: the caller's
    /// `grpc-timeout` when shorter than the default.
    pub fn begin(&self, rpc: &'static str, metadata: &MetadataMap) -> (RequestContext, Span) {
        self.open(rpc, metadata, new_request_id(), true)
    }

    /// [`State::begin`] for the HTTP front: the request id is the one its
    /// layers gave the request, and the span is a child of the layers'
    /// `http` span, which continued the caller's trace.
    pub fn begin_http(
        &self,
        rpc: &'static str,
        metadata: &MetadataMap,
        request_id: String,
    ) -> (RequestContext, Span) {
        self.open(rpc, metadata, request_id, false)
    }

    fn open(
        &self,
        rpc: &'static str,
        metadata: &MetadataMap,
        request_id: String,
        adopt: bool,
    ) -> (RequestContext, Span) {
        let arrived = Instant::now();
        let span = info_span!(
            "request",
            rpc,
            request_id = %request_id,
            session_id = field::Empty,
            tenant = field::Empty,
            prompt_tokens = field::Empty,
            max_new_tokens = field::Empty,
        );
        if adopt {
            specmesh_server::telemetry::adopt_metadata(&span, metadata);
        }
        let (timeout, early) = match client_timeout(metadata) {
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

    /// The caller whose key `metadata` carries. Each front calls it in a
    /// layer before the request's body is read, so an unauthenticated
    /// caller costs no decoding. A refusal is logged and counted under a
    /// new request id, returned with it for the front's answer.
    pub fn authenticate(
        &self,
        metadata: &MetadataMap,
        request_id: Option<&str>,
    ) -> Result<Caller, Refused> {
        self.callers.authenticate(metadata).map_err(|e| {
            let error = GatewayError::from(e);
            let request_id = request_id.map_or_else(new_request_id, str::to_owned);
            let _entered = info_span!("request", request_id = %request_id).entered();
            self.failed(&error);
            Refused { error, request_id }
        })
    }

    /// Lets the request of the authenticated `caller` in (see the module
    /// docs), within its deadline, in the request's `span`; a refusal is
    /// logged and counted there.
    pub async fn admit(
        &self,
        caller: &Caller,
        request: GenerateRequest,
        ctx: &RequestContext,
        span: &Span,
    ) -> Result<Admitted, GatewayError> {
        let admit =
            async {
                if self.is_draining() {
                    return Err(GatewayError::Draining);
                }
                let permit = self.limiter.clone().try_acquire_owned().map_err(|_| {
                    GatewayError::Overloaded {
                        limit: self.max_concurrent,
                    }
                })?;
                let span = info_span!("validate", prompt_tokens = field::Empty);
                let valid = self
                    .validator
                    .validate(request, caller)
                    .instrument(span.clone())
                    .await?;
                span.record("prompt_tokens", valid.prompt_tokens.len());
                record(&Span::current(), &valid);
                let quota = self
                    .quotas
                    .admit(
                        &valid.tenant,
                        caller.limits(),
                        valid.prompt_tokens.len() as u64,
                        Instant::now(),
                    )
                    .inspect_err(|e| self.metrics.quota_refused(&valid.tenant, e.reason()))?;
                self.metrics
                    .tenant_tokens(&valid.tenant, valid.prompt_tokens.len() as u64);
                Ok(Admitted {
                    valid,
                    _permit: permit,
                    quota,
                })
            };
        let admitted = tokio::time::timeout_at(ctx.deadline.into(), admit)
            .instrument(span.clone())
            .await
            .unwrap_or(Err(GatewayError::DeadlineExceeded {
                timeout: ctx.timeout,
            }));
        if let Err(e) = &admitted {
            let _entered = span.enter();
            self.failed(e);
        }
        admitted
    }
}

/// Puts what validation found on the request's span.
fn record(request_span: &Span, valid: &ValidGenerateRequest) {
    if let Some(id) = &valid.session_id {
        request_span.record("session_id", id.as_str());
    }
    if !valid.tenant.is_empty() {
        request_span.record("tenant", valid.tenant.as_str());
    }
    request_span.record("prompt_tokens", valid.prompt_tokens.len());
    request_span.record("max_new_tokens", valid.max_new_tokens);
}

/// A random UUID (version 4) naming a request.
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().to_string()
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
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_per_the_spec() {
        let parse = |v: &str| {
            let mut m = MetadataMap::new();
            m.insert("grpc-timeout", v.parse().unwrap());
            client_timeout(&m)
        };
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(parse("123456789S"), None);
        assert_eq!(parse("S"), None);
        assert_eq!(parse("5s"), None);
        assert_eq!(parse("-5S"), None);
        assert_eq!(client_timeout(&MetadataMap::new()), None);
    }

    #[test]
    fn request_ids_are_uuid_v4() {
        let id = new_request_id();
        assert_eq!(id.len(), 36);
        assert_eq!(id.as_bytes()[14], b'4');
        assert!(matches!(id.as_bytes()[19], b'8' | b'9' | b'a' | b'b'));
        assert_ne!(id, new_request_id());
    }
}
