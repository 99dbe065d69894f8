//! The verify cost curve of this machine: one forward over k new tokens at
//! a fixed context, relative to k = 1. Drafters size their trees from it,
//! so it must come from the hardware the verifier actually runs on.

use specmesh_model::{Model, cost};

/// Block sizes measured.
pub const KS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The measured curve and the one-token step it is relative to.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// (k, cost relative to k = 1), non-decreasing.
    pub curve: Vec<(usize, f64)>,
    /// Seconds of one forward over one token: the plain step drafters
    /// price their own work against.
    pub step_seconds: f64,
}

/// Measures the curve at `context` tokens, median of `reps` runs per k.
/// Costs are made non-decreasing (timing noise can invert neighbours).
pub fn measure(model: &Model, context: usize, reps: usize) -> anyhow::Result<Calibration> {
    let samples = cost::measure(model, clamp(model, context), &KS, reps)?;
    let base = samples[0].median;
    let mut curve = Vec::with_capacity(samples.len());
    let mut last = 1.0f64;
    for s in samples {
        let rel = if s.k == 1 {
            1.0
        } else {
            (s.median / base).max(last)
        };
        curve.push((s.k, rel));
        last = rel;
    }
    Ok(Calibration {
        curve,
        step_seconds: base,
    })
}

/// Seconds of one forward over one token at `context` tokens, median of
/// `reps`, for a verifier given its curve (`--cost-curve`).
pub fn step_seconds(model: &Model, context: usize, reps: usize) -> anyhow::Result<f64> {
    let samples = cost::measure(model, clamp(model, context), &[1], reps)?;
    Ok(samples.first().map_or(0.0, |s| s.median))
}

fn clamp(model: &Model, context: usize) -> usize {
    context.min(
        model
            .config()
            .max_context
            .saturating_sub(KS[KS.len() - 1] + 1),
    )
}
