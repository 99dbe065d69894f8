//! What a session's speculating costs the batch besides its nodes' share
//! of the forward: the batch waits for its tree (the drafter's round trip
//! and drafting), and its drafter's work competes for the cores. The
//! planner cannot see this in one step (the tree is already there), so it
//! is measured across steps: a least-squares line, with exponential
//! forgetting, of a step's non-forward time against the number of sessions
//! in it that brought a tree. Its slope is the seconds one more
//! speculating session adds; the intercept is the rest of the step.
//!
//! A session is worth speculating for only while what it gains pays for
//! that: `expected accepted tokens per step > slope · batch goodput`
//! ([`Overhead::pays`]). Otherwise its forecast is 0, and its drafter
//! stops sending trees but for probes.

use crate::fit::DecayedLine;

/// Forgetting per observed step: ~200 steps of memory.
const DECAY: f64 = 0.995;

/// The fitted line of (speculating sessions, gap).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overhead {
    line: DecayedLine,
}

impl Default for Overhead {
    fn default() -> Overhead {
        Overhead {
            line: DecayedLine::new(DECAY),
        }
    }
}

impl Overhead {
    /// A step with `speculating` sessions that brought trees spent
    /// `seconds` outside its forward. Non-finite or negative times are
    /// ignored.
    pub fn observe(&mut self, speculating: usize, seconds: f64) {
        if seconds >= 0.0 {
            self.line.add(speculating as f64, seconds);
        }
    }

    /// Seconds one more speculating session adds to a step (0 until the
    /// steps seen vary enough in how many sessions speculated).
    pub fn per_session(&self) -> f64 {
        self.line.slope().map_or(0.0, |s| s.max(0.0))
    }

    /// Whether a session expected to gain `gain` accepted tokens per step
    /// pays for its overhead, and for `extra` seconds per step its
    /// speculating costs besides (its drafting's toll on the forward, see
    /// [`crate::contention`]), in a batch committing `goodput` tokens per
    /// second.
    pub fn pays(&self, gain: f64, extra: f64, goodput: f64) -> bool {
        gain.is_finite() && gain > (self.per_session() + extra.max(0.0)) * goodput.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_is_what_each_speculating_session_adds() {
        let mut o = Overhead::default();
        assert_eq!(o.per_session(), 0.0);
        for i in 0..400 {
            let s = i % 9;
            // 2 ms of fixed time, 0.5 ms per speculating session, noise.
            let noise = if i % 2 == 0 { 1e-4 } else { -1e-4 };
            o.observe(s, 0.002 + 0.0005 * s as f64 + noise);
        }
        assert!(
            (o.per_session() - 0.0005).abs() < 2e-5,
            "{}",
            o.per_session()
        );
        // At 200 tokens/s a token is worth 5 ms: half a token per step pays
        // 0.5 ms, a tenth does not.
        assert!(o.pays(0.5, 0.0, 200.0));
        assert!(!o.pays(0.05, 0.0, 200.0));
        assert!(!o.pays(f64::NAN, 0.0, 200.0));
        // Half a token no longer pays when its drafting costs the forward
        // 3 ms more.
        assert!(!o.pays(0.5, 0.003, 200.0));
    }

    #[test]
    fn no_variation_no_slope_and_garbage_is_ignored() {
        let mut o = Overhead::default();
        for _ in 0..100 {
            o.observe(4, 0.003);
        }
        assert_eq!(o.per_session(), 0.0);
        let before = o;
        o.observe(3, f64::NAN);
        o.observe(3, -1.0);
        assert_eq!(o, before);
        // A negative slope (noise) is no overhead.
        let mut o = Overhead::default();
        for i in 0..100 {
            o.observe(i % 4, 0.004 - 0.001 * (i % 4) as f64);
        }
        assert_eq!(o.per_session(), 0.0);
        assert!(o.pays(0.01, 0.0, 1000.0));
    }
}
