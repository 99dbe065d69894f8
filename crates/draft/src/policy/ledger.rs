//! What finished sessions learned, for the sessions after them.
//!
//! A session's policy starts from a guess: acceptance 0.5 per depth (0.8
//! for a draft model's arm) until its own steps say otherwise, and no
//! overhead on its first speculative steps. With one arm the guess costs a
//! few shallow trees. With a draft model beside the model-free drafters it
//! costs more: on code the model's guessed 0.8 beat the model-free arm's
//! two measured steps, so sessions switched to the model, paying its
//! prefill and its forwards for trees the suffix drafters had drafted for
//! free (docs/lab/drafting.md, "A draft model present never costs").
//!
//! A [`Ledger`] keeps, per key (the drafter keys it by tenant, target,
//! greedy or sampled, and arm: a workload as its callers separate them),
//! the acceptance per depth and the speculative overhead that the
//! sessions using that arm measured. Each session's evidence fades as
//! later ones arrive ([`Ledger::KEEP`]: about the last five sessions
//! count). A new session's arm starts from them ([`Learned`],
//! [`super::Arms::seed`]): the rates become its per-depth priors, worth
//! the policy's usual prior strength, so the session's own steps still
//! take over within a few steps. At most `capacity` keys are kept; the
//! least recently used goes first.

use std::collections::HashMap;
use std::hash::Hash;

use super::{AcceptanceStats, SpecPolicy};

/// What earlier sessions of a workload learned about one arm.
#[derive(Clone, Debug, PartialEq)]
pub struct Learned {
    /// Acceptance per depth, index 0 = depth 1.
    pub rates: Vec<f64>,
    /// A speculative step's overhead beyond the verify forward, in plain
    /// steps, once sessions timed enough of them.
    pub overhead: Option<f64>,
    /// Sessions that taught this.
    pub sessions: u64,
}

#[derive(Clone, Debug)]
struct Entry {
    stats: AcceptanceStats,
    overhead: Option<f64>,
    sessions: u64,
    /// The ledger's clock when last read or written.
    touched: u64,
}

/// Per-workload, per-arm evidence of finished sessions; see the module
/// docs.
#[derive(Clone, Debug)]
pub struct Ledger<K> {
    entries: HashMap<K, Entry>,
    capacity: usize,
    clock: u64,
}

impl<K: Eq + Hash + Clone> Ledger<K> {
    /// Share of the evidence so far kept as a session's is added.
    pub const KEEP: f64 = 0.8;
    /// Speculative steps a session must have timed for its overhead to
    /// count.
    pub const MIN_TIMED: u32 = 3;

    /// A ledger of at most `capacity` keys (at least 1).
    pub fn new(capacity: usize) -> Ledger<K> {
        Ledger {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What the sessions of `key` learned, for depths `1..=max_depth`;
    /// `None` before any session recorded.
    pub fn learned(&mut self, key: &K, max_depth: usize) -> Option<Learned> {
        self.clock += 1;
        let e = self.entries.get_mut(key)?;
        e.touched = self.clock;
        Some(Learned {
            rates: e.stats.rates(max_depth),
            overhead: e.overhead,
            sessions: e.sessions,
        })
    }

    /// Adds what `policy` (one session's arm) measured under `key`. A
    /// policy that observed no step adds nothing.
    pub fn record(&mut self, key: K, policy: &SpecPolicy) {
        let stats = policy.stats();
        if stats.weight() <= 0.0 {
            return;
        }
        self.clock += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.evict();
        }
        let timing = policy.timing();
        let timed = (timing.speculative_steps() >= Self::MIN_TIMED).then(|| timing.overhead());
        let clock = self.clock;
        let e = self.entries.entry(key).or_insert_with(|| Entry {
            stats: stats.unobserved(),
            overhead: None,
            sessions: 0,
            touched: clock,
        });
        e.stats.absorb(stats, Self::KEEP);
        e.overhead = match (e.overhead, timed) {
            (Some(o), Some(t)) => Some(o + (1.0 - Self::KEEP) * (t - o)),
            (o, t) => t.or(o),
        };
        e.sessions += 1;
        e.touched = clock;
    }

    /// Drops the least recently used key.
    fn evict(&mut self) {
        let oldest = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.touched)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            self.entries.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{CostCurve, PolicyConfig};

    fn policy() -> SpecPolicy {
        SpecPolicy::new(CostCurve::cpu_default(), PolicyConfig::default()).unwrap()
    }

    /// A session's arm that saw `steps` chains of 8 accepted at `rate` per
    /// depth.
    fn session(rate: f64, steps: usize) -> SpecPolicy {
        let mut p = policy();
        crate::policy::tests::observe_chains(&mut p, rate, steps);
        p
    }

    #[test]
    fn nothing_is_learned_before_a_session_records() {
        let mut l: Ledger<&str> = Ledger::new(4);
        assert_eq!(l.learned(&"code", 8), None);
        // A session that never stepped teaches nothing.
        l.record("code", &policy());
        assert!(l.is_empty());
    }

    #[test]
    fn sessions_teach_their_rates_and_fade() {
        let mut l = Ledger::new(4);
        let one = session(0.9, 100);
        l.record("code", &one);
        let first = l.learned(&"code", 4).unwrap();
        assert_eq!(first.sessions, 1);
        assert_eq!(first.rates, one.stats().rates(4));
        assert!(first.rates[0] > 0.85, "{first:?}");
        // Later sessions at 0.3 take over within a few sessions.
        for _ in 0..12 {
            l.record("code", &session(0.3, 100));
        }
        let later = l.learned(&"code", 4).unwrap();
        let own = session(0.3, 100).stats().rate(1);
        assert!(
            own < 0.5 && (later.rates[0] - own).abs() < 0.05,
            "{later:?} {own}"
        );
        assert_eq!(later.sessions, 13);
        // Workloads stay apart.
        assert_eq!(l.learned(&"chat", 4), None);
    }

    #[test]
    fn the_overhead_counts_once_enough_steps_were_timed() {
        let mut l = Ledger::new(4);
        let mut p = session(0.8, 20);
        p.timing_mut().observe_plain(1, 0.010);
        p.timing_mut().observe_speculative(0.030, 1.0);
        l.record("k", &p);
        assert_eq!(l.learned(&"k", 1).unwrap().overhead, None);
        for _ in 0..40 {
            p.timing_mut().observe_speculative(0.030, 1.0);
        }
        l.record("k", &p);
        let o = l.learned(&"k", 1).unwrap().overhead.unwrap();
        assert!((o - 2.0).abs() < 0.05, "{o}");
    }

    #[test]
    fn the_least_recently_used_key_goes_first() {
        let mut l = Ledger::new(2);
        l.record("a", &session(0.5, 10));
        l.record("b", &session(0.5, 10));
        // Reading "a" keeps it; "b" goes.
        assert!(l.learned(&"a", 1).is_some());
        l.record("c", &session(0.5, 10));
        assert_eq!(l.len(), 2);
        assert!(l.learned(&"b", 1).is_none());
        assert!(l.learned(&"a", 1).is_some() && l.learned(&"c", 1).is_some());
    }
}
