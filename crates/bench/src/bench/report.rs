//! What the runs add up to: per-category speedup and τ, per-configuration
//! latencies, and the concurrency sweep. Computed once, then printed,
//! plotted and written to JSON from the same numbers.

use std::collections::BTreeMap;

use serde::Serialize;

use super::sweep::Wave;
use super::{Config, Run};
use crate::percentile::percentile;
use crate::table::Table;

#[derive(Default, Clone, Copy)]
struct Sum {
    tokens: f64,
    wall: f64,
    steps: f64,
    /// Tokens the target committed: the output plus a final EOS, which
    /// ends the output but still took its step.
    committed: f64,
}

impl Sum {
    fn add(&mut self, r: &Run) {
        self.tokens += r.completion_tokens as f64;
        self.wall += r.wall_seconds;
        self.steps += f64::from(r.verify_steps);
        self.committed += if r.config.must_match() {
            // Every step commits its accepted tokens plus the target's own.
            f64::from(r.verify_steps) + f64::from(r.accepted_tokens)
        } else {
            // The peer reports no acceptance; its output is what it committed.
            r.completion_tokens as f64
        };
    }

    fn tok_s(self) -> f64 {
        self.tokens / self.wall.max(1e-9)
    }

    fn tau(self) -> f64 {
        self.committed / self.steps.max(1.0)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CategoryRow {
    pub category: String,
    pub prompts: usize,
    /// tok/s per configuration (tokens over summed wall time).
    pub tok_s: BTreeMap<Config, f64>,
    /// Auto over off.
    pub speedup: f64,
    /// Mean tokens per verify step with speculation (bonus included).
    pub tau: f64,
    /// Our fastest speculative configuration and its speed-up over off.
    pub best: Option<(Config, f64)>,
    /// llama.cpp's fastest configuration (its plain decoding among them:
    /// its speculation may lose) and its speed-up over its own plain
    /// decoding, when the peer ran.
    pub peer_best: Option<(Config, f64)>,
    /// Our fastest (speculative, or off when that is faster) over
    /// llama.cpp's fastest, in tok/s.
    pub best_vs_peer: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConfigRow {
    pub config: Config,
    pub tok_s: f64,
    pub tau: f64,
    pub ttft_p50_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub ms_per_step: f64,
    /// Milliseconds a verify step waited for the drafter's tree, on average.
    pub tree_wait_ms_per_step: f64,
    /// Share of verify steps whose tree was drafted ahead.
    pub drafted_ahead_share: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LevelRow {
    pub concurrency: usize,
    pub config: Config,
    pub requests: usize,
    /// All tokens over the summed wave times.
    pub aggregate_tok_s: f64,
    pub latency_p50_s: f64,
    pub latency_p99_s: f64,
    pub ttft_p50_ms: f64,
    pub tau: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub categories: Vec<CategoryRow>,
    pub configs: Vec<ConfigRow>,
    pub levels: Vec<LevelRow>,
}

pub fn summarize(runs: &[Run], configs: &[Config], waves: &[Wave]) -> Summary {
    let mut cats: Vec<String> = Vec::new();
    for r in runs {
        if !cats.contains(&r.category) {
            cats.push(r.category.clone());
        }
    }
    cats.push("overall".into());
    let mut sums: BTreeMap<(String, Config), Sum> = BTreeMap::new();
    let mut prompts: BTreeMap<String, usize> = BTreeMap::new();
    for r in runs {
        for key in [r.category.clone(), "overall".to_string()] {
            sums.entry((key.clone(), r.config)).or_default().add(r);
            if r.config == Config::Off {
                *prompts.entry(key).or_default() += 1;
            }
        }
    }
    let get = |c: &str, cfg| sums.get(&(c.to_string(), cfg)).copied();
    let categories = cats
        .iter()
        .map(|c| {
            let off = get(c, Config::Off).unwrap_or_default();
            let auto = get(c, Config::Auto).unwrap_or_default();
            let fastest = |pick: &dyn Fn(Config) -> bool| {
                configs
                    .iter()
                    .filter(|&&cfg| pick(cfg))
                    .filter_map(|&cfg| get(c, cfg).map(|s| (cfg, s.tok_s())))
                    .max_by(|a, b| a.1.total_cmp(&b.1))
            };
            let best = fastest(&|cfg: Config| cfg.is_ours_speculative());
            let peer_best = fastest(&|cfg: Config| cfg.is_peer());
            let peer_plain = get(c, Config::PeerPlain).map(Sum::tok_s);
            CategoryRow {
                category: c.clone(),
                prompts: prompts.get(c).copied().unwrap_or(0),
                tok_s: configs
                    .iter()
                    .filter_map(|&cfg| get(c, cfg).map(|s| (cfg, s.tok_s())))
                    .collect(),
                speedup: auto.tok_s() / off.tok_s().max(1e-9),
                tau: auto.tau(),
                best: best.map(|(cfg, t)| (cfg, t / off.tok_s().max(1e-9))),
                peer_best: peer_best
                    .zip(peer_plain)
                    .map(|((cfg, t), plain)| (cfg, t / plain.max(1e-9))),
                best_vs_peer: peer_best.map(|p| {
                    let ours = best.map_or(0.0, |b| b.1).max(off.tok_s());
                    ours / p.1.max(1e-9)
                }),
            }
        })
        .collect();
    let configs = configs
        .iter()
        .map(|&cfg| {
            let rs: Vec<&Run> = runs.iter().filter(|r| r.config == cfg).collect();
            let itl: Vec<f64> = rs
                .iter()
                .flat_map(|r| r.inter_token_seconds.iter().copied())
                .collect();
            let s = get("overall", cfg).unwrap_or_default();
            let decode: f64 = rs.iter().map(|r| r.decode_seconds).sum();
            ConfigRow {
                config: cfg,
                tok_s: s.tok_s(),
                tau: s.tau(),
                ttft_p50_ms: percentile(rs.iter().map(|r| r.ttft_seconds).collect(), 0.5) * 1e3,
                itl_p50_ms: percentile(itl.clone(), 0.5) * 1e3,
                itl_p99_ms: percentile(itl, 0.99) * 1e3,
                ms_per_step: decode / s.steps.max(1.0) * 1e3,
                tree_wait_ms_per_step: rs.iter().map(|r| r.tree_wait_seconds).sum::<f64>()
                    / s.steps.max(1.0)
                    * 1e3,
                drafted_ahead_share: rs
                    .iter()
                    .map(|r| f64::from(r.drafted_ahead_steps))
                    .sum::<f64>()
                    / s.steps.max(1.0),
            }
        })
        .collect();
    Summary {
        categories,
        configs,
        levels: levels(runs, waves),
    }
}

/// Concurrency 1 is the interleaved per-prompt pass itself; higher levels
/// come from the waves.
fn levels(runs: &[Run], waves: &[Wave]) -> Vec<LevelRow> {
    let mut out = Vec::new();
    for cfg in [
        Config::Off,
        Config::Auto,
        Config::ModelFree,
        Config::DraftModel,
        Config::Combined,
        Config::Prediction,
    ] {
        let rs: Vec<&Run> = runs.iter().filter(|r| r.config == cfg).collect();
        if !rs.is_empty() {
            out.push(level_row(
                1,
                cfg,
                &rs,
                rs.iter().map(|r| r.wall_seconds).sum(),
            ));
        }
    }
    let mut keys: Vec<(usize, Config)> = waves.iter().map(|w| (w.concurrency, w.config)).collect();
    keys.sort();
    keys.dedup();
    for (n, cfg) in keys {
        let ws: Vec<&Wave> = waves
            .iter()
            .filter(|w| w.concurrency == n && w.config == cfg)
            .collect();
        let rs: Vec<&Run> = ws.iter().flat_map(|w| &w.runs).collect();
        out.push(level_row(
            n,
            cfg,
            &rs,
            ws.iter().map(|w| w.wall_seconds).sum(),
        ));
    }
    out
}

fn level_row(n: usize, cfg: Config, rs: &[&Run], wall: f64) -> LevelRow {
    let mut s = Sum::default();
    for r in rs {
        s.add(r);
    }
    LevelRow {
        concurrency: n,
        config: cfg,
        requests: rs.len(),
        aggregate_tok_s: s.tokens / wall.max(1e-9),
        latency_p50_s: percentile(rs.iter().map(|r| r.wall_seconds).collect(), 0.5),
        latency_p99_s: percentile(rs.iter().map(|r| r.wall_seconds).collect(), 0.99),
        ttft_p50_ms: percentile(rs.iter().map(|r| r.ttft_seconds).collect(), 0.5) * 1e3,
        tau: s.tau(),
    }
}

/// The run's tables: per category, per configuration, and the
/// concurrency sweep when one ran.
pub fn tables(summary: &Summary, configs: &[Config]) -> Vec<Table> {
    let peer = configs.iter().any(|c| c.is_peer());
    let mut header: Vec<String> = vec!["category".into(), "prompts".into()];
    header.extend(configs.iter().map(|c| format!("{} tok/s", c.name())));
    header.extend(["auto ×off".into(), "auto τ".into(), "best ×off".into()]);
    if peer {
        header.extend([
            "llama.cpp best ×plain".into(),
            "best ×llama.cpp best".into(),
        ]);
    }
    let refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut by_category = Table::new(&refs);
    for row in &summary.categories {
        let mut cells = vec![row.category.clone(), row.prompts.to_string()];
        cells.extend(
            configs
                .iter()
                .map(|cfg| format!("{:.1}", row.tok_s.get(cfg).copied().unwrap_or(0.0))),
        );
        let named = |b: Option<(Config, f64)>| {
            b.map_or("—".into(), |(cfg, x)| format!("{x:.2}x ({})", cfg.name()))
        };
        // Without an auto configuration there is no auto to compare.
        let auto_ran = configs
            .iter()
            .any(|c| matches!(c, Config::Auto | Config::InProcessAuto));
        let auto = |v: String| if auto_ran { v } else { "—".into() };
        cells.extend([
            auto(format!("{:.2}x", row.speedup)),
            auto(format!("{:.2}", row.tau)),
            named(row.best),
        ]);
        if peer {
            cells.extend([
                named(row.peer_best),
                row.best_vs_peer.map_or("—".into(), |x| format!("{x:.2}x")),
            ]);
        }
        by_category.row(cells);
    }
    let mut by_config = Table::new(&[
        "configuration",
        "tok/s",
        "τ",
        "TTFT p50 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "ms per step",
        "tree wait ms/step",
        "drafted ahead",
    ]);
    for c in &summary.configs {
        // Only the gateway's stream has inter-token gaps to measure.
        let streamed = c.config.via_gateway();
        let itl = |v: f64| {
            if streamed {
                format!("{v:.2}")
            } else {
                "—".to_string()
            }
        };
        by_config.row(vec![
            c.config.name().to_string(),
            format!("{:.1}", c.tok_s),
            format!("{:.2}", c.tau),
            format!("{:.1}", c.ttft_p50_ms),
            itl(c.itl_p50_ms),
            itl(c.itl_p99_ms),
            format!("{:.2}", c.ms_per_step),
            itl(c.tree_wait_ms_per_step),
            if streamed {
                format!("{:.0}%", c.drafted_ahead_share * 100.0)
            } else {
                "—".to_string()
            },
        ]);
    }
    let mut out = vec![by_category, by_config];
    if summary.levels.iter().any(|l| l.concurrency > 1) {
        let mut sweep = Table::new(&[
            "concurrency",
            "config",
            "requests",
            "aggregate tok/s",
            "vs off",
            "latency p50 s",
            "latency p99 s",
            "τ",
        ]);
        for l in &summary.levels {
            let off = summary
                .levels
                .iter()
                .find(|o| o.concurrency == l.concurrency && o.config == Config::Off)
                .map_or(0.0, |o| o.aggregate_tok_s);
            sweep.row(vec![
                l.concurrency.to_string(),
                l.config.name().to_string(),
                l.requests.to_string(),
                format!("{:.1}", l.aggregate_tok_s),
                format!("{:.2}x", l.aggregate_tok_s / off.max(1e-9)),
                format!("{:.2}", l.latency_p50_s),
                format!("{:.2}", l.latency_p99_s),
                format!("{:.2}", l.tau),
            ]);
        }
        out.push(sweep);
    }
    out
}
