//! The `specmesh.v1.Verifier` gRPC service: validates at the edge, admits
//! against the KV budget, and hands the session to its driver task.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use specmesh_model::Model;
use specmesh_proto::v1;
use specmesh_sampling::SamplingParams;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::draft_link::DrafterChannels;
use crate::engine::Engine;
use crate::memory::KvMemory;
use crate::session::{DraftPlan, Gauge, ValidRun, drive};

/// Everything sessions share.
#[derive(Debug)]
pub struct Inner {
    pub config: Config,
    pub model: Arc<Model>,
    pub engine: Engine,
    pub memory: KvMemory,
    pub channels: DrafterChannels,
    pub eos: Vec<u32>,
    pub vocab: u32,
    pub cost_curve: Vec<(usize, f64)>,
    /// Sessions admitted and not yet ended.
    pub running: Arc<AtomicUsize>,
    /// Sessions past prefill: the batcher waits for their trees.
    pub decoding: Arc<AtomicUsize>,
}

impl Inner {
    pub fn cost_curve_wire(&self) -> Vec<v1::CostPoint> {
        self.cost_curve
            .iter()
            .map(|&(k, c)| v1::CostPoint {
                tokens: k as u32,
                relative_cost: c,
            })
            .collect()
    }

    /// Tokens of KV a run may need: its context, its output and one tree.
    pub fn kv_tokens(&self, run: &ValidRun) -> usize {
        let tree = run.draft.as_ref().map_or(1, |d| d.max_draft_tokens + 1);
        (run.tokens.len() + run.max_new_tokens + tree).min(self.model.config().max_context)
    }
}

#[derive(Debug, Clone)]
pub struct VerifierService {
    inner: Arc<Inner>,
}

impl VerifierService {
    pub fn new(inner: Arc<Inner>) -> VerifierService {
        VerifierService { inner }
    }

    fn validate(&self, r: v1::RunRequest) -> Result<ValidRun, Status> {
        let v = &self.inner;
        let bad = |m: String| Err(Status::invalid_argument(m));
        if r.tokens.is_empty() {
            return bad("`tokens` must hold at least one token".into());
        }
        if let Some((i, t)) = r.tokens.iter().enumerate().find(|(_, t)| **t >= v.vocab) {
            return bad(format!(
                "`tokens[{i}]` is {t}, but the vocabulary has {} tokens",
                v.vocab
            ));
        }
        let prompt_len = r.prompt_len as usize;
        if prompt_len == 0 || prompt_len > r.tokens.len() {
            return bad(format!(
                "`prompt_len` must be in 1..={}, got {prompt_len}",
                r.tokens.len()
            ));
        }
        if r.max_new_tokens == 0 {
            return bad("`max_new_tokens` must be >= 1".into());
        }
        let max_ctx = v.model.config().max_context;
        let total = r.tokens.len() + r.max_new_tokens as usize;
        if total > max_ctx {
            return bad(format!(
                "`tokens` ({}) + `max_new_tokens` ({}) exceed the model's context of {max_ctx} tokens",
                r.tokens.len(),
                r.max_new_tokens
            ));
        }
        let s = r.sampling.unwrap_or_default();
        let top_p = if s.top_p == 0.0 { 1.0 } else { s.top_p };
        if s.top_k > v.vocab {
            return bad(format!(
                "`sampling.top_k` must be <= the vocabulary size {}, got {}",
                v.vocab, s.top_k
            ));
        }
        let params = SamplingParams::new(s.temperature, top_p, s.top_k as usize, s.seed)
            .map_err(|e| Status::invalid_argument(format!("sampling: {e}")))?;
        for (name, value) in [("session_id", &r.session_id), ("cache_key", &r.cache_key)] {
            if value.len() > 256 {
                return bad(format!(
                    "`{name}` must be at most 256 bytes, got {}",
                    value.len()
                ));
            }
        }
        let draft = match r.draft {
            Some(d) if !d.endpoint.is_empty() => {
                if d.endpoint.parse::<tonic::transport::Uri>().is_err() {
                    return bad(format!("`draft.endpoint` is not a URI: `{}`", d.endpoint));
                }
                let max = if d.max_draft_tokens == 0 {
                    v.config.max_draft_tokens
                } else {
                    (d.max_draft_tokens as usize).min(v.config.max_draft_tokens)
                };
                Some(DraftPlan {
                    endpoint: d.endpoint,
                    max_draft_tokens: max,
                    tenant: d.tenant,
                })
            }
            _ => None,
        };
        Ok(ValidRun {
            session_id: r.session_id,
            epoch: r.epoch,
            tokens: r.tokens,
            prompt_len,
            max_new_tokens: r.max_new_tokens as usize,
            params,
            draft,
            cache_key: Some(r.cache_key).filter(|k| !k.is_empty()),
        })
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::SessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl v1::verifier_server::Verifier for VerifierService {
    type RunStream = EventStream;

    async fn run(&self, request: Request<v1::RunRequest>) -> Result<Response<EventStream>, Status> {
        let span = tracing::info_span!("run");
        specmesh_server::telemetry::adopt(&span, &request);
        let _e = span.enter();
        let run = self.validate(request.into_inner())?;
        let v = &self.inner;
        if v.running.load(Ordering::Relaxed) >= v.config.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "the verifier runs its limit of {} sessions; retry later or on another verifier",
                v.config.max_sessions
            )));
        }
        let bytes = (v.kv_tokens(&run) * v.model.kv_bytes_per_token()) as u64;
        let reservation = v
            .memory
            .reserve(bytes)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let running = Gauge::up(&v.running);
        let (tx, rx) = mpsc::channel(16);
        let inner = Arc::clone(&self.inner);
        drop(_e);
        tokio::spawn(tracing::Instrument::instrument(
            drive(inner, run, tx, reservation, running),
            span,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::VerifierStats>, Status> {
        let v = &self.inner;
        let usage = v.memory.usage();
        let counters = v.engine.counters();
        Ok(Response::new(v1::VerifierStats {
            active_sessions: v.running.load(Ordering::Relaxed) as u32,
            cached_sessions: usage.cached_sessions as u32,
            kv_bytes: usage.reserved + usage.cached,
            kv_budget_bytes: usage.budget,
            cost_curve: v.cost_curve_wire(),
            steps: counters.steps.load(Ordering::Relaxed),
            batches: counters.batches.load(Ordering::Relaxed),
        }))
    }
}
