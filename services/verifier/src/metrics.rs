//! The verifier's Prometheus metrics read at scrape time: KV memory and
//! session counts come from the service's state when Prometheus scrapes,
//! so they cost nothing between scrapes. (Batch sizes and step times are
//! recorded by the batching thread: [`crate::batch_metrics`].)

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntGauge, Opts};
use specmesh_server::metrics::catch_up;

use crate::state::State;

/// KV memory and sessions, read from the state at scrape time.
pub struct StateMetrics {
    state: Arc<State>,
    kv_bytes: IntGauge,
    kv_capacity: IntGauge,
    kv_usage: prometheus::Gauge,
    running: IntGauge,
    kept: IntGauge,
    kept_tokens: IntGauge,
    evicted: IntCounter,
    reused: IntCounter,
    queries: IntCounter,
    steps: IntCounter,
}

impl StateMetrics {
    pub fn new(state: Arc<State>) -> StateMetrics {
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid gauge");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid counter");
        StateMetrics {
            state,
            kv_bytes: gauge(
                "specmesh_kv_cache_bytes",
                "Bytes of KV cache held: running sessions' reservations and the prefix cache's blocks.",
            ),
            kv_capacity: gauge(
                "specmesh_kv_cache_capacity_bytes",
                "The KV cache budget in bytes.",
            ),
            kv_usage: prometheus::Gauge::with_opts(Opts::new(
                "specmesh_kv_cache_usage_perc",
                "KV cache held over its budget (1 = full).",
            ))
            .expect("valid gauge"),
            running: gauge(
                "specmesh_num_requests_running",
                "Sessions running on this verifier.",
            ),
            kept: gauge(
                "specmesh_prefix_cache_blocks",
                "Blocks of KV in the prefix cache.",
            ),
            kept_tokens: gauge(
                "specmesh_prefix_cache_tokens",
                "Context tokens held in the prefix cache.",
            ),
            evicted: counter(
                "specmesh_prefix_cache_evicted_blocks_total",
                "Prefix cache blocks evicted (least recently used leaves first) to make room.",
            ),
            reused: counter(
                "specmesh_prefix_cache_hits_total",
                "Context tokens whose KV came from the prefix cache instead of a prefill.",
            ),
            queries: counter(
                "specmesh_prefix_cache_queries_total",
                "Context tokens looked up in the prefix cache (hits / queries = the hit ratio).",
            ),
            steps: counter("specmesh_verify_steps_total", "Session verify steps run."),
        }
    }

    fn metrics(&self) -> [&dyn Collector; 10] {
        [
            &self.kv_bytes,
            &self.kv_capacity,
            &self.kv_usage,
            &self.running,
            &self.kept,
            &self.kept_tokens,
            &self.evicted,
            &self.reused,
            &self.queries,
            &self.steps,
        ]
    }
}

impl Collector for StateMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.metrics()
            .into_iter()
            .flat_map(Collector::desc)
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let usage = self.state.memory.usage();
        let held = usage.reserved + usage.cached;
        self.kv_bytes.set(held as i64);
        self.kv_capacity.set(usage.budget as i64);
        self.kv_usage.set(if usage.budget == 0 {
            0.0
        } else {
            held as f64 / usage.budget as f64
        });
        self.running.set(self.state.running() as i64);
        self.kept.set(usage.blocks as i64);
        self.kept_tokens
            .set((usage.blocks * usage.block_tokens) as i64);
        catch_up(&self.evicted, usage.evicted_blocks);
        catch_up(&self.reused, usage.hit_tokens);
        catch_up(&self.queries, usage.queried_tokens);
        catch_up(
            &self.steps,
            self.state.batcher.counters().steps.load(Ordering::Relaxed),
        );
        self.metrics()
            .into_iter()
            .flat_map(Collector::collect)
            .collect()
    }
}
