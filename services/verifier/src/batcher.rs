//! The batching thread: the one place the target model runs. Sessions hand it
//! prefill and step jobs over a channel; it gathers the step jobs of
//! concurrent sessions into one batched forward (continuous batching) and
//! hands each session back with its result. A prefill runs a chunk at a
//! time (`--prefill-chunk-tokens`), each chunk inside the next batch's
//! forward (counted in the planner's tokens) or alone when no session
//! decodes: a long prompt arriving neither stalls the sessions already
//! decoding nor costs them forwards of its own.
//!
//! Sessions travel by value (`Box<Session>`), so no lock guards a KV cache:
//! whoever holds the box owns the cache.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use specmesh_engine::{FusedStep, PrefillChunk, Session, Step, step_batch_fused};
use specmesh_model::Model;
use specmesh_tree::TokenTree;
use tokio::sync::oneshot;

use crate::batch_metrics::Phase;
use crate::error::VerifierError;
use crate::goodput::{Goodput, Granted, SessionPlanning};
use crate::memory::{KvMemory, PrefixKey};
pub use prefill::PrefillDone;
use prefill::{PrefillJob, finish_prefill, next_prefill, prefill_alone};
use yielding::Yields;
pub use yielding::{Patience, YieldingWait};

/// A gap between forwards longer than this is idle time, not a step's.
const MAX_STEP_GAP: Duration = Duration::from_secs(1);

/// A batch waits for the decoding sessions still missing at most this
/// fraction of the last forward's time (and at least `--batch-window-us`).
/// Sessions whose trees come back a drafter round trip after a forward
/// (1–3 ms) would otherwise miss the next one, run in a forward of their
/// own and stay out of phase: measured on the 1.5B at 16 streams with a
/// 1 ms window, speculating batches held 4.3 sessions where plain ones
/// held 8.7, so every round cost two forwards where one would do.
/// Waiting a tenth of a forward costs the batch at most that.
const MAX_WAIT_FRACTION: f64 = 0.1;

#[derive(Debug, Clone, Copy)]
pub struct BatcherConfig {
    pub max_batch: usize,
    /// How long a batch waits for the trees of other decoding sessions.
    pub window: Duration,
    /// Context tokens a prefill computes per forward (0: a whole prompt at
    /// once).
    pub prefill_chunk: usize,
}

/// Counters shared with the service (stats, batching decisions).
#[derive(Debug, Default)]
pub struct Counters {
    /// Sessions between prefill and their end: the batch waits for these.
    pub decoding: Arc<AtomicUsize>,
    pub steps: AtomicU64,
    pub batches: AtomicU64,
    /// Batch sizes, forward times and prefilled tokens, for Prometheus.
    pub metrics: crate::batch_metrics::BatchMetrics,
    /// `--batch-window-us`: with a forward's time, how long the next
    /// batch waits for missing trees ([`batch_wait`]), which each outcome
    /// tells the drafter.
    pub window: Duration,
    /// Sessions waiting for trees the batch may call them in without
    /// (see [`yielding`]).
    pub yields: Yields,
}

/// How long a batch waits for the decoding sessions still missing after a
/// forward of `forward_secs`: see [`MAX_WAIT_FRACTION`].
fn batch_wait(window: Duration, forward_secs: f64) -> Duration {
    window.max(Duration::from_secs_f64(
        MAX_WAIT_FRACTION * forward_secs.max(0.0),
    ))
}

pub struct StepDone {
    pub session: Box<Session>,
    /// The step, its path in the drafter's tree's indices (the tree as
    /// sent, before any pruning).
    pub result: Result<Step, VerifierError>,
    /// Sessions verified in the same forward.
    pub batch_size: usize,
    pub planning: Box<SessionPlanning>,
    /// The verified drafted nodes (drafter's indices, ascending) when the
    /// planner verified only part of the tree.
    pub granted: Option<Vec<u32>>,
    /// Drafted nodes the planner expects to grant next step; `None` with
    /// the planner off.
    pub node_budget: Option<u32>,
    /// Microseconds of the batched forward (0 when it failed).
    pub forward_us: u32,
    /// Microseconds the next batch waits for a missing tree.
    pub batch_wait_us: u32,
}

// A step job is moved once per step through the channel and its tree is
// the bulk of it; boxing the tree would add an allocation per step.
#[allow(clippy::large_enum_variant)]
enum Job {
    Prefill {
        session: Box<Session>,
        prefix: Option<PrefixKey>,
        span: tracing::Span,
        reply: oneshot::Sender<PrefillDone>,
    },
    Step {
        session: Box<Session>,
        tree: TokenTree,
        top_k: usize,
        planning: Box<SessionPlanning>,
        span: tracing::Span,
        reply: oneshot::Sender<StepDone>,
    },
    /// A session registered a tree wait ([`YieldingWait`]): look again at
    /// who is missing.
    Wake,
}

/// A handle to the batching thread; cheap to clone.
#[derive(Clone, Debug)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
    counters: Arc<Counters>,
}

impl Batcher {
    pub fn start(
        model: Arc<Model>,
        config: BatcherConfig,
        goodput: Goodput,
        memory: KvMemory,
    ) -> Batcher {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters {
            window: config.window,
            ..Counters::default()
        });
        let c = Arc::clone(&counters);
        std::thread::Builder::new()
            .name("specmesh-batcher".into())
            .spawn(move || run(&model, config, goodput, &memory, &rx, &c))
            .expect("spawning the batching thread");
        Batcher { tx, counters }
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Prefills `session`, from the prefix cache as far as `prefix` finds
    /// it, publishing its blocks as they complete.
    pub async fn prefill(
        &self,
        session: Box<Session>,
        prefix: Option<PrefixKey>,
    ) -> Result<PrefillDone, VerifierError> {
        let (reply, rx) = oneshot::channel();
        let span = tracing::Span::current();
        self.tx
            .send(Job::Prefill {
                session,
                prefix,
                span,
                reply,
            })
            .map_err(|_| VerifierError::BatcherGone)?;
        rx.await.map_err(|_| VerifierError::BatcherGone)
    }

    /// Registers a session's wait for its tree, which the batch may call
    /// in ([`YieldingWait::called`]) as `patience` says.
    pub fn yielding_wait(&self, patience: Patience) -> YieldingWait {
        YieldingWait::register(&self.counters, &self.tx, patience)
    }

    pub async fn step(
        &self,
        session: Box<Session>,
        tree: TokenTree,
        top_k: usize,
        planning: Box<SessionPlanning>,
    ) -> Result<StepDone, VerifierError> {
        let (reply, rx) = oneshot::channel();
        let span = tracing::Span::current();
        self.tx
            .send(Job::Step {
                session,
                tree,
                top_k,
                planning,
                span,
                reply,
            })
            .map_err(|_| VerifierError::BatcherGone)?;
        rx.await.map_err(|_| VerifierError::BatcherGone)
    }
}

struct StepJob {
    session: Box<Session>,
    tree: TokenTree,
    top_k: usize,
    planning: Box<SessionPlanning>,
    span: tracing::Span,
    reply: oneshot::Sender<StepDone>,
    queued: Instant,
    /// What the planner granted (set when the batch is planned).
    grant: Option<Granted>,
}

/// When the last forward ended, while nothing but steps ran since: the
/// next forward's start then measures a step's non-forward time.
type LastForward = Option<Instant>;

fn run(
    model: &Model,
    config: BatcherConfig,
    mut goodput: Goodput,
    memory: &KvMemory,
    rx: &mpsc::Receiver<Job>,
    counters: &Counters,
) {
    let mut last_forward: LastForward = None;
    // The last forward's seconds, for how long a batch waits.
    let mut forward_secs = 0.0f64;
    let mut steps: Vec<StepJob> = Vec::new();
    let mut prefills: VecDeque<PrefillJob> = VecDeque::new();
    let take = |job: Job, steps: &mut Vec<StepJob>, prefills: &mut VecDeque<PrefillJob>| match job {
        Job::Prefill {
            session,
            prefix,
            span,
            reply,
        } => {
            let mut job = PrefillJob {
                reused: session.prefilled(),
                session,
                prefix,
                span,
                reply,
                started: Instant::now(),
            };
            // What is cached is taken at once, so the shortest-first choice
            // ranks the job by what it has left to compute.
            job.catch_up(memory);
            prefills.push_back(job);
        }
        Job::Step {
            session,
            tree,
            top_k,
            planning,
            span,
            reply,
        } => steps.push(StepJob {
            session,
            tree,
            top_k,
            planning,
            span,
            reply,
            queued: Instant::now(),
            grant: None,
        }),
        Job::Wake => {}
    };
    loop {
        // Block only when there is nothing to do.
        if steps.is_empty() && prefills.is_empty() {
            // Waiting for a decoding session's next tree is part of its
            // step; waiting with none decoding is idle time.
            if counters.decoding.load(Ordering::Relaxed) == 0 {
                last_forward = None;
            }
            match rx.recv() {
                Ok(job) => take(job, &mut steps, &mut prefills),
                Err(_) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            take(job, &mut steps, &mut prefills);
        }
        if steps.is_empty() && prefills.is_empty() {
            // Only wakes: nothing to run.
            continue;
        }
        // Steps wait for the other decoding sessions, whose trees are
        // usually a drafter round trip away: up to the window, or a tenth
        // of a forward when that is longer (see `MAX_WAIT_FRACTION`). A
        // waiting prefill's next chunk rides in the same forward, so it
        // waits too while any session decodes (it runs alone after that).
        // Sessions waiting for trees are called in, root-only, when their
        // trees no longer pay for the wait (see `yielding`).
        let wait = batch_wait(config.window, forward_secs);
        let mut deadline = Instant::now() + wait;
        let mut late_called = false;
        let yields = &counters.yields;
        loop {
            let want = counters
                .decoding
                .load(Ordering::Relaxed)
                .min(config.max_batch);
            if steps.len() >= want || (steps.is_empty() && prefills.is_empty()) {
                break;
            }
            let (others, late) = (
                yields.waiting(Patience::Others),
                yields.waiting(Patience::Deadline),
            );
            if others > 0 && !steps.is_empty() && steps.len() + others + late >= want {
                yields.call(Patience::Others);
            }
            let now = Instant::now();
            if now >= deadline {
                if late_called || steps.is_empty() || others + late == 0 {
                    break;
                }
                // Called in, they come within a window.
                yields.call(Patience::Deadline);
                late_called = true;
                deadline = now + config.window;
                continue;
            }
            match rx.recv_timeout(deadline - now) {
                Ok(job) => take(job, &mut steps, &mut prefills),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        // Until the next batch forms, nobody is called.
        yields.reset();
        next_prefill(&mut prefills, memory);
        let chunk = if config.prefill_chunk == 0 {
            usize::MAX
        } else {
            config.prefill_chunk
        };
        if steps.is_empty() {
            // No step to ride with: one chunk of the oldest prefill alone.
            prefill_alone(model, &mut prefills, chunk, &counters.metrics, memory);
            // A chunk ran between two forwards: that gap is not a step's.
            last_forward = None;
            continue;
        }
        // The first batch carries the oldest prefill's next chunk, so
        // running sessions wait for no forward of their own for it,
        // however long a new prompt.
        let mut failed = false;
        let mut fused = prefills.front_mut().map(|p| Fused {
            job: p,
            chunk,
            failed: &mut failed,
        });
        while !steps.is_empty() {
            let n = steps.len().min(config.max_batch);
            let batch: Vec<StepJob> = steps.drain(..n).collect();
            let started = Instant::now();
            run_batch(
                model,
                batch,
                fused.take(),
                &mut goodput,
                &mut last_forward,
                counters,
            );
            forward_secs = started
                .elapsed()
                .as_secs_f64()
                .min(MAX_STEP_GAP.as_secs_f64());
        }
        if failed {
            // The fused forward failed and its steps ran without the
            // chunk: the chunk alone now answers its prefill (an error
            // fails that prefill, not the others' steps).
            prefill_alone(model, &mut prefills, chunk, &counters.metrics, memory);
            last_forward = None;
        } else if let Some(p) = prefills.front_mut() {
            p.publish(memory);
            if p.session.prefill_left() == 0 {
                finish_prefill(&mut prefills, Ok(()), memory);
            }
        }
    }
}

/// A prefill's chunk riding in a batch of steps.
struct Fused<'a> {
    job: &'a mut PrefillJob,
    chunk: usize,
    /// Set when the forward failed with the chunk in it.
    failed: &'a mut bool,
}

/// Plans, verifies and answers one batch of steps.
fn run_batch(
    model: &Model,
    mut batch: Vec<StepJob>,
    fused: Option<Fused<'_>>,
    goodput: &mut Goodput,
    last_forward: &mut LastForward,
    counters: &Counters,
) {
    let m = &counters.metrics;
    let start = Instant::now();
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
            *last_forward = Some(Instant::now());
            goodput.observe_forward(n, tokens + prefilled, times.forward);
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

mod prefill;
pub mod yielding;

#[cfg(test)]
mod tests;
