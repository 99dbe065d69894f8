//! Running an admitted request: the generation task, its events, and the
//! collected form `generate` returns.

use std::sync::Arc;

use specmesh_proto::v1::{FinishReason, SpeculationStats, Usage};
use tokio::sync::mpsc;
use tracing::{Instrument, Span, error, info};

use super::{Admitted, STREAM_BUFFER, State};
use crate::error::GatewayError;
use crate::output::Delta;
use crate::stream::{ClientGone, DeltaSink, RequestContext, Summary};

/// What a running generation delivers, in order: deltas as they are
/// released, then its end.
#[derive(Debug)]
pub enum Event {
    Delta(Delta),
    Done(Summary),
}

/// A whole generation, as `generate` collects it.
#[derive(Debug)]
pub struct Generated {
    pub text: String,
    pub token_ids: Vec<u32>,
    /// With logprobs asked: one per token id.
    pub logprobs: Vec<specmesh_proto::v1::TokenLogprob>,
    /// With tools offered: the calls the model made.
    pub tool_calls: Vec<specmesh_proto::v1::ToolCall>,
    pub summary: Summary,
}

impl State {
    /// Runs an admitted request in its own task, in the request's `span`
    /// (so placement and the verifier call are its children), delivering
    /// its events in order; the last is `Done` or an error. Dropping the
    /// receiver cancels the generation (and so the verifier call) at once.
    pub fn generate_stream(
        self: &Arc<Self>,
        admitted: Admitted,
        ctx: RequestContext,
        span: Span,
    ) -> mpsc::Receiver<Result<Event, GatewayError>> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let state = Arc::clone(self);
        tokio::spawn(async move { state.run(admitted, ctx, tx).await }.instrument(span));
        rx
    }

    /// [`State::generate_stream`], collected.
    pub async fn generate(
        self: &Arc<Self>,
        admitted: Admitted,
        ctx: RequestContext,
        span: Span,
    ) -> Result<Generated, GatewayError> {
        let mut events = self.generate_stream(admitted, ctx, span);
        let (mut text, mut token_ids, mut logprobs) = (String::new(), Vec::new(), Vec::new());
        let mut tool_calls = Vec::new();
        while let Some(event) = events.recv().await {
            match event? {
                Event::Delta(d) => {
                    text.push_str(&d.text);
                    token_ids.extend(d.token_ids);
                    logprobs.extend(d.logprobs);
                    tool_calls.extend(d.tool_calls);
                }
                Event::Done(summary) => {
                    text.push_str(&summary.last.text);
                    token_ids.extend_from_slice(&summary.last.token_ids);
                    logprobs.extend_from_slice(&summary.last.logprobs);
                    tool_calls.extend_from_slice(&summary.last.tool_calls);
                    return Ok(Generated {
                        text,
                        token_ids,
                        logprobs,
                        tool_calls,
                        summary,
                    });
                }
            }
        }
        Err(GatewayError::Cancelled)
    }

    /// Logs a failed request (server faults as errors, with their detail)
    /// and counts it; the front then renders the error its own way.
    pub(super) fn failed(&self, err: &GatewayError) {
        self.metrics.failed(err.code());
        match err {
            GatewayError::Overloaded { .. } => self.metrics.capacity_refused("gateway_full"),
            GatewayError::VerifierExhausted { .. } => {
                self.metrics.capacity_refused("verifiers_full");
            }
            _ => {}
        }
        if err.is_internal() {
            error!(error = %err, "request failed");
        } else {
            info!(code = ?err.code(), error = %err, "request refused");
        }
    }

    /// The generation task: decodes to `tx` until the end, the deadline,
    /// or the receiver going away; charges the tenant what it generated.
    async fn run(
        self: Arc<Self>,
        admitted: Admitted,
        ctx: RequestContext,
        tx: mpsc::Sender<Result<Event, GatewayError>>,
    ) {
        let Admitted {
            valid,
            _permit,
            quota,
        } = admitted;
        let mut sink = EventSink(tx.clone());
        let run = tokio::time::timeout_at(
            ctx.deadline.into(),
            self.decode.run(&valid, &ctx, &mut sink),
        );
        let closing = self.closed();
        let outcome = tokio::select! {
            () = tx.closed() => {
                info!("the client went away; cancelling the generation");
                return;
            }
            () = closing => Err(GatewayError::ShutDown { grace: self.grace }),
            outcome = run => outcome.unwrap_or(Err(GatewayError::DeadlineExceeded { timeout: ctx.timeout })),
        };
        let last = match outcome {
            Ok(summary) => {
                quota.charge(u64::from(summary.usage.completion_tokens));
                self.metrics
                    .tenant_tokens(quota.tenant(), u64::from(summary.usage.completion_tokens));
                log_finished(
                    &ctx,
                    summary.finish_reason,
                    summary.usage,
                    &summary.speculation,
                );
                Ok(Event::Done(summary))
            }
            Err(e) => {
                self.failed(&e);
                Err(e)
            }
        };
        // The client may be gone by now; nothing is left to cancel.
        let _ = tx.send(last).await;
    }
}

/// Deltas as events.
struct EventSink(mpsc::Sender<Result<Event, GatewayError>>);

impl DeltaSink for EventSink {
    async fn send(&mut self, delta: Delta) -> Result<(), ClientGone> {
        self.0
            .send(Ok(Event::Delta(delta)))
            .await
            .map_err(|_| ClientGone)
    }
}

/// Logs a finished request once (in the request span).
fn log_finished(ctx: &RequestContext, reason: FinishReason, usage: Usage, spec: &SpeculationStats) {
    info!(
        finish_reason = reason.as_str_name(),
        completion_tokens = usage.completion_tokens,
        verify_steps = spec.verify_steps,
        accepted_per_step = spec.mean_accepted_per_step,
        seconds = ctx.arrived.elapsed().as_secs_f64(),
        "request finished"
    );
}
