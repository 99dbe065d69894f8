//! The metrics the batching thread records as each forward runs: batch
//! sizes, step times, where a step's time goes, and what the goodput
//! planner decided. Registered with the scrape-time ones of
//! [`crate::metrics`].

use prometheus::{
    Counter, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    Opts, Registry,
};
use specmesh_server::metrics::register;

/// What the batching thread records, per forward.
#[derive(Debug, Clone)]
pub struct BatchMetrics {
    /// Sessions verified in one forward.
    pub batch_size: Histogram,
    /// Seconds of one batched verify forward.
    pub step_seconds: Histogram,
    /// Context tokens prefilled (reused ones not counted).
    pub prefill_tokens: IntCounter,
    /// Of those, the ones computed inside a batch of steps' forward.
    pub prefill_fused_tokens: IntCounter,
    /// Where a verify step's time goes, by phase (see [`Phase`]).
    pub phases: HistogramVec,
    /// Tokens in one batched verify forward (roots and granted nodes).
    pub forward_tokens: Histogram,
    /// Drafted nodes proposed by drafters and granted by the planner.
    pub nodes_proposed: IntCounter,
    pub nodes_granted: IntCounter,
    /// Accepted drafted tokens the planner expected, and those accepted.
    pub expected_accepted: Counter,
    pub accepted: IntCounter,
    /// The planner's step-time model: predicted seconds of a forward over
    /// `tokens` tokens, and of a step outside its forward.
    pub model_forward: GaugeVec,
    pub model_fixed: Gauge,
    /// Seconds one more speculating session adds to a step (measured).
    pub overhead_per_session: Gauge,
    /// Forward seconds one second of concurrent drafting adds, and the
    /// share of drafting that ran during forwards (measured; see
    /// `specmesh_planner::contention`).
    pub drafting_slowdown: Gauge,
    pub drafting_overlap: Gauge,
    /// Steps that went on root-only because their batch called them in
    /// before their tree came (see `batcher::yielding`), by patience.
    pub trees_yielded: IntCounterVec,
}

/// The phases of a verify step, as `specmesh_verify_phase_seconds` labels
/// them. Per session step: `tree_wait` (for the drafter's tree),
/// `validate` (checking and fitting it), `queue` (in the batcher before its
/// forward), `report` (streaming the commit and the outcome). Per batched
/// forward: `plan` (the goodput planner), `forward`, `verify` (sampling
/// and acceptance), `commit` (KV bookkeeping and stop rules), and `gap`:
/// between one forward's end and the next one's start while sessions
/// decode, the whole of a step that is not its forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    TreeWait,
    Validate,
    Queue,
    Report,
    Plan,
    Forward,
    Verify,
    Commit,
    Gap,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::TreeWait => "tree_wait",
            Phase::Validate => "validate",
            Phase::Queue => "queue",
            Phase::Report => "report",
            Phase::Plan => "plan",
            Phase::Forward => "forward",
            Phase::Verify => "verify",
            Phase::Commit => "commit",
            Phase::Gap => "gap",
        }
    }
}

impl BatchMetrics {
    /// Records `seconds` spent in `phase`.
    pub fn phase(&self, phase: Phase, seconds: f64) {
        self.phases
            .with_label_values(&[phase.label()])
            .observe(seconds);
    }
}

impl BatchMetrics {
    pub fn new() -> BatchMetrics {
        let batch_size = HistogramOpts::new(
            "specmesh_verify_batch_size",
            "Sessions verified in one batched forward.",
        )
        .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        let step = HistogramOpts::new(
            "specmesh_verify_step_seconds",
            "Seconds of one batched verify forward (every session's tree in it).",
        )
        .buckets(prometheus::exponential_buckets(0.002, 2.0, 14).expect("valid buckets"));
        BatchMetrics {
            batch_size: Histogram::with_opts(batch_size).expect("valid histogram"),
            step_seconds: Histogram::with_opts(step).expect("valid histogram"),
            prefill_tokens: IntCounter::new(
                "specmesh_prefill_tokens_total",
                "Context tokens prefilled (tokens reused from a kept cache are not).",
            )
            .expect("valid counter"),
            prefill_fused_tokens: IntCounter::new(
                "specmesh_prefill_fused_tokens_total",
                "Of the prefilled tokens, those computed in the same forward as other sessions' \
                 verify steps (the rest ran in forwards of their own).",
            )
            .expect("valid counter"),
            phases: HistogramVec::new(
                HistogramOpts::new(
                    "specmesh_verify_phase_seconds",
                    "Seconds of each phase of a verify step: per session step tree_wait, validate, \
                     queue, report; per batched forward plan, forward, verify, commit, gap.",
                )
                .buckets(prometheus::exponential_buckets(1e-5, 2.5, 14).expect("valid buckets")),
                &["phase"],
            )
            .expect("valid histogram"),
            forward_tokens: Histogram::with_opts(
                HistogramOpts::new(
                    "specmesh_verify_forward_tokens",
                    "Tokens in one batched verify forward: every session's root and granted nodes.",
                )
                .buckets(prometheus::exponential_buckets(1.0, 2.0, 11).expect("valid buckets")),
            )
            .expect("valid histogram"),
            nodes_proposed: IntCounter::new(
                "specmesh_planner_nodes_proposed_total",
                "Drafted nodes drafters proposed to the goodput planner.",
            )
            .expect("valid counter"),
            nodes_granted: IntCounter::new(
                "specmesh_planner_nodes_granted_total",
                "Drafted nodes the goodput planner granted (verified).",
            )
            .expect("valid counter"),
            expected_accepted: Counter::new(
                "specmesh_planner_expected_accepted_total",
                "Drafted tokens the planner expected the target to accept, from its calibrated estimates.",
            )
            .expect("valid counter"),
            accepted: IntCounter::new(
                "specmesh_planner_accepted_total",
                "Drafted tokens the target accepted of the nodes granted.",
            )
            .expect("valid counter"),
            model_forward: GaugeVec::new(
                Opts::new(
                    "specmesh_planner_forward_seconds",
                    "The goodput planner's step-time model: predicted seconds of one batched \
                     forward over `tokens` tokens in a batch of up to `sessions` sessions \
                     (classes 1, 2, 4, 8, 16 = 9 or more), learned from the measured forwards.",
                ),
                &["sessions", "tokens"],
            )
            .expect("valid gauge"),
            model_fixed: Gauge::new(
                "specmesh_planner_fixed_step_seconds",
                "The planner's measure of a step's time outside its forward (moving average).",
            )
            .expect("valid gauge"),
            overhead_per_session: Gauge::new(
                "specmesh_planner_overhead_per_session_seconds",
                "Seconds one more session bringing a tree adds to a step, measured across steps.",
            )
            .expect("valid gauge"),
            drafting_slowdown: Gauge::new(
                "specmesh_planner_drafting_slowdown",
                "Forward seconds one second of drafting during the forward adds, measured \
                 (about 0 with drafters on other hosts).",
            )
            .expect("valid gauge"),
            drafting_overlap: Gauge::new(
                "specmesh_planner_drafting_overlap_ratio",
                "Share of the drafters' reported drafting time that ran during forwards.",
            )
            .expect("valid gauge"),
            trees_yielded: IntCounterVec::new(
                Opts::new(
                    "specmesh_verify_trees_yielded_total",
                    "Steps verified root-only because their batch did not wait for their tree: \
                     `others` (the session's speculating did not pay, and every other session \
                     was in) or `deadline` (the batch's wait ran out).",
                ),
                &["patience"],
            )
            .expect("valid counter"),
        }
    }

    pub fn register(&self, registry: &Registry) {
        register(registry, self.batch_size.clone());
        register(registry, self.step_seconds.clone());
        register(registry, self.prefill_tokens.clone());
        register(registry, self.prefill_fused_tokens.clone());
        register(registry, self.phases.clone());
        register(registry, self.forward_tokens.clone());
        register(registry, self.nodes_proposed.clone());
        register(registry, self.nodes_granted.clone());
        register(registry, self.expected_accepted.clone());
        register(registry, self.accepted.clone());
        register(registry, self.model_forward.clone());
        register(registry, self.model_fixed.clone());
        register(registry, self.overhead_per_session.clone());
        register(registry, self.drafting_slowdown.clone());
        register(registry, self.drafting_overlap.clone());
        register(registry, self.trees_yielded.clone());
    }
}

impl Default for BatchMetrics {
    fn default() -> Self {
        BatchMetrics::new()
    }
}
