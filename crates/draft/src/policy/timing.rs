//! What a speculative step costs beyond its verify forward, learned from the
//! durations of the session's own steps.
//!
//! The cost curve prices only the verifier's forward. A speculative step
//! also waits for its tree (drafting, a network round trip), verifies it,
//! and on a small machine the drafter's CPU time slows the verifier's
//! threads. None of that is in the curve, and a policy that ignores it
//! speculates where the curve says it pays but the clock says it does not.
//!
//! So the drafter times every step (outcome to outcome) and reports it: a
//! plain step's duration is the unit, and a speculative step's duration in
//! that unit, minus what the curve predicted for it, is its overhead. Both
//! are moving averages; the overhead is added to the curve's price of every
//! speculative step. Until a plain step has been timed there is no unit and
//! the overhead is 0, the curve alone.

/// Weight of a new sample in the moving averages (about the last 20 steps).
const ALPHA: f64 = 0.1;
/// A speculative step's measured overhead is clamped to this many plain
/// steps, so one stall (a GC pause, a preempted process) cannot switch
/// speculation off for long.
const MAX_OVERHEAD: f64 = 2.0;

/// Step durations of one session.
#[derive(Clone, Debug, Default)]
pub struct StepTiming {
    /// Seconds per plain (root-only) step.
    plain: Option<f64>,
    /// Extra cost of a speculative step, in plain steps.
    overhead: f64,
    /// Speculative steps timed.
    speculative: u32,
}

impl StepTiming {
    /// A run of `steps` plain steps took `secs` in all.
    pub fn observe_plain(&mut self, steps: usize, secs: f64) {
        if steps == 0 || !(secs.is_finite() && secs > 0.0) {
            return;
        }
        let per_step = secs / steps as f64;
        self.plain = Some(match self.plain {
            Some(p) => p + ALPHA * (per_step - p),
            None => per_step,
        });
    }

    /// Takes `secs` as the plain step's duration until one is timed: the
    /// verifier's own measurement of a one-token forward, so that a session
    /// that speculates from its first step has a unit at once. Ignored once
    /// a plain step was timed, or when not a finite positive number.
    pub fn declare_plain(&mut self, secs: f64) {
        if self.plain.is_none() && secs.is_finite() && secs > 0.0 {
            self.plain = Some(secs);
        }
    }

    /// A speculative step took `secs`; the cost curve priced it at
    /// `predicted` plain steps.
    pub fn observe_speculative(&mut self, secs: f64, predicted: f64) {
        let Some(plain) = self.plain else { return };
        if !(secs.is_finite() && secs > 0.0 && predicted.is_finite()) {
            return;
        }
        let excess = (secs / plain - predicted).clamp(0.0, MAX_OVERHEAD);
        self.overhead += ALPHA * (excess - self.overhead);
        self.speculative = self.speculative.saturating_add(1);
    }

    /// Starts the overhead at `plain_steps` (what earlier sessions of the
    /// workload measured) rather than 0, so that the first speculative
    /// steps are priced as they will cost. Ignored once a speculative step
    /// was timed, or when not a finite number ≥ 0.
    pub fn seed_overhead(&mut self, plain_steps: f64) {
        if self.speculative == 0 && plain_steps.is_finite() && plain_steps >= 0.0 {
            self.overhead = plain_steps.min(MAX_OVERHEAD);
        }
    }

    /// Speculative steps timed so far.
    pub fn speculative_steps(&self) -> u32 {
        self.speculative
    }

    /// Extra cost of a speculative step beyond the curve, in plain steps.
    pub fn overhead(&self) -> f64 {
        self.overhead
    }

    /// Seconds per plain step, once one has been timed.
    pub fn plain_secs(&self) -> Option<f64> {
        self.plain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_overhead_until_a_plain_step_was_timed() {
        let mut t = StepTiming::default();
        t.observe_speculative(0.050, 1.5);
        assert_eq!(t.overhead(), 0.0);
        t.observe_plain(4, 0.040);
        assert!((t.plain_secs().unwrap() - 0.010).abs() < 1e-12);
    }

    #[test]
    fn learns_the_overhead_beyond_the_curve() {
        let mut t = StepTiming::default();
        t.observe_plain(1, 0.010);
        // Speculative steps take 18 ms where the curve predicts 1.5 plain
        // steps (15 ms): 0.3 plain steps of overhead.
        for _ in 0..200 {
            t.observe_speculative(0.018, 1.5);
        }
        assert!((t.overhead() - 0.3).abs() < 1e-3, "{}", t.overhead());
        // Faster than predicted is no overhead, not a discount.
        for _ in 0..200 {
            t.observe_speculative(0.012, 1.5);
        }
        assert!(t.overhead() < 1e-3);
    }

    #[test]
    fn a_declared_unit_stands_until_plain_steps_are_timed() {
        let mut t = StepTiming::default();
        t.declare_plain(0.010);
        t.observe_speculative(0.018, 1.5);
        assert!(t.overhead() > 0.0);
        t.observe_plain(1, 0.020);
        assert!((t.plain_secs().unwrap() - 0.011).abs() < 1e-12);
        t.declare_plain(1.0);
        assert!((t.plain_secs().unwrap() - 0.011).abs() < 1e-12);
    }

    #[test]
    fn a_seeded_overhead_prices_until_steps_teach_their_own() {
        let mut t = StepTiming::default();
        t.seed_overhead(0.5);
        assert_eq!(t.overhead(), 0.5);
        t.seed_overhead(f64::NAN);
        t.seed_overhead(-1.0);
        assert_eq!(t.overhead(), 0.5);
        t.observe_plain(1, 0.010);
        for _ in 0..200 {
            t.observe_speculative(0.015, 1.5);
        }
        assert!(t.overhead() < 1e-3, "{}", t.overhead());
        assert_eq!(t.speculative_steps(), 200);
        // Once timed, a seed changes nothing.
        t.seed_overhead(1.0);
        assert!(t.overhead() < 1e-3);
    }

    #[test]
    fn one_stall_is_clamped() {
        let mut t = StepTiming::default();
        t.observe_plain(1, 0.010);
        t.observe_speculative(10.0, 1.5);
        assert!(t.overhead() <= ALPHA * MAX_OVERHEAD + 1e-12);
        t.observe_plain(1, f64::NAN);
        t.observe_speculative(-1.0, 1.5);
        assert!((t.plain_secs().unwrap() - 0.010).abs() < 1e-12);
    }
}
