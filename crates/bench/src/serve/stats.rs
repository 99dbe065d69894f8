//! What a pass of requests adds up to, defined as `vllm bench serve`
//! defines it:
//!
//! * TTFT: from sending a request to its first chunk of output;
//! * TPOT: per request, `(e2el − TTFT) / (output tokens − 1)`; requests of
//!   one token have none and are left out of its percentiles;
//! * ITL: every gap between consecutive chunks of output, all requests
//!   pooled (a chunk of several tokens is one gap, not several);
//! * e2el: from sending a request to the end of its stream;
//! * throughputs: completed requests and their output tokens over the
//!   pass's duration (first arrival to last completion);
//! * goodput: completed requests meeting every given SLO over the same
//!   duration (a one-token request counts as TPOT 0 there).
//!
//! Over gRPC the gateway also reports each request's verify steps and
//! their wait for trees, which explain the rest: output tokens per step
//! (τ, 1 without speculation) and the wait per step, over the requests
//! that reported them.
//!
//! Percentiles are [`crate::percentile`]'s nearest rank, as in every
//! benchmark here.

use serde::Serialize;

use crate::client::Completion;
use crate::percentile::percentile;

/// `--goodput`: the latency bounds, in milliseconds, a request must meet to
/// count as good.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// `ttft:MS,tpot:MS,e2el:MS`, each optional but at least one.
    pub fn parse(s: &str) -> Result<Slo, String> {
        let mut slo = Slo::default();
        for part in s.split(',').map(str::trim) {
            let Some((key, value)) = part.split_once(':') else {
                return Err(format!(
                    "`{part}` is not an SLO: use ttft:MS, tpot:MS or e2el:MS"
                ));
            };
            let ms = match value.trim().parse::<f64>() {
                Ok(ms) if ms.is_finite() && ms >= 0.0 => ms,
                _ => {
                    return Err(format!(
                        "`{part}`: the bound must be a number of milliseconds >= 0, got `{value}`"
                    ));
                }
            };
            let slot = match key.trim() {
                "ttft" => &mut slo.ttft_ms,
                "tpot" => &mut slo.tpot_ms,
                "e2el" => &mut slo.e2el_ms,
                other => {
                    return Err(format!(
                        "`{other}` is not a metric with an SLO: use ttft, tpot or e2el"
                    ));
                }
            };
            if slot.replace(ms).is_some() {
                return Err(format!("`{}` is given twice", key.trim()));
            }
        }
        Ok(slo)
    }

    /// Whether `c` meets every bound.
    pub fn met_by(&self, c: &Completion) -> bool {
        let within = |bound: Option<f64>, seconds: f64| bound.is_none_or(|ms| seconds * 1e3 <= ms);
        within(self.ttft_ms, c.ttft)
            && within(self.tpot_ms, tpot(c).unwrap_or(0.0))
            && within(self.e2el_ms, c.e2el)
    }
}

/// Seconds per output token after the first; `None` for a one-token (or
/// empty) output, which has no decode time to share.
pub fn tpot(c: &Completion) -> Option<f64> {
    (c.output_tokens > 1).then(|| (c.e2el - c.ttft) / (c.output_tokens - 1) as f64)
}

/// Mean and percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Quantiles {
    pub mean: f64,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Quantiles {
    /// Of `seconds`; all zero for none.
    pub fn of(seconds: Vec<f64>) -> Quantiles {
        if seconds.is_empty() {
            return Quantiles::default();
        }
        let mean = seconds.iter().sum::<f64>() / seconds.len() as f64;
        Quantiles {
            mean: mean * 1e3,
            median: percentile(seconds.clone(), 0.5) * 1e3,
            p90: percentile(seconds.clone(), 0.9) * 1e3,
            p99: percentile(seconds, 0.99) * 1e3,
        }
    }
}

/// One pass (or several pooled): the numbers `vllm bench serve` reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    pub completed: usize,
    pub failed: usize,
    /// Seconds.
    pub duration: f64,
    pub total_output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    pub ttft: Quantiles,
    pub tpot: Quantiles,
    pub itl: Quantiles,
    pub e2el: Quantiles,
    /// Good requests per second; `None` without an SLO.
    pub request_goodput: Option<f64>,
    /// Output tokens per verify step; `None` when no request reported its
    /// steps.
    pub tokens_per_step: Option<f64>,
    /// Milliseconds each verify step waited for its tree, on average.
    pub tree_wait_ms_per_step: Option<f64>,
}

/// The metrics of `done` (the completed requests) and `failed` others over
/// `duration` seconds.
pub fn metrics(done: &[&Completion], failed: usize, duration: f64, slo: Option<&Slo>) -> Metrics {
    let per_second = |n: f64| n / duration.max(1e-9);
    let total_output_tokens = done.iter().map(|c| c.output_tokens).sum();
    let reported: Vec<_> = done
        .iter()
        .filter_map(|c| c.speculation.map(|s| (c.output_tokens, s)))
        .collect();
    let steps: u64 = reported.iter().map(|(_, s)| u64::from(s.steps)).sum();
    let per_step = |total: f64| (steps > 0).then(|| total / steps as f64);
    Metrics {
        completed: done.len(),
        failed,
        duration,
        total_output_tokens,
        request_throughput: per_second(done.len() as f64),
        output_throughput: per_second(total_output_tokens as f64),
        ttft: Quantiles::of(done.iter().map(|c| c.ttft).collect()),
        tpot: Quantiles::of(done.iter().filter_map(|c| tpot(c)).collect()),
        itl: Quantiles::of(done.iter().flat_map(|c| c.itl.iter().copied()).collect()),
        e2el: Quantiles::of(done.iter().map(|c| c.e2el).collect()),
        request_goodput: slo
            .map(|slo| per_second(done.iter().filter(|c| slo.met_by(c)).count() as f64)),
        tokens_per_step: per_step(reported.iter().map(|(n, _)| *n as f64).sum()),
        tree_wait_ms_per_step: per_step(reported.iter().map(|(_, s)| s.tree_wait * 1e3).sum()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(ttft: f64, e2el: f64, output_tokens: usize) -> Completion {
        Completion {
            ttft,
            e2el,
            itl: vec![(e2el - ttft) / output_tokens.max(2) as f64; output_tokens.saturating_sub(1)],
            output_tokens,
            output: crate::client::Output::Text(String::new()),
            text: String::new(),
            prompt_tokens: None,
            cached_tokens: None,
            speculation: None,
        }
    }

    #[test]
    fn tpot_shares_the_decode_time_and_leaves_out_one_token_requests() {
        let a = done(0.1, 1.1, 11);
        assert!((tpot(&a).unwrap() - 0.1).abs() < 1e-12);
        let one = done(0.2, 0.2, 1);
        assert_eq!(tpot(&one), None);
        let m = metrics(&[&a, &one], 0, 2.0, None);
        // Only `a` has a TPOT: 100 ms at every percentile.
        assert!((m.tpot.median - 100.0).abs() < 1e-9);
        assert!((m.tpot.p99 - 100.0).abs() < 1e-9);
        assert_eq!(m.completed, 2);
        assert_eq!(m.total_output_tokens, 12);
        assert!((m.output_throughput - 6.0).abs() < 1e-12);
        assert!((m.request_throughput - 1.0).abs() < 1e-12);
        assert_eq!(m.request_goodput, None);
    }

    #[test]
    fn goodput_counts_only_requests_meeting_every_slo() {
        let fast = done(0.05, 0.55, 11); // TTFT 50 ms, TPOT 50 ms
        let slow_start = done(0.5, 1.0, 11); // TTFT 500 ms, TPOT 50 ms
        let slow_tokens = done(0.05, 2.05, 11); // TTFT 50 ms, TPOT 200 ms
        let one = done(0.05, 0.05, 1); // TPOT counts as 0
        let slo = Slo::parse("ttft:100,tpot:60").unwrap();
        let m = metrics(
            &[&fast, &slow_start, &slow_tokens, &one],
            1,
            2.0,
            Some(&slo),
        );
        assert_eq!(m.request_goodput, Some(1.0), "fast and one: 2 over 2 s");
        assert_eq!(m.failed, 1);
        let e2el = Slo::parse("e2el:600").unwrap();
        let m = metrics(&[&fast, &slow_start, &slow_tokens], 0, 1.0, Some(&e2el));
        assert_eq!(m.request_goodput, Some(1.0));
    }

    #[test]
    fn slos_are_parsed_or_refused_with_the_offending_part() {
        assert_eq!(
            Slo::parse("ttft:500, tpot:50").unwrap(),
            Slo {
                ttft_ms: Some(500.0),
                tpot_ms: Some(50.0),
                e2el_ms: None
            }
        );
        for (bad, named) in [
            ("ttft", "`ttft`"),
            ("ttft:fast", "`fast`"),
            ("ttft:-1", "`-1`"),
            ("itl:5", "`itl`"),
            ("ttft:1,ttft:2", "`ttft` is given twice"),
            ("", "``"),
        ] {
            let e = Slo::parse(bad).unwrap_err();
            assert!(e.contains(named), "{bad:?}: {e}");
        }
    }

    #[test]
    fn itl_pools_every_gap_and_an_empty_pass_is_all_zero() {
        let a = Completion {
            itl: vec![0.01, 0.03],
            ..done(0.1, 0.14, 3)
        };
        let b = Completion {
            itl: vec![0.02],
            ..done(0.1, 0.12, 2)
        };
        let m = metrics(&[&a, &b], 0, 1.0, None);
        assert!((m.itl.mean - 20.0).abs() < 1e-9);
        assert!((m.itl.median - 20.0).abs() < 1e-9);
        assert!((m.itl.p99 - 30.0).abs() < 1e-9);
        let empty = metrics(&[], 3, 1.0, None);
        assert_eq!((empty.completed, empty.failed), (0, 3));
        assert_eq!(empty.ttft, Quantiles::default());
    }

    #[test]
    fn tokens_and_tree_wait_per_step_count_the_requests_that_reported_steps() {
        let speculated = |steps, tree_wait, tokens| Completion {
            speculation: Some(crate::client::Speculated { steps, tree_wait }),
            ..done(0.1, 1.1, tokens)
        };
        // 30 tokens in 10 steps that waited 20 ms in all, and 10 in 10
        // that did not wait; a request over HTTP reports no steps.
        let (a, b) = (speculated(10, 0.02, 30), speculated(10, 0.0, 10));
        let http = done(0.1, 1.1, 50);
        let m = metrics(&[&a, &b, &http], 0, 1.0, None);
        assert!((m.tokens_per_step.unwrap() - 2.0).abs() < 1e-12);
        assert!((m.tree_wait_ms_per_step.unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(m.total_output_tokens, 90);
        let m = metrics(&[&http], 0, 1.0, None);
        assert_eq!((m.tokens_per_step, m.tree_wait_ms_per_step), (None, None));
    }
}
