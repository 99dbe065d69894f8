//! The drafter's Prometheus metrics: its process-wide [`Stats`] and its
//! draft model's prefix cache, read when Prometheus scrapes, and the
//! propose-latency and tree-size histograms recorded as each tree is sent.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntGauge};

use specmesh_kvevents::SharedStore;
use specmesh_server::metrics::catch_up;

use crate::stats::Stats;

pub struct StatsMetrics {
    stats: Arc<Stats>,
    open: IntGauge,
    sessions: IntCounter,
    refused: IntCounter,
    failed: IntCounter,
    trees: IntCounter,
    drafted: IntCounter,
    accepted: IntCounter,
    indexed: IntCounter,
}

impl StatsMetrics {
    pub fn new(stats: Arc<Stats>) -> StatsMetrics {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid counter");
        StatsMetrics {
            stats,
            open: IntGauge::new("specmesh_drafter_sessions_open", "Draft streams open now.")
                .expect("valid gauge"),
            sessions: counter("specmesh_drafter_sessions_total", "Draft streams started."),
            refused: counter(
                "specmesh_drafter_sessions_refused_total",
                "Draft streams refused: every session slot taken.",
            ),
            failed: counter(
                "specmesh_drafter_sessions_failed_total",
                "Draft streams ended by an error (bad input, timeout, internal).",
            ),
            trees: counter(
                "specmesh_drafter_trees_total",
                "Trees sent, root-only ones included.",
            ),
            drafted: counter(
                "specmesh_drafter_drafted_tokens_total",
                "Drafted nodes sent (roots not counted).",
            ),
            accepted: counter(
                "specmesh_drafter_accepted_tokens_total",
                "Drafted nodes the verifiers reported accepted.",
            ),
            indexed: counter(
                "specmesh_drafter_outputs_indexed_total",
                "Ended sessions whose output joined their tenant's global index.",
            ),
        }
    }

    fn scraped(&self) -> [&dyn Collector; 8] {
        [
            &self.open,
            &self.sessions,
            &self.refused,
            &self.failed,
            &self.trees,
            &self.drafted,
            &self.accepted,
            &self.indexed,
        ]
    }
}

impl Collector for StatsMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs: Vec<&Desc> = self
            .scraped()
            .into_iter()
            .flat_map(Collector::desc)
            .collect();
        descs.extend(self.stats.propose_seconds.desc());
        descs.extend(self.stats.tree_nodes.desc());
        descs.extend(self.stats.retokenize_seconds.desc());
        descs.extend(self.stats.boundary_lost.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = self.stats.snapshot();
        self.open.set(s.sessions_open as i64);
        catch_up(&self.sessions, s.sessions_total);
        catch_up(&self.refused, s.sessions_refused);
        catch_up(&self.failed, s.sessions_failed);
        catch_up(&self.trees, s.trees_sent);
        catch_up(&self.drafted, s.drafted_nodes);
        catch_up(&self.accepted, s.accepted_nodes);
        catch_up(&self.indexed, s.outputs_indexed);
        let mut families: Vec<MetricFamily> = self
            .scraped()
            .into_iter()
            .flat_map(Collector::collect)
            .collect();
        families.extend(self.stats.propose_seconds.collect());
        families.extend(self.stats.tree_nodes.collect());
        families.extend(self.stats.retokenize_seconds.collect());
        families.extend(self.stats.boundary_lost.collect());
        families
    }
}

/// The draft model's prefix cache, read from its store when Prometheus
/// scrapes (the verifier's `specmesh_prefix_cache_*`, for the draft model).
pub struct PrefixMetrics {
    cache: SharedStore,
    blocks: IntGauge,
    tokens: IntGauge,
    bytes: IntGauge,
    evicted: IntCounter,
    hits: IntCounter,
    queries: IntCounter,
}

impl PrefixMetrics {
    pub fn new(cache: SharedStore) -> PrefixMetrics {
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid gauge");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid counter");
        PrefixMetrics {
            cache,
            blocks: gauge(
                "specmesh_drafter_prefix_cache_blocks",
                "Blocks of draft model KV in the prefix cache.",
            ),
            tokens: gauge(
                "specmesh_drafter_prefix_cache_tokens",
                "Context tokens of draft model KV held in the prefix cache.",
            ),
            bytes: gauge(
                "specmesh_drafter_prefix_cache_bytes",
                "Bytes of draft model KV held in the prefix cache (at most --draft-kv-budget-mib).",
            ),
            evicted: counter(
                "specmesh_drafter_prefix_cache_evicted_blocks_total",
                "Draft prefix cache blocks evicted (least recently used leaves first) to make room.",
            ),
            hits: counter(
                "specmesh_drafter_prefix_cache_hits_total",
                "Context tokens whose draft model KV came from the prefix cache instead of a prefill.",
            ),
            queries: counter(
                "specmesh_drafter_prefix_cache_queries_total",
                "Context tokens looked up in the draft prefix cache as sessions started with the \
                 draft model (hits / queries = the hit ratio).",
            ),
        }
    }

    fn scraped(&self) -> [&dyn Collector; 6] {
        [
            &self.blocks,
            &self.tokens,
            &self.bytes,
            &self.evicted,
            &self.hits,
            &self.queries,
        ]
    }
}

impl Collector for PrefixMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.scraped()
            .into_iter()
            .flat_map(Collector::desc)
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let u = self.cache.usage();
        self.blocks.set(u.blocks as i64);
        self.tokens.set((u.blocks * u.block_tokens) as i64);
        self.bytes.set(u.cached as i64);
        catch_up(&self.evicted, u.evicted_blocks);
        catch_up(&self.hits, u.hit_tokens);
        catch_up(&self.queries, u.queried_tokens);
        self.scraped()
            .into_iter()
            .flat_map(Collector::collect)
            .collect()
    }
}
