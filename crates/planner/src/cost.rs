//! The step-time model: seconds of one verify forward over `n` tokens (the
//! batch's roots and granted nodes together).
//!
//! Piecewise linear over buckets at powers of two (1, 2, 4, …, 1024
//! tokens), beyond the last extrapolated along its last segment. The prior
//! is the verifier's start-up calibration (its one-token step and cost
//! curve); every measured forward then moves the two buckets around its
//! size towards what it took, each by its share of the interpolation, as an
//! exponential moving average, except a one-token forward, which scales the
//! whole curve (it measures the machine's speed, not the curve's shape). So
//! the model follows this machine's real step times (other load, a hotter
//! cache, longer contexts) instead of one measurement at start.

use crate::PlanError;

/// Bucket sizes, in tokens per forward.
pub const BUCKETS: [usize; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Weight of one measured forward in its buckets' averages.
const EMA: f64 = 0.1;

/// A measurement more than this many times off the model is clamped: one
/// forward stalled by the OS must not rewrite the curve.
const MAX_SURPRISE: f64 = 4.0;

#[derive(Debug, Clone, PartialEq)]
pub struct StepModel {
    secs: [f64; BUCKETS.len()],
    /// Seconds of a step besides its forward: trees collected, sampled,
    /// committed and streamed (moving average).
    fixed: f64,
    observed: u64,
}

impl StepModel {
    /// The prior: a one-token forward of `step_seconds`, and `curve` as
    /// (k, cost relative to k = 1) points starting at (1, 1), costs
    /// non-decreasing; between points linear, past the last linear along
    /// its last segment. A curve of (1, 1) alone says nothing of larger
    /// forwards: each token is then priced as a whole step.
    pub fn from_curve(step_seconds: f64, curve: &[(usize, f64)]) -> Result<StepModel, PlanError> {
        if !(step_seconds.is_finite() && step_seconds > 0.0) {
            return Err(PlanError::BadStepSeconds(step_seconds));
        }
        if curve == [(1, 1.0)] {
            return StepModel::from_curve(step_seconds, &[(1, 1.0), (2, 2.0)]);
        }
        let ok = curve.first() == Some(&(1, 1.0))
            && curve
                .windows(2)
                .all(|w| w[1].0 > w[0].0 && w[1].1 >= w[0].1 && w[1].1.is_finite());
        if !ok || curve.len() < 2 {
            return Err(PlanError::BadCurve(format!("{curve:?}")));
        }
        let mut secs = [0.0; BUCKETS.len()];
        for (s, &k) in secs.iter_mut().zip(&BUCKETS) {
            *s = step_seconds * interpolate(curve, k as f64);
        }
        Ok(StepModel {
            secs,
            fixed: 0.0,
            observed: 0,
        })
    }

    /// Predicted seconds of a forward over `tokens` tokens.
    pub fn forward(&self, tokens: usize) -> f64 {
        let points = BUCKETS.iter().map(|&k| k as f64).zip(self.secs);
        let n = tokens.max(1) as f64;
        let mut prev = None;
        for (k, s) in points {
            if n <= k {
                return match prev {
                    None => s,
                    Some((k0, s0)) => s0 + (s - s0) * (n - k0) / (k - k0),
                };
            }
            prev = Some((k, s));
        }
        let last = BUCKETS.len() - 1;
        let (k0, k1) = (BUCKETS[last - 1] as f64, BUCKETS[last] as f64);
        let slope = (self.secs[last] - self.secs[last - 1]) / (k1 - k0);
        self.secs[last] + slope * (n - k1)
    }

    /// Seconds of a whole step over `tokens` tokens: the forward and the
    /// fixed part.
    pub fn step(&self, tokens: usize) -> f64 {
        self.fixed + self.forward(tokens)
    }

    /// The fixed part of a step, in seconds.
    pub fn fixed(&self) -> f64 {
        self.fixed
    }

    /// Forwards measured so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// A forward over `tokens` tokens took `seconds`. Non-finite or
    /// non-positive times are ignored.
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let predicted = self.forward(tokens).max(1e-9);
        let ratio = (seconds / predicted).clamp(1.0 / MAX_SURPRISE, MAX_SURPRISE);
        let n = tokens.max(1);
        match BUCKETS.iter().position(|&k| k >= n) {
            // A one-token forward measures the machine's speed now (other
            // load, the clock), which moves every forward alike: the whole
            // curve scales, its shape kept. Were the larger buckets only
            // raised with it (below) and never lowered, a few seconds of a
            // neighbour's load would leave them high after it ended; the
            // planner would then grant no nodes, no larger forward would
            // run to correct them, and speculation would stay off.
            Some(0) => {
                let f = 1.0 + EMA * (ratio - 1.0);
                for s in &mut self.secs {
                    *s *= f;
                }
            }
            Some(i) => {
                let (k0, k1) = (BUCKETS[i - 1] as f64, BUCKETS[i] as f64);
                let w = (n as f64 - k0) / (k1 - k0);
                self.secs[i - 1] *= 1.0 + EMA * (1.0 - w) * (ratio - 1.0);
                self.secs[i] *= 1.0 + EMA * w * (ratio - 1.0);
            }
            None => {
                let last = BUCKETS.len() - 1;
                self.secs[last] *= 1.0 + EMA * (ratio - 1.0);
            }
        }
        // A forward over more tokens is never cheaper: keep the buckets
        // non-decreasing whichever one moved.
        for i in 1..self.secs.len() {
            if self.secs[i] < self.secs[i - 1] {
                self.secs[i] = self.secs[i - 1];
            }
        }
        self.observed += 1;
    }

    /// A step spent `seconds` besides its forward. Non-finite or negative
    /// times are ignored.
    pub fn observe_fixed(&mut self, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            self.fixed += EMA * (seconds - self.fixed);
        }
    }

    /// (tokens, seconds) at every bucket, for reports.
    pub fn points(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        BUCKETS.iter().copied().zip(self.secs)
    }
}

/// The curve at `k`: linear between points, past the last along its last
/// segment.
fn interpolate(curve: &[(usize, f64)], k: f64) -> f64 {
    for w in curve.windows(2) {
        let ((k0, c0), (k1, c1)) = ((w[0].0 as f64, w[0].1), (w[1].0 as f64, w[1].1));
        if k <= k1 {
            return c0 + (c1 - c0) * (k - k0).max(0.0) / (k1 - k0);
        }
    }
    let n = curve.len();
    let ((k0, c0), (k1, c1)) = (
        (curve[n - 2].0 as f64, curve[n - 2].1),
        (curve[n - 1].0 as f64, curve[n - 1].1),
    );
    c1 + (c1 - c0) / (k1 - k0) * (k - k1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> StepModel {
        StepModel::from_curve(0.01, &[(1, 1.0), (2, 1.2), (4, 1.5), (8, 2.2), (64, 13.6)]).unwrap()
    }

    #[test]
    fn the_prior_follows_the_curve() {
        let m = model();
        assert!((m.forward(1) - 0.01).abs() < 1e-12);
        assert!((m.forward(4) - 0.015).abs() < 1e-12);
        assert!((m.forward(3) - 0.0135).abs() < 1e-12);
        // Past the curve's last point, along its last segment.
        let slope = (13.6 - 2.2) / 56.0;
        assert!((m.forward(128) - 0.01 * (13.6 + slope * 64.0)).abs() < 1e-9);
        assert!(m.forward(5000) > m.forward(1024));
    }

    #[test]
    fn refuses_bad_priors() {
        assert!(StepModel::from_curve(0.0, &[(1, 1.0), (2, 1.1)]).is_err());
        assert!(StepModel::from_curve(f64::NAN, &[(1, 1.0), (2, 1.1)]).is_err());
        assert!(StepModel::from_curve(0.01, &[]).is_err());
        assert!(StepModel::from_curve(0.01, &[(2, 1.0)]).is_err());
        // (1, 1) alone: every token a whole step.
        let linear = StepModel::from_curve(0.01, &[(1, 1.0)]).unwrap();
        assert!((linear.forward(8) - 0.08).abs() < 1e-12);
        assert!(StepModel::from_curve(0.01, &[(2, 1.0), (4, 1.1)]).is_err());
        assert!(StepModel::from_curve(0.01, &[(1, 1.0), (4, 0.9)]).is_err());
        assert!(StepModel::from_curve(0.01, &[(1, 1.0), (4, f64::INFINITY)]).is_err());
    }

    #[test]
    fn measured_steps_move_the_model_towards_them() {
        let mut m = model();
        for _ in 0..200 {
            m.observe(16, 0.05);
        }
        assert!((m.forward(16) - 0.05).abs() < 0.002, "{}", m.forward(16));
        // Still non-decreasing, and the untouched far end kept its prior.
        let pts: Vec<f64> = m.points().map(|p| p.1).collect();
        assert!(pts.windows(2).all(|w| w[1] >= w[0]));
        // Between buckets: both neighbours move.
        let mut m = model();
        let (a, b) = (m.forward(4), m.forward(8));
        m.observe(6, 1.0);
        assert!(m.forward(4) > a && m.forward(8) > b);
    }

    #[test]
    fn a_passing_slowdown_of_one_token_steps_leaves_no_trace() {
        // A neighbour's load makes the one-token forwards 3x slower for a
        // while, then it ends; no larger forward runs meanwhile (the
        // planner grants nothing it thinks too dear). The curve must come
        // back, not keep its larger buckets where the slowdown raised them.
        let mut m = model();
        let prior: Vec<f64> = m.points().map(|p| p.1).collect();
        for _ in 0..100 {
            m.observe(1, 0.03);
        }
        assert!(m.forward(8) > 1.3 * prior[3], "the slowdown is seen");
        for _ in 0..200 {
            m.observe(1, 0.01);
        }
        for (now, was) in m.points().map(|p| p.1).zip(&prior) {
            assert!((now / was - 1.0).abs() < 0.01, "{now} against {was}");
        }
    }

    #[test]
    fn outliers_and_garbage_are_bounded() {
        let mut m = model();
        let before = m.forward(1);
        m.observe(1, 1000.0);
        assert!(m.forward(1) <= before * (1.0 + EMA * (MAX_SURPRISE - 1.0)) + 1e-12);
        let snapshot = m.clone();
        m.observe(1, f64::NAN);
        m.observe(1, -1.0);
        m.observe_fixed(f64::NAN);
        m.observe_fixed(-1.0);
        assert_eq!(m, snapshot);
        m.observe_fixed(0.002);
        assert!((m.fixed() - 0.0002).abs() < 1e-12);
        assert!((m.step(1) - m.forward(1) - m.fixed()).abs() < 1e-15);
    }
}
