//! One batch of steps, once the batching thread has gathered it: the
//! goodput planner's grants, the batched forward (a prefill's chunk riding
//! in it), and each session's answer. A failed forward is retried without
//! the chunk, then step by step, so only the bad item fails.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use specmesh_engine::{FusedStep, PrefillChunk, Session, step_batch_fused};
use specmesh_model::Model;
use specmesh_tree::TokenTree;

use super::prefill::PrefillJob;
use super::{Counters, LastForward, MAX_STEP_GAP, StepDone, StepJob, batch_wait};
use crate::batch_metrics::Phase;
use crate::error::VerifierError;
use crate::goodput::{Goodput, Granted, SessionPlanning};

/// A prefill's chunk riding in a batch of steps.
pub(super) struct Fused<'a> {
    pub(super) job: &'a mut PrefillJob,
    pub(super) chunk: usize,
    /// Set when the forward failed with the chunk in it.
    pub(super) failed: &'a mut bool,
}

/// Plans, verifies and answers one batch of steps.
pub(super) fn run_batch(
    model: &Model,
    mut batch: Vec<StepJob>,
    fused: Option<Fused<'_>>,
    goodput: &mut Goodput,
    last_forward: &mut LastForward,
    counters: &Counters,
) {
    let m = &counters.metrics;
    let start = Instant::now();
    goodput.settle(&counters.drafting, start);
    if let Some(end) = last_forward.take() {
        let gap = start.duration_since(end);
        if gap < MAX_STEP_GAP {
            let speculating = batch.iter().filter(|j| j.tree.draft_len() > 0).count();
            goodput.observe_gap(speculating, gap.as_secs_f64());
            m.phase(Phase::Gap, gap.as_secs_f64());
        }
    }
    let n = batch.len();
    let span = tracing::info_span!(
        "verify_batch",
        sessions = n,
        tokens = tracing::field::Empty,
        prefill_tokens = tracing::field::Empty,
        proposed = tracing::field::Empty,
        granted = tracing::field::Empty,
        expected_accepted = tracing::field::Empty,
        predicted_ms = tracing::field::Empty,
        forward_ms = tracing::field::Empty,
        verify_ms = tracing::field::Empty,
        commit_ms = tracing::field::Empty,
    );
    let _e = span.enter();
    for job in &batch {
        span.follows_from(&job.span);
        m.phase(
            Phase::Queue,
            start.saturating_duration_since(job.queued).as_secs_f64(),
        );
    }
    let plan = {
        let (mut trees, sessions): (Vec<&mut TokenTree>, Vec<&SessionPlanning>) = batch
            .iter_mut()
            .map(|j| (&mut j.tree, &*j.planning))
            .unzip();
        let extra = fused
            .as_ref()
            .map_or(0, |f| f.job.session.prefill_left().min(f.chunk));
        goodput.plan(&mut trees, &sessions, extra)
    };
    m.phase(Phase::Plan, start.elapsed().as_secs_f64());
    span.record("tokens", plan.tokens);
    span.record("proposed", plan.proposed);
    span.record("granted", plan.granted);
    span.record("expected_accepted", plan.expected);
    span.record("predicted_ms", plan.predicted_seconds * 1e3);
    m.forward_tokens.observe(plan.tokens as f64);
    m.nodes_proposed.inc_by(plan.proposed as u64);
    m.nodes_granted.inc_by(plan.granted as u64);
    m.expected_accepted.inc_by(plan.expected.max(0.0));
    for (job, grant) in batch.iter_mut().zip(plan.grants) {
        job.grant = Some(grant);
    }
    verify(model, batch, fused, goodput, last_forward, counters, &span);
}

/// Verifies a planned batch in one forward and answers every session.
fn verify(
    model: &Model,
    mut batch: Vec<StepJob>,
    mut fused: Option<Fused<'_>>,
    goodput: &mut Goodput,
    last_forward: &mut LastForward,
    counters: &Counters,
    span: &tracing::Span,
) {
    let m = &counters.metrics;
    let n = batch.len();
    let top_k = batch.iter().map(|j| j.top_k).max().unwrap_or(0);
    let tokens: usize = batch.iter().map(|j| j.tree.len()).sum();
    let result = {
        let mut items: Vec<(&mut Session, &TokenTree)> = batch
            .iter_mut()
            .map(|j| (j.session.as_mut(), &j.tree))
            .collect();
        let prefill = fused.as_mut().map(|f| PrefillChunk {
            session: f.job.session.as_mut(),
            max_tokens: f.chunk,
        });
        step_batch_fused(model, &mut items, prefill, top_k)
    };
    match result {
        Ok(FusedStep {
            steps: outcomes,
            times,
            prefilled,
        }) => {
            let now = Instant::now();
            *last_forward = Some(now);
            // Verification and commit follow the forward.
            let after = Duration::from_secs_f64((times.verify + times.commit).max(0.0));
            let forward = Duration::from_secs_f64(times.forward.max(0.0));
            let began = now.checked_sub(after + forward).unwrap_or(now);
            goodput.forward_done(n, tokens + prefilled, began, times.forward);
            if prefilled > 0 {
                m.prefill_tokens.inc_by(prefilled as u64);
                m.prefill_fused_tokens.inc_by(prefilled as u64);
                span.record("prefill_tokens", prefilled);
            }
            m.step_seconds.observe(times.forward);
            m.phase(Phase::Forward, times.forward);
            m.phase(Phase::Verify, times.verify);
            m.phase(Phase::Commit, times.commit);
            span.record("forward_ms", times.forward * 1e3);
            span.record("verify_ms", times.verify * 1e3);
            span.record("commit_ms", times.commit * 1e3);
            // One line per forward at debug level: what the step-time
            // model is fitted to (the span's fields carry the rest).
            tracing::debug!(
                tokens = tokens + prefilled,
                forward_ms = times.forward * 1e3,
                "forward"
            );
            m.batch_size.observe(n as f64);
            // The model's gauges move slowly: every 32nd forward is enough.
            if counters.batches.load(Ordering::Relaxed).is_multiple_of(32) {
                goodput.export(m);
            }
            counters.batches.fetch_add(1, Ordering::Relaxed);
            counters.steps.fetch_add(n as u64, Ordering::Relaxed);
            let planned = goodput.enabled();
            for (job, mut step) in batch.into_iter().zip(outcomes) {
                let StepJob {
                    session,
                    tree,
                    mut planning,
                    reply,
                    grant,
                    ..
                } = job;
                let grant = grant.unwrap_or(Granted {
                    offered: tree.draft_len(),
                    expected: 0.0,
                    kept: None,
                });
                m.accepted.inc_by(step.accepted as u64);
                goodput.learn(&mut planning, &tree, &step.verification.path, &grant);
                // The drafter reads the path against the tree it sent.
                for node in &mut step.verification.path {
                    *node = grant.original(*node);
                }
                let _ = reply.send(StepDone {
                    session,
                    result: Ok(step),
                    batch_size: n,
                    node_budget: planned.then(|| planning.node_budget() as u32),
                    planning,
                    granted: grant.granted_wire(),
                    forward_us: micros(times.forward),
                    batch_wait_us: micros(batch_wait(counters.window, times.forward).as_secs_f64()),
                });
            }
        }
        // A failed forward leaves every session as it was. Without the
        // chunk first (its prefill fails on its own, when it runs alone);
        // then one by one, so only the bad item fails.
        Err(_) if let Some(f) = fused => {
            *f.failed = true;
            verify(model, batch, None, goodput, last_forward, counters, span);
        }
        Err(_) if n > 1 => {
            for job in batch {
                verify(
                    model,
                    vec![job],
                    None,
                    goodput,
                    last_forward,
                    counters,
                    span,
                );
            }
        }
        Err(e) => {
            let job = batch.pop().expect("a batch of one");
            tracing::warn!(parent: &job.span, error = %e, "verify step failed");
            let _ = job.reply.send(StepDone {
                session: job.session,
                result: Err(step_error(e)),
                batch_size: 1,
                planning: job.planning,
                granted: None,
                node_budget: None,
                forward_us: 0,
                batch_wait_us: 0,
            });
        }
    }
}

/// A failed step's error: a grammar that fails mid-output (a limit of its
/// engine reached, say) is the request's to fix; anything else is ours.
fn step_error(e: specmesh_engine::EngineError) -> VerifierError {
    use specmesh_verify::VerifyError;
    match e {
        specmesh_engine::EngineError::Verify(
            v @ (VerifyError::Constraint(_) | VerifyError::NothingAllowed { .. }),
        ) => VerifierError::invalid("structured", v.to_string()),
        e => VerifierError::Model(e.to_string()),
    }
}

/// Seconds as whole microseconds for the wire (saturating).
fn micros(secs: f64) -> u32 {
    (secs * 1e6).round().clamp(0.0, f64::from(u32::MAX)) as u32
}
