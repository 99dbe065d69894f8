//! Process-wide counters of the drafter, shared by every stream through an
//! `Arc`. They are plain relaxed atomics: each is exact on its own, and a
//! [`StatsSnapshot`] is not a consistent cut across them (nor needs to be:
//! they become independent metrics). Prometheus reads them through
//! [`crate::metrics`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Live counters; see the module docs.
#[derive(Debug)]
pub struct Stats {
    sessions_open: AtomicU64,
    sessions_total: AtomicU64,
    sessions_refused: AtomicU64,
    sessions_failed: AtomicU64,
    trees_sent: AtomicU64,
    drafted_nodes: AtomicU64,
    accepted_nodes: AtomicU64,
    stale_outcomes: AtomicU64,
    propose_nanos: AtomicU64,
    outputs_indexed: AtomicU64,
    draft_prefix_queried: AtomicU64,
    draft_prefix_hits: AtomicU64,
    /// Each tree's drafting time and size, for Prometheus.
    pub(crate) propose_seconds: prometheus::Histogram,
    pub(crate) tree_nodes: prometheus::Histogram,
    /// Drafting through text: mapping time per tree, and target tokens
    /// dropped at the end of a draft's text.
    pub(crate) retokenize_seconds: prometheus::Histogram,
    pub(crate) boundary_lost: prometheus::IntCounter,
}

impl Default for Stats {
    fn default() -> Stats {
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            prometheus::Histogram::with_opts(
                prometheus::HistogramOpts::new(name, help).buckets(buckets),
            )
            .expect("a valid histogram")
        };
        Stats {
            sessions_open: AtomicU64::default(),
            sessions_total: AtomicU64::default(),
            sessions_refused: AtomicU64::default(),
            sessions_failed: AtomicU64::default(),
            trees_sent: AtomicU64::default(),
            drafted_nodes: AtomicU64::default(),
            accepted_nodes: AtomicU64::default(),
            stale_outcomes: AtomicU64::default(),
            propose_nanos: AtomicU64::default(),
            outputs_indexed: AtomicU64::default(),
            draft_prefix_queried: AtomicU64::default(),
            draft_prefix_hits: AtomicU64::default(),
            propose_seconds: histogram(
                "specmesh_drafter_propose_seconds",
                "Seconds to draft one tree.",
                prometheus::exponential_buckets(0.000_01, 4.0, 10).expect("valid buckets"),
            ),
            tree_nodes: histogram(
                "specmesh_drafter_tree_nodes",
                "Drafted nodes per tree sent (the root not counted).",
                vec![0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
            ),
            retokenize_seconds: histogram(
                "specmesh_drafter_retokenize_seconds",
                "Seconds per tree spent mapping between the target's and the draft model's \
                 vocabularies (a draft model of another vocabulary, drafting through text).",
                prometheus::exponential_buckets(0.000_001, 4.0, 10).expect("valid buckets"),
            ),
            boundary_lost: prometheus::IntCounter::new(
                "specmesh_drafter_boundary_lost_tokens_total",
                "Target tokens dropped from trees drafted through text because the draft's \
                 text ended inside them.",
            )
            .expect("valid counter"),
        }
    }
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Draft streams open now.
    pub sessions_open: u64,
    /// Draft streams started (a valid `start` received) since the process began.
    pub sessions_total: u64,
    /// Streams refused because every session slot was taken.
    pub sessions_refused: u64,
    /// Streams ended by an error (bad input, timeout, internal).
    pub sessions_failed: u64,
    /// Trees sent, root-only ones included.
    pub trees_sent: u64,
    /// Drafted nodes sent (roots excluded).
    pub drafted_nodes: u64,
    /// Drafted nodes the verifiers reported accepted.
    pub accepted_nodes: u64,
    /// Outcomes ignored as stale or duplicated.
    pub stale_outcomes: u64,
    /// Time spent proposing trees, over all sessions.
    pub propose_time: Duration,
    /// Finished sessions whose output joined the global index.
    pub outputs_indexed: u64,
    /// Context tokens sessions looked up in the draft model's prefix cache
    /// as they started, and of those, tokens found there (whose draft KV
    /// was copied rather than computed).
    pub draft_prefix_queried_tokens: u64,
    pub draft_prefix_hit_tokens: u64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            sessions_open: get(&self.sessions_open),
            sessions_total: get(&self.sessions_total),
            sessions_refused: get(&self.sessions_refused),
            sessions_failed: get(&self.sessions_failed),
            trees_sent: get(&self.trees_sent),
            drafted_nodes: get(&self.drafted_nodes),
            accepted_nodes: get(&self.accepted_nodes),
            stale_outcomes: get(&self.stale_outcomes),
            propose_time: Duration::from_nanos(get(&self.propose_nanos)),
            outputs_indexed: get(&self.outputs_indexed),
            draft_prefix_queried_tokens: get(&self.draft_prefix_queried),
            draft_prefix_hit_tokens: get(&self.draft_prefix_hits),
        }
    }

    /// Counts a started session as open until the guard drops, however the
    /// stream ends.
    pub(crate) fn open_session(self: &Arc<Self>) -> OpenSession {
        add(&self.sessions_total, 1);
        add(&self.sessions_open, 1);
        OpenSession(Arc::clone(self))
    }

    pub(crate) fn session_refused(&self) {
        add(&self.sessions_refused, 1);
    }

    pub(crate) fn session_failed(&self) {
        add(&self.sessions_failed, 1);
    }

    pub(crate) fn tree_sent(&self, drafted: usize, took: Duration) {
        self.propose_seconds.observe(took.as_secs_f64());
        self.tree_nodes.observe(drafted as f64);
        add(&self.trees_sent, 1);
        add(&self.drafted_nodes, drafted as u64);
        add(
            &self.propose_nanos,
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
        );
    }

    pub(crate) fn retokenized(&self, r: crate::session::Retokenized) {
        self.retokenize_seconds.observe(r.took.as_secs_f64());
        self.boundary_lost.inc_by(r.lost);
    }

    pub(crate) fn accepted(&self, nodes: usize) {
        add(&self.accepted_nodes, nodes as u64);
    }

    pub(crate) fn stale_outcome(&self) {
        add(&self.stale_outcomes, 1);
    }

    pub(crate) fn draft_prefix_lookup(&self, queried: usize, hit: usize) {
        add(&self.draft_prefix_queried, queried as u64);
        add(&self.draft_prefix_hits, hit as u64);
    }

    pub(crate) fn output_indexed(&self) {
        add(&self.outputs_indexed, 1);
    }
}

/// Holds one `sessions_open`; see [`Stats::open_session`].
#[derive(Debug)]
pub(crate) struct OpenSession(Arc<Stats>);

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.0.sessions_open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_session_is_counted_until_dropped() {
        let s = Arc::new(Stats::default());
        {
            let _open = s.open_session();
            s.tree_sent(3, Duration::from_micros(5));
            assert_eq!(s.snapshot().sessions_open, 1);
        }
        let snap = s.snapshot();
        assert_eq!((snap.sessions_open, snap.sessions_total), (0, 1));
        assert_eq!((snap.trees_sent, snap.drafted_nodes), (1, 3));
        assert_eq!(snap.propose_time, Duration::from_micros(5));
    }
}
