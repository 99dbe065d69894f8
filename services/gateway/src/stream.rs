//! The decode loop of one request: place it, run the session on the
//! verifier, turn each committed step into output, and, if the verifier is
//! lost mid-generation, resume the session on another one.
//!
//! The verifier runs draft → verify → commit itself (pulling trees from the
//! drafter named in the `DraftPlan`); the gateway only reads `Committed`
//! steps. The committed token list kept here is authoritative, which is
//! what makes recovery possible: a new verifier receives the prompt plus
//! everything committed so far (`prompt_len` unchanged, so sampling
//! positions continue), the budget left and the next epoch. Greedy output is
//! identical to an uninterrupted run; the caller sees no gap.
//!
//! Ending early (stop string, deadline, caller gone) drops the verifier's
//! response stream, which cancels the call; the verifier then frees the
//! session's KV cache (or keeps it under `cache_key`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specmesh_kvcache::{BLOCK_TOKENS, Scope, block_hashes};
use specmesh_proto::v1::{
    self, Committed, FinishReason, SessionEvent, Usage, session_event::Event,
};
use specmesh_tokenizer::Tokenizer;
use tonic::{Code, Status, Streaming};
use tracing::{Instrument, debug, field, info, info_span, warn};

use crate::error::GatewayError;
use crate::members::Members;
use crate::metrics::GatewayMetrics;
use crate::output::{Calls, Delta, OutputBuilder};
use crate::placement::{FailedOn, Placement, PlacementKey};
use crate::spec_stats::SpecStats;
use crate::validate::ValidGenerateRequest;

/// Where the loop delivers output as it is released.
pub trait DeltaSink: Send {
    /// Delivers a non-empty delta; fails when the caller has gone away.
    fn send(&mut self, delta: Delta) -> impl Future<Output = Result<(), ClientGone>> + Send;
}

/// The caller stopped listening.
#[derive(Debug, Clone, Copy)]
pub struct ClientGone;

/// Identity and timing of one request.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// Names the request in logs; also the verifier session id when the
    /// caller gave none.
    pub request_id: String,
    pub arrived: Instant,
    pub deadline: Instant,
    /// The deadline's length, for messages.
    pub timeout: Duration,
}

/// How a generation ended, and what it cost.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Output not yet delivered: the final step's, plus what ending
    /// released (the stop matcher's held-back tail, a flushed partial
    /// character).
    pub last: Delta,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub speculation: v1::SpeculationStats,
    /// From arrival to the first committed token.
    pub time_to_first_token: Option<Duration>,
}

/// Runs requests on the verifiers; shared by every request.
#[derive(Debug)]
pub struct DecodeLoop {
    /// The verifiers and drafters now, with a client per verifier.
    members: Arc<Members>,
    tokenizer: Tokenizer,
    max_replacements: u32,
    /// How long a request waits for a verifier when none can take it.
    placement_wait: Duration,
    metrics: GatewayMetrics,
}

/// How often a request waiting for a verifier looks again.
const PLACEMENT_POLL: Duration = Duration::from_millis(100);

/// The state of one request that survives re-placement.
#[derive(Debug)]
struct Progress {
    output: OutputBuilder,
    stats: SpecStats,
    first_token_at: Option<Instant>,
    /// When the latest tokens were committed (inter-token latency).
    last_token_at: Option<Instant>,
    /// Output of the final step, kept back to travel with the summary (so
    /// the last streamed chunk carries both).
    tail: Delta,
    /// Prompt tokens the first placement's verifier found cached. A
    /// resumed session's later placements prefill what the first did not,
    /// but the prompt was read once: its reuse is the first's.
    cached_tokens: Option<u32>,
}

/// Why one placement of a request ended without finishing it.
#[derive(Debug)]
enum AttemptError {
    /// The verifier went away (pod loss, connection reset, refused
    /// connection): the session can resume elsewhere.
    Lost(String),
    /// The verifier is out of capacity (KV memory, sessions): another may
    /// have room.
    Full(String),
    /// Moving elsewhere would not help.
    Fatal(GatewayError),
}

impl DecodeLoop {
    pub fn new(members: Arc<Members>, tokenizer: Tokenizer, max_replacements: u32) -> Self {
        DecodeLoop {
            members,
            tokenizer,
            max_replacements,
            placement_wait: Duration::ZERO,
            metrics: GatewayMetrics::default(),
        }
    }

    /// Records steps, latencies and placements into `metrics`.
    pub fn with_metrics(mut self, metrics: GatewayMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The request finished: its latency and tokens.
    fn finished(&self, summary: Summary, ctx: &RequestContext) -> Summary {
        self.metrics.finished(
            ctx.arrived.elapsed(),
            summary.usage.prompt_tokens,
            summary.usage.completion_tokens,
        );
        summary
    }

    /// Requests wait up to `wait` (within their deadline) for a verifier
    /// to come back when none can take them, instead of failing at once.
    pub fn with_placement_wait(mut self, wait: Duration) -> Self {
        self.placement_wait = wait;
        self
    }

    /// Generates the completion of `request`, delivering output to `sink`
    /// as it is released; the summary carries the rest.
    pub async fn run(
        &self,
        request: &ValidGenerateRequest,
        ctx: &RequestContext,
        sink: &mut impl DeltaSink,
    ) -> Result<Summary, GatewayError> {
        let mut progress = Progress {
            output: {
                let mut b = OutputBuilder::new(&self.tokenizer, request.stop.clone());
                if request.logprobs.is_some() {
                    b = b.with_logprobs(&self.tokenizer);
                }
                if let Some(tools) = &request.tools {
                    b = b.with_calls(Calls::new(tools, &self.tokenizer));
                }
                b
            },
            stats: SpecStats::default(),
            first_token_at: None,
            last_token_at: None,
            tail: Delta::default(),
            cached_tokens: None,
        };
        // Verifiers this request failed on, each with its recovery count
        // then: one the health watch has since seen come back up (a
        // restarted pod) may take the request again.
        let mut failed: Vec<FailedOn> = Vec::new();
        let mut epoch = 1u64;
        // Verifiers lost so far (bounded by `max_replacements`), and what
        // the last one out of capacity said.
        let mut lost = 0u64;
        let mut full: Option<String> = None;
        // Since when no verifier could take the request, while none can.
        let mut unplaceable_since: Option<Instant> = None;
        loop {
            let attempts = u32::try_from(failed.len()).unwrap_or(u32::MAX);
            let committed = progress.output.committed().to_vec();
            let Some(placement) = self.place(request, &committed, &failed, epoch) else {
                // No verifier can take it now (all down, restarting, or
                // lost by this request and not back yet): wait a while for
                // one to come back, as pods do in a rolling update.
                let since = *unplaceable_since.get_or_insert_with(Instant::now);
                let until = (since + self.placement_wait).min(ctx.deadline);
                if full.is_none() && Instant::now() + PLACEMENT_POLL <= until {
                    if since.elapsed() < PLACEMENT_POLL {
                        info!(epoch, "no verifier can take the request: waiting for one");
                    }
                    tokio::time::sleep(PLACEMENT_POLL).await;
                    continue;
                }
                // Out of capacity somewhere is worth retrying later; no
                // verifier at all is unavailability.
                let capable = self
                    .members
                    .placer()
                    .verifiers()
                    .iter()
                    .any(|v| v.serves_structured());
                return Err(match full {
                    Some(last) => GatewayError::VerifierExhausted {
                        message: format!("{last} ({attempts} verifiers tried)"),
                    },
                    None if needs_capability(request) && !capable => GatewayError::Unsupported {
                        what: "structured outputs, logprobs, min_new_tokens or ignore_eos",
                    },
                    None => GatewayError::NoVerifier { attempts },
                });
            };
            unplaceable_since = None;
            let span = info_span!(
                "verify_stream",
                epoch,
                verifier = placement.verifier.endpoint(),
                drafter = placement.drafter.as_deref().unwrap_or(""),
                resumed_tokens = progress.output.committed().len(),
                placed_by = placement.reason.name(),
                predicted_cached_tokens = placement.predicted_blocks * BLOCK_TOKENS,
                cached_tokens = field::Empty,
            );
            let outcome = self
                .attempt(request, ctx, &placement, &mut progress, sink)
                .instrument(span)
                .await;
            match outcome {
                Ok(reason) => return Ok(self.finished(progress.finish(reason, request, ctx), ctx)),
                Err(AttemptError::Fatal(e)) => return Err(e),
                Err(AttemptError::Full(message)) => {
                    // Refused at admission: nothing ran there, and another
                    // verifier may have room.
                    info!(
                        verifier = placement.verifier.endpoint(),
                        %message,
                        "the verifier is out of capacity; trying another"
                    );
                    failed.push(placement.verifier.failed());
                    full = Some(message);
                    epoch += 1;
                }
                Err(AttemptError::Lost(cause)) => {
                    failed.push(placement.verifier.failed());
                    if remaining(request, &progress) == 0 {
                        // Every token arrived; only the final flag was lost.
                        let summary = progress.finish(FinishReason::Length, request, ctx);
                        return Ok(self.finished(summary, ctx));
                    }
                    let replacements = lost;
                    lost += 1;
                    if replacements >= u64::from(self.max_replacements) {
                        warn!(
                            verifier = placement.verifier.endpoint(),
                            epoch,
                            %cause,
                            "lost the verifier and no re-placement is left"
                        );
                        return Err(GatewayError::NoVerifier {
                            attempts: attempts.saturating_add(1),
                        });
                    }
                    warn!(
                        verifier = placement.verifier.endpoint(),
                        epoch,
                        committed = progress.output.committed().len(),
                        %cause,
                        "lost the verifier; resuming the session on another"
                    );
                    self.metrics.migrated();
                    epoch += 1;
                }
            }
        }
    }

    /// Chooses the verifier and drafter for the next attempt, resuming
    /// after `committed`.
    fn place(
        &self,
        request: &ValidGenerateRequest,
        committed: &[u32],
        failed: &[FailedOn],
        epoch: u64,
    ) -> Option<Placement> {
        let span = info_span!(
            "place",
            epoch,
            verifier = field::Empty,
            drafter = field::Empty,
            reason = field::Empty,
            predicted_cached_tokens = field::Empty,
            drafter_cached_tokens = field::Empty,
        );
        let _entered = span.enter();
        // The context's block hashes, as the verifier's prefix cache names
        // them (all but the last token: the first tree's root).
        let mut context = Vec::with_capacity(request.prompt_tokens.len() + committed.len());
        context.extend_from_slice(&request.prompt_tokens);
        context.extend_from_slice(committed);
        let scope = Scope::new(&request.tenant, &request.cache_salt, None);
        let prefix = block_hashes(scope, &context[..context.len() - 1], BLOCK_TOKENS);
        // What the verifier reserves: the context, the tokens still to
        // generate and one tree (its root when not speculating).
        let tree = if request.speculation.speculates() {
            request.speculation.max_draft_tokens as usize + 1
        } else {
            1
        };
        let reserve = context.len()
            + (request.max_new_tokens as usize).saturating_sub(committed.len())
            + tree;
        let key = PlacementKey {
            session_id: request.session_id.as_deref(),
            tenant: &request.tenant,
            speculate: request.speculation.speculates(),
            prefix: &prefix,
            need_blocks: reserve.div_ceil(BLOCK_TOKENS) as u64,
            structured: needs_capability(request),
            grammar: request.structured.is_some(),
        };
        let placement = self.members.placer().place(key, failed, epoch)?;
        let predicted = placement.predicted_blocks * BLOCK_TOKENS;
        self.metrics.placed(placement.reason.name(), predicted);
        span.record("verifier", placement.verifier.endpoint());
        span.record("reason", placement.reason.name());
        span.record("predicted_cached_tokens", predicted);
        if let Some(d) = &placement.drafter {
            span.record("drafter", d.as_str());
            span.record(
                "drafter_cached_tokens",
                placement.drafter_blocks * BLOCK_TOKENS,
            );
            self.metrics.drafter_placed(placement.drafter_blocks > 0);
        }
        Some(placement)
    }

    /// Runs the session on one placement until it finishes or fails.
    async fn attempt(
        &self,
        request: &ValidGenerateRequest,
        ctx: &RequestContext,
        placement: &Placement,
        progress: &mut Progress,
        sink: &mut impl DeltaSink,
    ) -> Result<FinishReason, AttemptError> {
        let mut events = self.open(request, ctx, placement, progress).await?;
        loop {
            let event = next_event(&mut events, ctx).await?;
            match event {
                Event::Started(s) => {
                    debug!(
                        reused_tokens = s.reused_tokens,
                        prefill_seconds = s.prefill_seconds,
                        drafting = s.drafting,
                        "session started"
                    );
                    let cached = s.reused_tokens.min(request.prompt_len());
                    progress.cached_tokens.get_or_insert(cached);
                    self.metrics.cached(s.reused_tokens);
                    tracing::Span::current().record("cached_tokens", s.reused_tokens);
                }
                Event::Committed(step) => {
                    if let Some(reason) =
                        commit(request, ctx, &self.metrics, progress, step, sink).await?
                    {
                        // Returning drops `events`, which cancels the call.
                        return Ok(reason);
                    }
                }
            }
        }
    }

    /// Starts `Verifier.Run` with the context so far.
    async fn open(
        &self,
        request: &ValidGenerateRequest,
        ctx: &RequestContext,
        placement: &Placement,
        progress: &Progress,
    ) -> Result<Streaming<SessionEvent>, AttemptError> {
        // `None`: the verifier left the list since it was placed on.
        let mut client = self
            .members
            .client(placement.verifier.endpoint())
            .ok_or_else(|| AttemptError::Lost("the verifier left the member list".into()))?;
        let run = run_request(request, ctx, placement, progress.output.committed());
        let mut call = tonic::Request::new(run);
        // The verifier gives up when the caller would.
        if let Some(left) = ctx.deadline.checked_duration_since(Instant::now()) {
            call.set_timeout(left);
        }
        specmesh_server::telemetry::inject(&mut call);
        client
            .run(call)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| classify(s, ctx))
    }
}

impl Progress {
    /// Closes the output and assembles the summary.
    fn finish(
        &mut self,
        reason: FinishReason,
        request: &ValidGenerateRequest,
        ctx: &RequestContext,
    ) -> Summary {
        let mut last = std::mem::take(&mut self.tail);
        let rest = self.output.finish();
        last.text.push_str(&rest.text);
        last.token_ids.extend(rest.token_ids);
        last.logprobs.extend(rest.logprobs);
        last.tool_calls.extend(rest.tool_calls);
        // A turn that ended after its calls ended with them.
        let reason = match reason {
            FinishReason::Eos | FinishReason::Stop if self.output.called() => {
                FinishReason::ToolCalls
            }
            r => r,
        };
        Summary {
            last,
            finish_reason: reason,
            usage: usage(
                request,
                &self.output.committed()
                    [..self.output.reported().min(self.output.committed().len())],
                u32::try_from(self.output.reported()).unwrap_or(u32::MAX),
                self.cached_tokens.unwrap_or(0),
            ),
            speculation: self.stats.to_wire(),
            time_to_first_token: self
                .first_token_at
                .map(|t| t.saturating_duration_since(ctx.arrived)),
        }
    }
}

/// The next event, skipping kinds this gateway does not know (a newer
/// verifier may send them). A stream that ends before a finished step means
/// the verifier went away.
async fn next_event(
    events: &mut Streaming<SessionEvent>,
    ctx: &RequestContext,
) -> Result<Event, AttemptError> {
    loop {
        match events.message().await {
            Ok(Some(SessionEvent { event: Some(e) })) => return Ok(e),
            Ok(Some(SessionEvent { event: None })) => debug!("skipping an unknown session event"),
            Ok(None) => {
                return Err(AttemptError::Lost(
                    "the verifier ended the session before it finished".into(),
                ));
            }
            Err(status) => return Err(classify(status, ctx)),
        }
    }
}

/// Applies one verify step: records it, releases output, and says whether
/// the generation is over.
async fn commit(
    request: &ValidGenerateRequest,
    ctx: &RequestContext,
    metrics: &GatewayMetrics,
    progress: &mut Progress,
    step: Committed,
    sink: &mut impl DeltaSink,
) -> Result<Option<FinishReason>, AttemptError> {
    progress.stats.record(&step);
    metrics.step(&step);
    let room = remaining(request, progress);
    // A verifier committing past max_new_tokens is cut at the budget.
    let take = step.tokens.len().min(room);
    let tokens = &step.tokens[..take];
    if !tokens.is_empty() {
        let now = Instant::now();
        match progress.last_token_at.replace(now) {
            Some(previous) => metrics.tokens_after(now - previous, tokens.len()),
            None => {
                progress.first_token_at = Some(now);
                metrics.first_token(now.saturating_duration_since(ctx.arrived));
            }
        }
    }
    let delta = progress
        .output
        .push(tokens, &step.logprobs)
        .map_err(|e| AttemptError::Fatal(GatewayError::Protocol(e.to_string())))?;
    let reason = if progress.output.stopped() {
        Some(FinishReason::Stop)
    } else if step.eos && take == step.tokens.len() {
        Some(FinishReason::Eos)
    } else if step.finished || remaining(request, progress) == 0 {
        Some(FinishReason::Length)
    } else {
        None
    };
    if reason.is_some() {
        progress.tail = delta;
    } else if !delta.is_empty() {
        sink.send(delta)
            .await
            .map_err(|ClientGone| AttemptError::Fatal(GatewayError::Cancelled))?;
    }
    Ok(reason)
}

/// Tokens the request may still generate.
fn remaining(request: &ValidGenerateRequest, progress: &Progress) -> usize {
    (request.max_new_tokens as usize).saturating_sub(progress.output.committed().len())
}

/// Sorts a verifier status into "resume elsewhere" and "give up".
///
/// UNAVAILABLE is what a refused or failed connection, a dead keepalive and
/// a draining pod produce. A connection cut mid-stream surfaces as UNKNOWN
/// ("error reading a body from connection"), or INTERNAL/CANCELLED for some
/// HTTP/2 resets, carrying the transport error as its source; statuses the
/// verifier sent itself (in trailers) never carry one.
fn classify(status: Status, ctx: &RequestContext) -> AttemptError {
    let from_transport = std::error::Error::source(&status).is_some();
    let code = status.code();
    let message = status.message().to_owned();
    match code {
        Code::Unavailable => AttemptError::Lost(format!("unavailable: {message}")),
        Code::Unknown | Code::Internal | Code::Cancelled if from_transport => {
            AttemptError::Lost(format!("connection lost: {message}"))
        }
        Code::ResourceExhausted => AttemptError::Full(message),
        Code::DeadlineExceeded => AttemptError::Fatal(GatewayError::DeadlineExceeded {
            timeout: ctx.timeout,
        }),
        Code::FailedPrecondition => AttemptError::Fatal(GatewayError::Precondition { message }),
        Code::InvalidArgument | Code::OutOfRange => {
            AttemptError::Fatal(GatewayError::VerifierRejected { message })
        }
        code => AttemptError::Fatal(GatewayError::VerifierFailed { code, message }),
    }
}

#[cfg(test)]
mod tests;
mod wire;

use wire::{needs_capability, run_request, usage};
