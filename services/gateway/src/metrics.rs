//! The gateway's Prometheus metrics. Speculation is counted in vLLM's
//! schema (`spec_decode_num_drafts`, `…_num_draft_tokens`,
//! `…_num_accepted_tokens`, `…_num_accepted_tokens_per_pos`) with our
//! prefix, from the `Committed` steps every request receives, so the totals
//! equal the sums of the responses' `speculation` statistics; the same
//! four counters are exported under vLLM's own names as well
//! (`vllm:spec_decode_num_drafts_total`, …), which benchmark clients
//! (NVIDIA AIPerf, `vllm bench serve`) read from a server's `/metrics`.
//! Tokens a `structured` constraint forced are counted apart. Requests are
//! counted by their gRPC status code; latencies are histograms.

use std::sync::Arc;
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use specmesh_proto::v1::Committed;
use specmesh_server::metrics::register;

use crate::members::Members;

/// Positions past this share one label value (`"64+"`), so a verifier
/// with deep trees cannot grow the label set without bound.
const MAX_POSITION_LABEL: usize = 64;

/// vLLM's four speculative-decoding counters, under one prefix.
#[derive(Debug, Clone)]
struct SpecCounters {
    num_drafts: IntCounter,
    num_draft_tokens: IntCounter,
    num_accepted_tokens: IntCounter,
    accepted_per_pos: IntCounterVec,
}

impl SpecCounters {
    /// Under `names`: the drafts, draft tokens, accepted tokens and
    /// accepted-per-position counters' (written out whole, so that the
    /// deployment's checks find every name in the source).
    fn new(names: [&str; 4]) -> SpecCounters {
        let [drafts, draft_tokens, accepted, per_pos] = names;
        SpecCounters {
            num_drafts: counter(drafts, "Verify steps that verified drafted tokens."),
            num_draft_tokens: counter(draft_tokens, "Drafted tokens (tree nodes) verified."),
            num_accepted_tokens: counter(accepted, "Drafted tokens the target accepted."),
            accepted_per_pos: IntCounterVec::new(
                Opts::new(
                    per_pos,
                    "Accepted drafted tokens by their position on the accepted path (0: the first after the root).",
                ),
                &["position"],
            )
            .expect("a valid counter"),
        }
    }

    fn register(&self, registry: &Registry) {
        register(registry, self.num_drafts.clone());
        register(registry, self.num_draft_tokens.clone());
        register(registry, self.num_accepted_tokens.clone());
        register(registry, self.accepted_per_pos.clone());
    }

    fn step(&self, drafted: u32, accepted: u32) {
        self.num_drafts.inc();
        self.num_draft_tokens.inc_by(u64::from(drafted));
        self.num_accepted_tokens.inc_by(u64::from(accepted));
        for pos in 0..accepted as usize {
            let label = if pos < MAX_POSITION_LABEL {
                pos.to_string()
            } else {
                format!("{MAX_POSITION_LABEL}+")
            };
            self.accepted_per_pos
                .with_label_values(&[label.as_str()])
                .inc();
        }
    }
}

#[derive(Debug, Clone)]
pub struct GatewayMetrics {
    spec: SpecCounters,
    /// The same, under vLLM's names.
    vllm: SpecCounters,
    forced_tokens: IntCounter,
    requests: IntCounterVec,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    placements: IntCounterVec,
    drafter_placements: IntCounterVec,
    predicted_cached: IntCounter,
    actual_cached: IntCounter,
    migrations: IntCounter,
    capacity_refusals: IntCounterVec,
    tenant_tokens: IntCounterVec,
    quota_rejections: IntCounterVec,
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("a valid counter")
}

fn seconds(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("a valid histogram")
}

impl GatewayMetrics {
    pub fn new() -> GatewayMetrics {
        let latency = vec![
            0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
        ];
        let token = vec![
            0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
        ];
        GatewayMetrics {
            spec: SpecCounters::new([
                "specmesh_spec_decode_num_drafts_total",
                "specmesh_spec_decode_num_draft_tokens_total",
                "specmesh_spec_decode_num_accepted_tokens_total",
                "specmesh_spec_decode_num_accepted_tokens_per_pos_total",
            ]),
            vllm: SpecCounters::new([
                "vllm:spec_decode_num_drafts_total",
                "vllm:spec_decode_num_draft_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            ]),
            forced_tokens: counter(
                "specmesh_forced_tokens_total",
                "Tokens accepted from what a request's `structured` constraint forced (verified as \
                 drafts the verifier added; not in the spec_decode counters).",
            ),
            requests: IntCounterVec::new(
                Opts::new(
                    "specmesh_requests_total",
                    "Generation requests by gRPC status code.",
                ),
                &["code"],
            )
            .expect("a valid counter"),
            ttft: seconds(
                "specmesh_time_to_first_token_seconds",
                "Seconds from a request's arrival to its first token.",
                latency.clone(),
            ),
            itl: seconds(
                "specmesh_inter_token_latency_seconds",
                "Seconds between a request's tokens (a step's wait shared by the tokens it committed).",
                token,
            ),
            e2e: seconds(
                "specmesh_e2e_request_latency_seconds",
                "Seconds from a request's arrival to its last token.",
                latency,
            ),
            prompt_tokens: counter(
                "specmesh_prompt_tokens_total",
                "Prompt tokens of finished requests.",
            ),
            generation_tokens: counter(
                "specmesh_generation_tokens_total",
                "Tokens generated by finished requests.",
            ),
            placements: IntCounterVec::new(
                Opts::new(
                    "specmesh_placements_total",
                    "Placements of a request on a verifier, re-placements included, by why that \
                     verifier: prefix (it holds the most of the prompt's KV for its load), session \
                     (none does: the session's rendezvous choice) or load (the least loaded).",
                ),
                &["reason"],
            )
            .expect("a valid counter"),
            drafter_placements: IntCounterVec::new(
                Opts::new(
                    "specmesh_drafter_placements_total",
                    "Drafters chosen for speculative requests, re-placements included, by why \
                     that drafter: prefix (its draft model holds the most of the prompt's KV) or \
                     tenant (none does: the tenant's rendezvous choice).",
                ),
                &["reason"],
            )
            .expect("a valid counter"),
            predicted_cached: counter(
                "specmesh_placement_predicted_cached_tokens_total",
                "Prompt tokens the KV index said the chosen verifier holds, at placement.",
            ),
            actual_cached: counter(
                "specmesh_placement_actual_cached_tokens_total",
                "Prompt tokens the chosen verifier reused from its prefix cache.",
            ),
            migrations: counter(
                "specmesh_migrations_total",
                "Requests moved to another verifier after losing theirs.",
            ),
            capacity_refusals: IntCounterVec::new(
                Opts::new(
                    "specmesh_capacity_refusals_total",
                    "Requests refused for want of capacity (RESOURCE_EXHAUSTED that is not a \
                     tenant's quota): reason gateway_full (--max-concurrent-requests) or \
                     verifiers_full (every verifier's KV budget taken); what autoscaling adds \
                     pods on.",
                ),
                &["reason"],
            )
            .expect("a valid counter"),
            tenant_tokens: IntCounterVec::new(
                Opts::new(
                    "specmesh_tenant_tokens_total",
                    "Tokens a tenant used: prompt tokens when admitted, generated ones when done \
                     (what --tenant-tokens-per-minute and a key's tpm= count).",
                ),
                &["tenant"],
            )
            .expect("a valid counter"),
            quota_rejections: IntCounterVec::new(
                Opts::new(
                    "specmesh_quota_rejections_total",
                    "Requests refused for a tenant's quota, by the limit hit (concurrent, tokens).",
                ),
                &["tenant", "reason"],
            )
            .expect("a valid counter"),
        }
    }

    pub fn register(&self, registry: &Registry) {
        self.spec.register(registry);
        self.vllm.register(registry);
        register(registry, self.forced_tokens.clone());
        register(registry, self.requests.clone());
        register(registry, self.ttft.clone());
        register(registry, self.itl.clone());
        register(registry, self.e2e.clone());
        register(registry, self.prompt_tokens.clone());
        register(registry, self.generation_tokens.clone());
        register(registry, self.placements.clone());
        register(registry, self.drafter_placements.clone());
        register(registry, self.predicted_cached.clone());
        register(registry, self.actual_cached.clone());
        register(registry, self.capacity_refusals.clone());
        register(registry, self.tenant_tokens.clone());
        register(registry, self.quota_rejections.clone());
        register(registry, self.migrations.clone());
    }

    /// One verify step, counted as [`crate::spec_stats::SpecStats`] counts it.
    pub fn step(&self, step: &Committed) {
        self.forced_tokens
            .inc_by(u64::from(step.forced.min(step.tokens.len() as u32)));
        if step.drafted == 0 {
            return;
        }
        let accepted = step.accepted.min(step.drafted);
        self.spec.step(step.drafted, accepted);
        self.vllm.step(step.drafted, accepted);
    }

    /// A request's first token, `after` its arrival.
    pub fn first_token(&self, after: Duration) {
        self.ttft.observe(after.as_secs_f64());
    }

    /// `tokens` committed `gap` after the request's previous ones.
    pub fn tokens_after(&self, gap: Duration, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let each = gap.as_secs_f64() / tokens as f64;
        for _ in 0..tokens {
            self.itl.observe(each);
        }
    }

    /// A request that finished (`OK`) after `seconds`.
    pub fn finished(&self, seconds: Duration, prompt_tokens: u32, completion_tokens: u32) {
        self.requests.with_label_values(&["OK"]).inc();
        self.e2e.observe(seconds.as_secs_f64());
        self.prompt_tokens.inc_by(u64::from(prompt_tokens));
        self.generation_tokens.inc_by(u64::from(completion_tokens));
    }

    /// A request that ended with `code`.
    pub fn failed(&self, code: tonic::Code) {
        self.requests.with_label_values(&[code_name(code)]).inc();
    }

    /// A request refused for want of capacity: `gateway_full` or
    /// `verifiers_full`.
    pub fn capacity_refused(&self, reason: &'static str) {
        self.capacity_refusals.with_label_values(&[reason]).inc();
    }

    /// `tokens` used by `tenant`.
    pub fn tenant_tokens(&self, tenant: &str, tokens: u64) {
        self.tenant_tokens
            .with_label_values(&[tenant])
            .inc_by(tokens);
    }

    /// A request of `tenant` refused for its quota's `reason`.
    pub fn quota_refused(&self, tenant: &str, reason: &'static str) {
        self.quota_rejections
            .with_label_values(&[tenant, reason])
            .inc();
    }

    /// A placement, why, and the cached tokens the index predicted.
    pub fn placed(&self, reason: &str, predicted_cached: usize) {
        self.placements.with_label_values(&[reason]).inc();
        self.predicted_cached.inc_by(predicted_cached as u64);
    }

    /// A drafter chosen for the prefix its draft model holds, or (`false`)
    /// as the tenant's.
    pub fn drafter_placed(&self, by_prefix: bool) {
        let reason = if by_prefix { "prefix" } else { "tenant" };
        self.drafter_placements.with_label_values(&[reason]).inc();
    }

    /// The cached tokens a verifier reported reusing for a placement.
    pub fn cached(&self, tokens: u32) {
        self.actual_cached.inc_by(u64::from(tokens));
    }

    pub fn migrated(&self) {
        self.migrations.inc();
    }
}

/// `specmesh_gateway_members{role, state}`: the verifiers and drafters the
/// gateway places on, up or down as its health watch sees them, read at
/// scrape time (DNS membership changes the counts).
/// Also `specmesh_kv_index_blocks{role}`: the prefix blocks the gateway's
/// KV indexes hold, over every verifier and every drafter.
#[derive(Debug, Clone)]
pub struct MemberMetrics {
    members: Arc<Members>,
    gauge: IntGaugeVec,
    index_blocks: IntGaugeVec,
}

impl MemberMetrics {
    pub fn new(members: Arc<Members>) -> MemberMetrics {
        let gauge = IntGaugeVec::new(
            Opts::new(
                "specmesh_gateway_members",
                "Verifiers and drafters the gateway knows, by role and health.",
            ),
            &["role", "state"],
        )
        .expect("a valid gauge");
        let index_blocks = IntGaugeVec::new(
            Opts::new(
                "specmesh_kv_index_blocks",
                "Prefix cache blocks the gateway's KV indexes hold, over every verifier \
                 (role=verifier) or drafter (role=drafter: draft model KV).",
            ),
            &["role"],
        )
        .expect("a valid gauge");
        MemberMetrics {
            members,
            gauge,
            index_blocks,
        }
    }
}

impl Collector for MemberMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let mut d = self.gauge.desc();
        d.extend(self.index_blocks.desc());
        d
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let placer = self.members.placer();
        for (role, index) in [
            ("verifier", placer.kv_index()),
            ("drafter", placer.drafter_kv_index()),
        ] {
            self.index_blocks
                .with_label_values(&[role])
                .set(index.blocks() as i64);
        }
        let c = self.members.census();
        for (role, state, n) in [
            ("verifier", "up", c.verifiers_up),
            ("verifier", "down", c.verifiers_down),
            ("drafter", "up", c.drafters_up),
            ("drafter", "down", c.drafters_down),
        ] {
            self.gauge.with_label_values(&[role, state]).set(n as i64);
        }
        let mut families = self.gauge.collect();
        families.extend(self.index_blocks.collect());
        families
    }
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        GatewayMetrics::new()
    }
}

/// The status code's canonical name (`RESOURCE_EXHAUSTED`).
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_count_as_vllm_counts_them_and_positions_are_bounded() {
        let m = GatewayMetrics::new();
        let step = |drafted, accepted| Committed {
            drafted,
            accepted,
            tokens: vec![1; accepted as usize + 1],
            ..Committed::default()
        };
        m.step(&step(0, 0));
        m.step(&step(5, 3));
        m.step(&step(4, 9)); // a bad verifier: accepted capped at drafted
        m.step(&step(80, 70));
        for c in [&m.spec, &m.vllm] {
            assert_eq!(c.num_drafts.get(), 3);
            assert_eq!(c.num_draft_tokens.get(), 89);
            assert_eq!(c.num_accepted_tokens.get(), 77);
            let at = |p: &str| c.accepted_per_pos.with_label_values(&[p]).get();
            assert_eq!((at("0"), at("2"), at("3"), at("63")), (3, 3, 2, 1));
            assert_eq!(at("64+"), 6);
        }
        m.step(&Committed {
            forced: 4,
            tokens: vec![1; 5],
            ..Committed::default()
        });
        assert_eq!(m.forced_tokens.get(), 4);
        let registry = Registry::new();
        m.register(&registry);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n == "vllm:spec_decode_num_accepted_tokens_total"),
            "{names:?}"
        );
        m.failed(tonic::Code::ResourceExhausted);
        assert_eq!(
            m.requests.with_label_values(&["RESOURCE_EXHAUSTED"]).get(),
            1
        );
    }
}
