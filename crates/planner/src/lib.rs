//! The goodput planner: one decision per verify step, over the whole batch.
//!
//! Every session in a verifier's batch brings the tree its drafter
//! proposed. Verifying a node costs forward time that every session in the
//! batch waits for, and gains the probability that the target accepts the
//! path to it. The planner chooses, for the batch as a whole, which nodes
//! to verify so that the batch's expected committed tokens per second —
//! its goodput (SmartSpec, arXiv 2406.14066) — is highest:
//!
//! ```text
//!              B + Σ_{granted nodes} p(node)
//!   maximise  ───────────────────────────────          (B: one root per session,
//!              fixed + forward(B + granted)             always committed)
//! ```
//!
//! - `p(node)` is the drafter's score for the path to the node, calibrated
//!   online against what the target accepted ([`calibrate`]), then
//!   scaled per depth by what the granted nodes' estimates missed by
//!   ([`correct`]).
//! - `forward(n)` is the time of one forward over `n` tokens, learned from
//!   the verifier's measured steps with the start-up calibration as its
//!   prior ([`cost::StepModel`]); `fixed` is what a step costs besides its
//!   forward (collecting trees, sampling, commit, streaming), measured the
//!   same way.
//!
//! With estimates that never grow along a path, the best set of `m` nodes
//! is the `m` most likely ones (and it is ancestor-closed), so a greedy
//! marginal allocation is exact: sort every session's nodes by estimate
//! and take the prefix with the highest ratio ([`plan::Planner`]). Zero
//! granted nodes is plain decoding; nodes are granted only when they raise
//! the ratio by at least [`plan::MIN_GAIN`], so the plan never predicts
//! less goodput than plain decoding, and a plan that would win less than
//! its estimates' error (a few per cent under load) is not bought.
//!
//! What a session costs by speculating at all — the batch waits for its
//! tree, its drafter competes for the cores — is sunk once its tree is
//! there, so it cannot be priced within a step; it is measured across
//! steps (the step's gap: [`overhead::Overhead`]; drafting's toll on the
//! forward: [`contention::Contention`]) and decides each session's node-budget
//! forecast ([`forecast`]): a session whose expected gain does not pay for
//! it is told to send no trees but probes.
//!
//! Everything here is arithmetic on numbers the caller passes in: no I/O,
//! no clocks, deterministic for the same inputs.

#![forbid(unsafe_code)]

pub mod calibrate;
pub mod contention;
pub mod correct;
pub mod cost;
mod fit;
pub mod forecast;
pub mod overhead;
pub mod plan;

pub use calibrate::{Calibration, ScoreTable};
pub use contention::Contention;
pub use correct::DepthCorrection;
pub use cost::StepModel;
pub use forecast::Forecast;
pub use overhead::Overhead;
pub use plan::{Grant, Offer, Plan, Planner};

/// Why a planner input was refused; messages name the value to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("the step model needs k = 1 first, then larger k with non-decreasing costs; got {0}")]
    BadCurve(String),
    #[error("the one-token step time {0} s is not a finite positive number")]
    BadStepSeconds(f64),
    #[error("offer {session}: {len} estimates for a tree of {nodes} nodes")]
    EstimatesMismatch {
        session: usize,
        len: usize,
        nodes: usize,
    },
}

/// A probability from outside, made safe: NaN and negatives become 0,
/// anything above 1 becomes 1.
pub fn unit(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}
