//! What drafting on the verifier's own cores costs its forwards.
//!
//! A drafter on the verifier's host takes cores from the target's forward
//! while it drafts: on a 2-core machine a forward that shares its cores
//! with drafting runs measurably slower, and that cost is every session's
//! in the batch, not only the drafting one's. A drafter on another host
//! costs the forward nothing. Which one it is, is measured, not
//! configured: each tree says how long its drafting took, the verifier
//! places that drafting in time and sums what of it overlapped each
//! forward, and a least-squares line with exponential forgetting fits a
//! forward's time above the step-time model's prediction against that
//! overlap. Its slope is the forward seconds one second of concurrent
//! drafting adds (≈ 0 on a separate host, up to ~1 where drafting stalls
//! the forward's threads).
//!
//! A session's drafting is then priced at `slowdown · overlapped share ·
//! its drafting seconds per step`, on top of its share of the step's gap
//! ([`crate::overhead`]): a session whose expected gain does not pay for
//! both is told to send no trees but probes.

use crate::fit::DecayedLine;

/// Forgetting per observed forward: ~200 forwards of memory.
const DECAY: f64 = 0.995;

/// A slope above this is noise (one second of drafting on one core cannot
/// stall a forward by more than a second or two).
const MAX_SLOWDOWN: f64 = 2.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contention {
    line: DecayedLine,
    /// Drafting seconds logged, and those that overlapped a forward
    /// (both decayed per forward).
    drafted: f64,
    overlapped: f64,
}

impl Default for Contention {
    fn default() -> Contention {
        Contention {
            line: DecayedLine::new(DECAY),
            drafted: 0.0,
            overlapped: 0.0,
        }
    }
}

impl Contention {
    /// A forward during which drafters drafted for `overlap` seconds took
    /// `excess` seconds more than the step-time model predicts for its
    /// tokens (negative: less). Non-finite or negative overlaps are
    /// ignored.
    pub fn observe(&mut self, overlap: f64, excess: f64) {
        if !(overlap.is_finite() && overlap >= 0.0 && excess.is_finite()) {
            return;
        }
        self.line.add(overlap, excess);
        self.drafted *= DECAY;
        self.overlapped = self.overlapped * DECAY + overlap;
    }

    /// Drafters reported `seconds` of drafting.
    pub fn drafted(&mut self, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            self.drafted += seconds;
        }
    }

    /// Forward seconds one second of concurrent drafting adds (0 until
    /// forwards have been seen with and without drafting).
    pub fn slowdown(&self) -> f64 {
        self.line
            .slope()
            .map_or(0.0, |s| s.clamp(0.0, MAX_SLOWDOWN))
    }

    /// The share of the drafting that ran during forwards.
    pub fn overlapped_share(&self) -> f64 {
        if self.drafted <= 0.0 {
            0.0
        } else {
            (self.overlapped / self.drafted).clamp(0.0, 1.0)
        }
    }

    /// Forward seconds per step a session drafting `drafting` seconds per
    /// step costs the batch.
    pub fn price(&self, drafting: f64) -> f64 {
        if drafting.is_finite() && drafting > 0.0 {
            self.slowdown() * self.overlapped_share() * drafting
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forwards alternating between 0 and 4 ms of concurrent drafting,
    /// with `slowdown` forward seconds per drafting second.
    fn measured(slowdown: f64) -> Contention {
        let mut c = Contention::default();
        for i in 0..400 {
            let overlap = 0.001 * f64::from(i % 5);
            let noise = if i % 2 == 0 { 2e-4 } else { -2e-4 };
            c.drafted(overlap * 2.0);
            c.observe(overlap, slowdown * overlap + noise);
        }
        c
    }

    #[test]
    fn drafting_on_shared_cores_is_priced() {
        let c = measured(0.8);
        assert!((c.slowdown() - 0.8).abs() < 0.05, "{}", c.slowdown());
        // Half the drafting overlapped a forward.
        assert!((c.overlapped_share() - 0.5).abs() < 0.01);
        // 2 ms of drafting per step: 0.8 ms of forward.
        assert!((c.price(0.002) - 0.0008).abs() < 1e-4, "{}", c.price(0.002));
        assert_eq!(c.price(f64::NAN), 0.0);
    }

    #[test]
    fn a_drafter_on_another_host_costs_nothing() {
        let c = measured(0.0);
        assert!(c.slowdown() < 0.05, "{}", c.slowdown());
        assert!(c.price(0.002) < 1e-4);
        // Nothing seen: nothing priced.
        assert_eq!(Contention::default().price(0.01), 0.0);
    }

    #[test]
    fn garbage_is_ignored_and_the_slope_bounded() {
        let mut c = measured(50.0);
        assert_eq!(c.slowdown(), MAX_SLOWDOWN);
        let before = c;
        c.observe(f64::NAN, 1.0);
        c.observe(-1.0, 1.0);
        c.observe(0.001, f64::INFINITY);
        c.drafted(f64::NAN);
        c.drafted(-1.0);
        assert_eq!(c, before);
    }
}
