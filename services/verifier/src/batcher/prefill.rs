//! The prefill queue of the batching thread: which waiting prefill runs
//! next (shortest first, with aging), what each takes from the prefix
//! cache before a chunk and publishes after one, a chunk run alone, and
//! the answer once a prefill is complete or failed.

use std::collections::VecDeque;
use std::time::Instant;

use specmesh_engine::Session;
use specmesh_model::Model;
use tokio::sync::oneshot;

use crate::batch_metrics::BatchMetrics;
use crate::error::VerifierError;
use crate::memory::{KvMemory, PrefixKey};

/// A prefill's answer: the session back, and what its prefill took.
pub struct PrefillDone {
    pub session: Box<Session>,
    /// The session's prefix key, back for publishing its end.
    pub prefix: Option<PrefixKey>,
    /// Context tokens taken from the prefix cache, and seconds.
    pub result: Result<(usize, f64), VerifierError>,
}

/// A prefill in progress: computed a chunk at a time, between batches.
pub(super) struct PrefillJob {
    pub(super) session: Box<Session>,
    pub(super) prefix: Option<PrefixKey>,
    pub(super) span: tracing::Span,
    pub(super) reply: oneshot::Sender<PrefillDone>,
    /// Context tokens taken from the prefix cache so far.
    pub(super) reused: usize,
    pub(super) started: Instant,
}

impl PrefillJob {
    /// Takes what the prefix cache holds past this prefill's progress
    /// (what other prefills published since it last looked).
    pub(super) fn catch_up(&mut self, memory: &KvMemory) {
        if let Some(key) = self.prefix.as_mut() {
            let t0 = Instant::now();
            let taken = memory.import(key, &mut self.session);
            if taken > 0 {
                self.reused += taken;
                tracing::debug!(
                    parent: &self.span,
                    tokens = taken,
                    ms = t0.elapsed().as_secs_f64() * 1e3,
                    "prefix cache hit"
                );
            }
        }
    }

    /// Publishes the blocks completed by the last chunk.
    pub(super) fn publish(&mut self, memory: &KvMemory) {
        publish(&mut self.prefix, &self.session, memory);
    }

    /// Which prefill runs next: the fewest tokens left, weighed by how
    /// long each has waited (tokens left / (1 + seconds waited)), so a
    /// follow-up's few new tokens are not held behind another session's
    /// long prompt, and a long prompt is not starved by a stream of short
    /// ones.
    fn priority(&self, now: Instant) -> f64 {
        let waited = now.saturating_duration_since(self.started).as_secs_f64();
        self.session.prefill_left() as f64 / (1.0 + waited)
    }
}

fn publish(prefix: &mut Option<PrefixKey>, session: &Session, memory: &KvMemory) {
    if let Some(key) = prefix.as_mut() {
        memory.publish_prefill(key, session);
    }
}

/// Puts the prefill to run next at the front, after dropping those whose
/// caller left and answering those the prefix cache completed.
pub(super) fn next_prefill(prefills: &mut VecDeque<PrefillJob>, memory: &KvMemory) {
    loop {
        // A prefill whose caller left is not computed any further.
        prefills.retain(|p| !p.reply.is_closed());
        let now = Instant::now();
        let Some(best) = (0..prefills.len()).min_by(|&a, &b| {
            prefills[a]
                .priority(now)
                .total_cmp(&prefills[b].priority(now))
        }) else {
            return;
        };
        if best != 0 {
            let job = prefills.remove(best).expect("a queued prefill");
            prefills.push_front(job);
        }
        let front = prefills.front_mut().expect("the chosen prefill");
        front.catch_up(memory);
        if front.session.prefill_left() > 0 {
            return;
        }
        finish_prefill(prefills, Ok(()), memory);
    }
}

/// One chunk of the oldest prefill in a forward of its own.
pub(super) fn prefill_alone(
    model: &Model,
    prefills: &mut VecDeque<PrefillJob>,
    chunk: usize,
    metrics: &BatchMetrics,
    memory: &KvMemory,
) {
    let chunked = prefills.front_mut().map(|job| {
        let _e = job.span.enter();
        let _c = tracing::info_span!("prefill_chunk", from = job.session.prefilled()).entered();
        let before = job.session.prefilled();
        let chunked = job.session.prefill_chunk(model, chunk);
        let done = job.session.prefilled().saturating_sub(before);
        metrics.prefill_tokens.inc_by(done as u64);
        publish(&mut job.prefix, &job.session, memory);
        chunked
    });
    match chunked {
        None | Some(Ok(false)) => {}
        Some(Ok(true)) => finish_prefill(prefills, Ok(()), memory),
        Some(Err(e)) => finish_prefill(prefills, Err(VerifierError::Model(e.to_string())), memory),
    }
}

/// Answers the front prefill, done or failed.
pub(super) fn finish_prefill(
    prefills: &mut VecDeque<PrefillJob>,
    result: Result<(), VerifierError>,
    memory: &KvMemory,
) {
    let job = prefills.pop_front().expect("the front job");
    if result.is_ok() {
        memory.record_query(job.session.tokens().len() - 1, job.reused);
    }
    let result = result.map(|()| (job.reused, job.started.elapsed().as_secs_f64()));
    let _ = job.reply.send(PrefillDone {
        session: job.session,
        prefix: job.prefix,
        result,
    });
}
