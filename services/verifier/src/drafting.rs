//! When drafters computed, for what their compute cost the forwards.
//!
//! Every tree says how long its drafting took: just before it was sent,
//! and ahead, while the target verified the step before (see
//! `TokenTree.draft_micros`). The draft links place that drafting in the
//! verifier's time ([`DraftingLog::record`]): the first ended when the
//! tree arrived, the second began when the tree before it did. The
//! batching thread keeps its forwards until the trees drafted during them
//! have had time to arrive ([`SETTLE`]), then sums the drafting that
//! overlapped each ([`Overlaps::settle`]): what the goodput planner fits
//! the forward's slowdown to (`specmesh_planner::contention`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after a forward the trees drafted during it may still arrive:
/// past the draft timeout, a tree is late anyway.
pub const SETTLE: Duration = Duration::from_millis(250);

/// Intervals logged and not yet taken by the batching thread, at most
/// (a batching thread that stops taking them must not grow memory).
const MAX_LOGGED: usize = 4096;

/// A stretch of time a drafter spent drafting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub start: Instant,
    pub end: Instant,
}

impl Interval {
    fn overlap(&self, other: &Interval) -> Duration {
        let (start, end) = (self.start.max(other.start), self.end.min(other.end));
        end.saturating_duration_since(start)
    }
}

/// Drafting intervals the draft links log and the batching thread takes.
#[derive(Debug, Default)]
pub struct DraftingLog {
    logged: Mutex<Vec<Interval>>,
}

impl DraftingLog {
    /// A tree arrived at `arrived`, its drafting having taken `draft` just
    /// before it was sent and `ahead` from the arrival of the session's
    /// previous tree (`previous`) on.
    pub fn record(
        &self,
        arrived: Instant,
        previous: Option<Instant>,
        draft: Duration,
        ahead: Duration,
    ) {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.len() + 2 > MAX_LOGGED {
            return;
        }
        let began = arrived.checked_sub(draft).unwrap_or(arrived);
        if !draft.is_zero() {
            logged.push(Interval {
                start: began,
                end: arrived,
            });
        }
        if !ahead.is_zero() {
            // Ahead drafting starts as the previous tree is sent: placed
            // from its arrival, and never past this tree's own drafting.
            let start = previous
                .unwrap_or_else(|| began.checked_sub(ahead).unwrap_or(began))
                .min(began);
            logged.push(Interval {
                start,
                end: (start + ahead).min(began),
            });
        }
    }

    fn take(&self, into: &mut VecDeque<Interval>) -> Duration {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let mut total = Duration::ZERO;
        for i in logged.drain(..) {
            total += i.end.saturating_duration_since(i.start);
            into.push_back(i);
        }
        total
    }
}

/// A forward waiting for the drafting that overlapped it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forward {
    pub start: Instant,
    pub end: Instant,
    /// Sessions and tokens in it, and its measured seconds.
    pub sessions: usize,
    pub tokens: usize,
    pub seconds: f64,
}

/// The batching thread's forwards and the drafting logged around them.
#[derive(Debug, Default)]
pub struct Overlaps {
    forwards: VecDeque<Forward>,
    intervals: VecDeque<Interval>,
}

impl Overlaps {
    pub fn forward(&mut self, f: Forward) {
        self.forwards.push_back(f);
    }

    /// Takes what `log` holds; hands every forward ended at least
    /// [`SETTLE`] before `now` to `settled` with the seconds of drafting
    /// that overlapped it. Returns the seconds of drafting newly logged.
    pub fn settle(
        &mut self,
        log: &DraftingLog,
        now: Instant,
        mut settled: impl FnMut(&Forward, f64),
    ) -> f64 {
        let logged = log.take(&mut self.intervals);
        while let Some(f) = self.forwards.front() {
            if now.saturating_duration_since(f.end) < SETTLE {
                break;
            }
            let span = Interval {
                start: f.start,
                end: f.end,
            };
            let overlap: Duration = self.intervals.iter().map(|i| i.overlap(&span)).sum();
            settled(f, overlap.as_secs_f64());
            self.forwards.pop_front();
        }
        // Drafting that ended before every forward still to settle (or,
        // with none, before now) overlaps no forward to come.
        let horizon = self.forwards.front().map_or(now, |f| f.start);
        self.intervals.retain(|i| i.end > horizon);
        logged.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn drafting_during_a_forward_is_summed_once_it_settles() {
        let t0 = Instant::now();
        let log = DraftingLog::default();
        let mut o = Overlaps::default();
        // A forward from 10 to 30 ms.
        o.forward(Forward {
            start: t0 + ms(10),
            end: t0 + ms(30),
            sessions: 2,
            tokens: 8,
            seconds: 0.02,
        });
        // Drafted 5 ms, arriving at 25 ms: all inside.
        log.record(t0 + ms(25), None, ms(5), Duration::ZERO);
        // Drafted 10 ms arriving at 35: 5 ms inside; ahead 4 ms from the
        // previous tree's arrival at 12: all inside.
        log.record(t0 + ms(35), Some(t0 + ms(12)), ms(10), ms(4));
        let mut seen = Vec::new();
        // Not settled yet.
        let logged = o.settle(&log, t0 + ms(40), |f, s| seen.push((f.tokens, s)));
        assert!((logged - 0.019).abs() < 1e-9, "{logged}");
        assert!(seen.is_empty());
        o.settle(&log, t0 + ms(30) + SETTLE, |f, s| seen.push((f.tokens, s)));
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, 8);
        assert!((seen[0].1 - 0.014).abs() < 1e-9, "{seen:?}");
        // Nothing kept that no forward can overlap.
        assert!(o.intervals.is_empty() && o.forwards.is_empty());
    }

    #[test]
    fn ahead_drafting_never_runs_past_the_drafting_before_sending() {
        let t0 = Instant::now();
        let log = DraftingLog::default();
        log.record(t0 + ms(20), Some(t0 + ms(10)), ms(5), ms(30));
        let mut got = VecDeque::new();
        log.take(&mut got);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].start, t0 + ms(10));
        assert_eq!(got[1].end, t0 + ms(15));
        // Nothing measured: nothing logged.
        log.record(t0, None, Duration::ZERO, Duration::ZERO);
        let mut none = VecDeque::new();
        assert_eq!(log.take(&mut none), Duration::ZERO);
        assert!(none.is_empty());
    }

    #[test]
    fn the_log_is_bounded() {
        let log = DraftingLog::default();
        let t = Instant::now();
        for _ in 0..10_000 {
            log.record(t, None, ms(1), ms(1));
        }
        let mut got = VecDeque::new();
        log.take(&mut got);
        assert!(got.len() <= MAX_LOGGED);
    }
}
