//! The verifier's measured cost curve.

use super::PolicyError;

/// The verifier's cost of one forward over `k` tokens relative to `k = 1`,
/// linear between measured points and extrapolated from the last segment.
#[derive(Clone, Debug, PartialEq)]
pub struct CostCurve {
    /// (k, relative cost), k strictly increasing from 1, cost
    /// non-decreasing from 1.
    points: Vec<(usize, f64)>,
}

impl CostCurve {
    /// Validates relative costs: `points[0]` must be `(1, 1.0)`, k strictly
    /// increasing, costs finite and non-decreasing.
    pub fn new(points: Vec<(usize, f64)>) -> Result<CostCurve, PolicyError> {
        if points.len() < 2 {
            return Err(PolicyError::TooFewPoints(points.len()));
        }
        for (index, &(_, cost)) in points.iter().enumerate() {
            if !cost.is_finite() || cost <= 0.0 {
                return Err(PolicyError::BadCost { index, cost });
            }
        }
        let (k0, c0) = points[0];
        if k0 != 1 || (c0 - 1.0).abs() > 1e-9 {
            return Err(PolicyError::BadFirstPoint { k: k0, cost: c0 });
        }
        for (index, w) in points.windows(2).enumerate() {
            let ((pk, pc), (k, cost)) = (w[0], w[1]);
            if k <= pk {
                return Err(PolicyError::UnsortedK {
                    index: index + 1,
                    k,
                    previous: pk,
                });
            }
            if cost < pc {
                return Err(PolicyError::DecreasingCost {
                    index: index + 1,
                    k,
                    cost,
                    previous: pc,
                });
            }
        }
        Ok(CostCurve { points })
    }

    /// Builds the curve from absolute forward times (any unit), dividing by
    /// the time at `k = 1`, which must be the first point: what a benchmark
    /// measures directly.
    pub fn from_times(times: &[(usize, f64)]) -> Result<CostCurve, PolicyError> {
        let Some(&(k0, t0)) = times.first() else {
            return Err(PolicyError::TooFewPoints(0));
        };
        if k0 != 1 || !t0.is_finite() || t0 <= 0.0 {
            return Err(PolicyError::BadFirstPoint { k: k0, cost: t0 });
        }
        CostCurve::new(times.iter().map(|&(k, t)| (k, t / t0)).collect())
    }

    /// The CPU verifier's curve measured on the test model at context 512
    /// (`bench-model`); a reasonable default until the verifier reports its
    /// own.
    pub fn cpu_default() -> CostCurve {
        CostCurve {
            points: vec![(1, 1.0), (2, 1.26), (4, 1.85), (8, 2.99), (16, 5.02)],
        }
    }

    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// Relative cost of a forward over `k` tokens (`k` ≥ 1; smaller values
    /// are treated as 1).
    pub fn cost(&self, k: usize) -> f64 {
        let k = k.max(1);
        // The segment containing k, or the last one to extrapolate from.
        let i = self
            .points
            .windows(2)
            .position(|w| k <= w[1].0)
            .unwrap_or(self.points.len() - 2);
        let ((k0, c0), (k1, c1)) = (self.points[i], self.points[i + 1]);
        c0 + (c1 - c0) * (k as f64 - k0 as f64) / (k1 - k0) as f64
    }

    /// Cost of a speculative step drafting `drafted` nodes per session,
    /// relative to plain decoding, when the verifier batches `batch`
    /// sessions (each sends its root plus `drafted` nodes).
    pub fn step_cost(&self, drafted: usize, batch: usize) -> f64 {
        let b = batch.max(1);
        self.cost((drafted + 1) * b) / self.cost(b)
    }
}
