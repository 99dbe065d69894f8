//! The batching thread: the one place the target model runs. Sessions hand it
//! prefill and step jobs over a channel; it gathers the step jobs of
//! concurrent sessions into one batched forward (continuous batching) and
//! hands each session back with its result. A prefill runs a chunk at a
//! time between rounds of steps (`--prefill-chunk-tokens`), so a long
//! prompt arriving does not stall the sessions already decoding.
//!
//! Sessions travel by value (`Box<Session>`), so no lock guards a KV cache:
//! whoever holds the box owns the cache.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use specmesh_engine::{Session, Step, step_batch};
use specmesh_model::Model;
use specmesh_tree::TokenTree;
use tokio::sync::oneshot;

use crate::error::VerifierError;

#[derive(Debug, Clone, Copy)]
pub struct BatcherConfig {
    pub max_batch: usize,
    /// How long a batch waits for the trees of other decoding sessions.
    pub window: Duration,
    /// Context tokens a prefill computes between two rounds of steps (0:
    /// a whole prompt at once).
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
    pub metrics: crate::metrics::BatchMetrics,
}

pub struct PrefillDone {
    pub session: Box<Session>,
    pub result: Result<(usize, f64), VerifierError>,
}

pub struct StepDone {
    pub session: Box<Session>,
    pub result: Result<Step, VerifierError>,
    /// Sessions verified in the same forward.
    pub batch_size: usize,
}

enum Job {
    Prefill {
        session: Box<Session>,
        span: tracing::Span,
        reply: oneshot::Sender<PrefillDone>,
    },
    Step {
        session: Box<Session>,
        tree: TokenTree,
        top_k: usize,
        span: tracing::Span,
        reply: oneshot::Sender<StepDone>,
    },
}

/// A handle to the batching thread; cheap to clone.
#[derive(Clone, Debug)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
    counters: Arc<Counters>,
}

impl Batcher {
    pub fn start(model: Arc<Model>, config: BatcherConfig) -> Batcher {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let c = Arc::clone(&counters);
        std::thread::Builder::new()
            .name("specmesh-batcher".into())
            .spawn(move || run(&model, config, &rx, &c))
            .expect("spawning the batching thread");
        Batcher { tx, counters }
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    pub async fn prefill(&self, session: Box<Session>) -> Result<PrefillDone, VerifierError> {
        let (reply, rx) = oneshot::channel();
        let span = tracing::Span::current();
        self.tx
            .send(Job::Prefill {
                session,
                span,
                reply,
            })
            .map_err(|_| VerifierError::BatcherGone)?;
        rx.await.map_err(|_| VerifierError::BatcherGone)
    }

    pub async fn step(
        &self,
        session: Box<Session>,
        tree: TokenTree,
        top_k: usize,
    ) -> Result<StepDone, VerifierError> {
        let (reply, rx) = oneshot::channel();
        let span = tracing::Span::current();
        self.tx
            .send(Job::Step {
                session,
                tree,
                top_k,
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
    span: tracing::Span,
    reply: oneshot::Sender<StepDone>,
}

/// A prefill in progress: computed a chunk at a time, between batches.
struct PrefillJob {
    session: Box<Session>,
    span: tracing::Span,
    reply: oneshot::Sender<PrefillDone>,
    /// Tokens kept from a cache: the KV it started with.
    reused: usize,
    started: Instant,
}

fn run(model: &Model, config: BatcherConfig, rx: &mpsc::Receiver<Job>, counters: &Counters) {
    let mut steps: Vec<StepJob> = Vec::new();
    let mut prefills: VecDeque<PrefillJob> = VecDeque::new();
    let take = |job: Job, steps: &mut Vec<StepJob>, prefills: &mut VecDeque<PrefillJob>| match job {
        Job::Prefill {
            session,
            span,
            reply,
        } => prefills.push_back(PrefillJob {
            reused: session.prefilled(),
            session,
            span,
            reply,
            started: Instant::now(),
        }),
        Job::Step {
            session,
            tree,
            top_k,
            span,
            reply,
        } => steps.push(StepJob {
            session,
            tree,
            top_k,
            span,
            reply,
        }),
    };
    loop {
        // Block only when there is nothing to do.
        if steps.is_empty() && prefills.is_empty() {
            match rx.recv() {
                Ok(job) => take(job, &mut steps, &mut prefills),
                Err(_) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            take(job, &mut steps, &mut prefills);
        }
        // Steps wait up to the window for the other decoding sessions,
        // whose trees are usually a drafter round trip away; not while a
        // prefill is waiting: its next chunk runs in that time instead.
        if prefills.is_empty() {
            let deadline = Instant::now() + config.window;
            loop {
                let want = counters
                    .decoding
                    .load(Ordering::Relaxed)
                    .min(config.max_batch);
                if steps.is_empty() || steps.len() >= want {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                match rx.recv_timeout(deadline - now) {
                    Ok(job) => take(job, &mut steps, &mut prefills),
                    Err(_) => break,
                }
            }
        }
        while !steps.is_empty() {
            let n = steps.len().min(config.max_batch);
            let batch: Vec<StepJob> = steps.drain(..n).collect();
            run_batch(model, batch, counters);
        }
        // Then one chunk of the oldest prefill, so running sessions wait
        // at most a chunk for their next step, however long a new prompt.
        if let Some(job) = prefills.front_mut() {
            let chunk = if config.prefill_chunk == 0 {
                usize::MAX
            } else {
                config.prefill_chunk
            };
            let done = if job.reply.is_closed() {
                // The session is gone (its caller left): stop computing it.
                None
            } else {
                let _e = job.span.enter();
                let _c =
                    tracing::info_span!("prefill_chunk", from = job.session.prefilled()).entered();
                let before = job.session.prefilled();
                let chunked = job.session.prefill_chunk(model, chunk);
                let done = job.session.prefilled().saturating_sub(before);
                counters.metrics.prefill_tokens.inc_by(done as u64);
                match chunked {
                    Ok(false) => continue,
                    Ok(true) => Some(Ok((job.reused, job.started.elapsed().as_secs_f64()))),
                    Err(e) => Some(Err(VerifierError::Model(e.to_string()))),
                }
            };
            let job = prefills.pop_front().expect("the front job");
            if let Some(result) = done {
                let _ = job.reply.send(PrefillDone {
                    session: job.session,
                    result,
                });
            }
        }
    }
}

fn run_batch(model: &Model, mut batch: Vec<StepJob>, counters: &Counters) {
    let n = batch.len();
    let top_k = batch.iter().map(|j| j.top_k).max().unwrap_or(0);
    let span = tracing::info_span!("verify_batch", sessions = n, tokens = tracing::field::Empty);
    let _e = span.enter();
    let tokens: usize = batch.iter().map(|j| j.tree.len()).sum();
    span.record("tokens", tokens);
    for job in &batch {
        span.follows_from(&job.span);
    }
    let result = {
        let mut items: Vec<(&mut Session, &TokenTree)> = batch
            .iter_mut()
            .map(|j| (j.session.as_mut(), &j.tree))
            .collect();
        let t0 = Instant::now();
        let result = step_batch(model, &mut items, top_k);
        counters
            .metrics
            .step_seconds
            .observe(t0.elapsed().as_secs_f64());
        result
    };
    counters.metrics.batch_size.observe(n as f64);
    counters.batches.fetch_add(1, Ordering::Relaxed);
    counters.steps.fetch_add(n as u64, Ordering::Relaxed);
    match result {
        Ok(outcomes) => {
            for (job, step) in batch.into_iter().zip(outcomes) {
                let _ = job.reply.send(StepDone {
                    session: job.session,
                    result: Ok(step),
                    batch_size: n,
                });
            }
        }
        // One bad item fails the whole forward and leaves every session as
        // it was: verify them one by one so only the bad one fails.
        Err(_) if n > 1 => {
            for job in batch {
                run_batch(model, vec![job], counters);
            }
        }
        Err(e) => {
            let job = batch.pop().expect("a batch of one");
            tracing::warn!(parent: &job.span, error = %e, "verify step failed");
            let _ = job.reply.send(StepDone {
                session: job.session,
                result: Err(VerifierError::Model(e.to_string())),
                batch_size: 1,
            });
        }
    }
}
