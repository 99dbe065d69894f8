//! A least-squares line with exponential forgetting: what the planner's
//! cross-step measurements ([`crate::overhead`], [`crate::contention`])
//! fit, so they follow a machine whose load changes.

/// Exponentially weighted sums of (x, y).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DecayedLine {
    decay: f64,
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

impl DecayedLine {
    /// A line forgetting by `decay` per point (0.995: ~200 points).
    pub(crate) const fn new(decay: f64) -> DecayedLine {
        DecayedLine {
            decay,
            n: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
        }
    }

    /// Adds a point; non-finite ones are ignored.
    pub(crate) fn add(&mut self, x: f64, y: f64) {
        if !(x.is_finite() && y.is_finite()) {
            return;
        }
        let d = self.decay;
        self.n = self.n * d + 1.0;
        self.sx = self.sx * d + x;
        self.sy = self.sy * d + y;
        self.sxx = self.sxx * d + x * x;
        self.sxy = self.sxy * d + x * y;
    }

    /// The slope, when at least 8 points (decayed) vary enough in x;
    /// `None` before.
    pub(crate) fn slope(&self) -> Option<f64> {
        let var = self.n * self.sxx - self.sx * self.sx;
        if self.n < 8.0 || var <= 1e-9 * self.n * self.n {
            return None;
        }
        Some((self.n * self.sxy - self.sx * self.sy) / var)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_line_and_forgets_the_old_one() {
        let mut l = DecayedLine::new(0.99);
        assert_eq!(l.slope(), None);
        for i in 0..300 {
            l.add(f64::from(i % 7), 1.0 + 2.0 * f64::from(i % 7));
        }
        assert!((l.slope().unwrap() - 2.0).abs() < 1e-9);
        for i in 0..2000 {
            l.add(f64::from(i % 7), 1.0 - 0.5 * f64::from(i % 7));
        }
        assert!((l.slope().unwrap() + 0.5).abs() < 1e-3);
        l.add(f64::NAN, 1.0);
        l.add(1.0, f64::INFINITY);
        assert!((l.slope().unwrap() + 0.5).abs() < 1e-3);
    }

    #[test]
    fn no_slope_without_variation() {
        let mut l = DecayedLine::new(0.99);
        for _ in 0..100 {
            l.add(3.0, 5.0);
        }
        assert_eq!(l.slope(), None);
    }
}
