//! The drafter's Prometheus metrics: its process-wide [`Stats`], read when
//! Prometheus scrapes, and the propose-latency and tree-size histograms
//! recorded as each tree is sent.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntGauge};

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
