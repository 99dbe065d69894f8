//! The verifier's Prometheus metrics. Batch sizes and step times are
//! recorded by the batching thread as each forward runs; KV memory and
//! session counts are read from the service's state when Prometheus
//! scrapes, so they cost nothing between scrapes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};
use specmesh_server::metrics::{catch_up, register};

use crate::state::State;

/// What the batching thread records, per forward.
#[derive(Debug, Clone)]
pub struct BatchMetrics {
    /// Sessions verified in one forward.
    pub batch_size: Histogram,
    /// Seconds of one batched verify forward.
    pub step_seconds: Histogram,
    /// Context tokens prefilled (reused ones not counted).
    pub prefill_tokens: IntCounter,
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
        }
    }

    pub fn register(&self, registry: &Registry) {
        register(registry, self.batch_size.clone());
        register(registry, self.step_seconds.clone());
        register(registry, self.prefill_tokens.clone());
    }
}

impl Default for BatchMetrics {
    fn default() -> Self {
        BatchMetrics::new()
    }
}

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
                "Bytes of KV cache held: running sessions' reservations and kept caches.",
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
                "specmesh_kept_sessions",
                "Sessions whose KV cache is kept for a next turn.",
            ),
            kept_tokens: gauge(
                "specmesh_kept_tokens",
                "Context tokens held in kept caches.",
            ),
            evicted: counter(
                "specmesh_evicted_sessions_total",
                "Kept caches evicted (least recently used first) to make room.",
            ),
            reused: counter(
                "specmesh_reused_tokens_total",
                "Context tokens taken from kept caches instead of prefilled.",
            ),
            steps: counter("specmesh_verify_steps_total", "Session verify steps run."),
        }
    }

    fn metrics(&self) -> [&dyn Collector; 9] {
        [
            &self.kv_bytes,
            &self.kv_capacity,
            &self.kv_usage,
            &self.running,
            &self.kept,
            &self.kept_tokens,
            &self.evicted,
            &self.reused,
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
        self.kept.set(usage.cached_sessions as i64);
        self.kept_tokens.set(usage.kept_tokens as i64);
        catch_up(&self.evicted, usage.evicted);
        catch_up(&self.reused, usage.reused_tokens);
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
