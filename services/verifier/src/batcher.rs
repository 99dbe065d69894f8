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
//!
//! This module gathers batches; `forward` runs one (plan, forward,
//! answers), `prefill` keeps the prefill queue, and `yielding` the tree
//! waits a batch may call in.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use specmesh_engine::{Session, Step};
use specmesh_model::Model;
use specmesh_tree::TokenTree;
use tokio::sync::oneshot;

use crate::drafting::DraftingLog;
use crate::error::VerifierError;
use crate::goodput::{Goodput, Granted, SessionPlanning};
use crate::memory::{KvMemory, PrefixKey};
use forward::{Fused, run_batch};
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
    /// When drafters drafted, as their trees report it (see
    /// [`crate::drafting`]).
    pub drafting: DraftingLog,
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

mod forward;
mod prefill;
pub mod yielding;

#[cfg(test)]
mod tests;
