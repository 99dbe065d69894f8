//! The batching thread: the one place the target model runs. Sessions hand it
//! prefill and step jobs over a channel; it gathers the step jobs of
//! concurrent sessions into one batched forward (continuous batching) and
//! hands each session back with its result.
//!
//! Sessions travel by value (`Box<Session>`), so no lock guards a KV cache:
//! whoever holds the box owns the cache.

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
}

/// Counters shared with the service (stats, batching decisions).
#[derive(Debug, Default)]
pub struct Counters {
    /// Sessions between prefill and their end: the batch waits for these.
    pub decoding: Arc<AtomicUsize>,
    pub steps: AtomicU64,
    pub batches: AtomicU64,
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

fn run(model: &Model, config: BatcherConfig, rx: &mpsc::Receiver<Job>, counters: &Counters) {
    let mut steps: Vec<StepJob> = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut prefills = Vec::new();
        let mut take = |job: Job, steps: &mut Vec<StepJob>| match job {
            Job::Prefill {
                session,
                span,
                reply,
            } => prefills.push((session, span, reply)),
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
        take(first, &mut steps);
        // Everything already queued, then (for steps) up to the window for
        // the other decoding sessions, whose trees are usually a drafter
        // round trip away.
        while let Ok(job) = rx.try_recv() {
            take(job, &mut steps);
        }
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
                Ok(job) => take(job, &mut steps),
                Err(_) => break,
            }
        }
        for (mut session, span, reply) in prefills {
            let _e = span.enter();
            let result = session
                .prefill(model)
                .map_err(|e| VerifierError::Model(e.to_string()));
            let _ = reply.send(PrefillDone { session, result });
        }
        while !steps.is_empty() {
            let n = steps.len().min(config.max_batch);
            let batch: Vec<StepJob> = steps.drain(..n).collect();
            run_batch(model, batch, counters);
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
        step_batch(model, &mut items, top_k)
    };
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
