//! The `specmesh.v1.Verifier` gRPC service: validates at the edge, admits
//! against the session limit and the KV budget, and hands the session to
//! its driver task ([`crate::stream`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use specmesh_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::error::VerifierError;
use crate::state::State;
use crate::stream::drive;
use crate::validate::ValidRun;

/// Events buffered per session ahead of the gateway reading them.
const OUTBOUND_EVENTS: usize = 16;

#[derive(Debug, Clone)]
pub struct VerifierService {
    state: Arc<State>,
}

impl VerifierService {
    pub fn new(state: Arc<State>) -> VerifierService {
        VerifierService { state }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::SessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl v1::verifier_server::Verifier for VerifierService {
    type RunStream = EventStream;

    async fn run(&self, request: Request<v1::RunRequest>) -> Result<Response<EventStream>, Status> {
        let span = tracing::info_span!("run");
        specmesh_server::telemetry::adopt(&span, &request);
        let v = &self.state;
        let mut run = span
            .in_scope(|| ValidRun::from_wire(request.into_inner(), v.run_limits()))
            .inspect_err(|e| span.in_scope(|| tracing::info!(error = %e, "run refused")))?;
        run.compile(&v.grammars)
            .instrument(span.clone())
            .await
            .inspect_err(|e| span.in_scope(|| tracing::info!(error = %e, "run refused")))?;
        // Only a drafter of this verifier's own set is ever dialed.
        if let Some(plan) = &run.draft {
            v.drafters
                .check(plan)
                .instrument(span.clone())
                .await
                .inspect_err(|e| span.in_scope(|| tracing::info!(error = %e, "run refused")))?;
        }
        let admitted = span.in_scope(|| {
            let slot = v.admit()?;
            let bytes = (v.kv_tokens(&run) * v.model.kv_bytes_per_token()) as u64;
            // The key first: looking the prefix up touches it, so the room
            // this reservation makes evicts other blocks before its own.
            let prefix = v.memory.key(&run);
            let reservation = v.memory.reserve(bytes)?;
            Ok::<_, VerifierError>((run, slot, reservation, prefix))
        });
        let (run, slot, reservation, prefix) = admitted.inspect_err(|e| {
            span.in_scope(|| tracing::info!(error = %e, "run refused"));
        })?;
        let (tx, rx) = mpsc::channel(OUTBOUND_EVENTS);
        tokio::spawn(Instrument::instrument(
            drive(Arc::clone(v), run, prefix, tx, reservation, slot),
            span,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::VerifierStats>, Status> {
        let v = &self.state;
        let usage = v.memory.usage();
        let counters = v.batcher.counters();
        Ok(Response::new(v1::VerifierStats {
            active_sessions: v.running() as u32,
            cached_sessions: 0,
            kv_bytes: usage.reserved + usage.cached,
            kv_budget_bytes: usage.budget,
            cost_curve: v.cost_curve_wire(),
            steps: counters.steps.load(Ordering::Relaxed),
            batches: counters.batches.load(Ordering::Relaxed),
            evicted_caches: usage.evicted_blocks,
            reused_tokens: usage.hit_tokens,
            kept_tokens: (usage.blocks * usage.block_tokens) as u64,
            reserved_bytes: usage.reserved,
            prefix_cache_bytes: usage.cached,
            prefix_cache_blocks: usage.blocks as u64,
            prefix_cache_queries: usage.queried_tokens,
            block_tokens: usage.block_tokens as u32,
        }))
    }
}
