//! Per-depth acceptance statistics of one session.

use specmesh_tree::TokenTree;

use super::{PolicyError, check_unit};
use crate::Feedback;

/// Per-depth acceptance counts with a Beta prior and exponential forgetting.
///
/// Depth `d`'s rate is the posterior mean of
/// `P(depth d accepted | depth d − 1 accepted and depth d was offered)`.
/// Its prior is the global prior for depth 1 and depth `d − 1`'s posterior
/// below that, so a depth the session never reached is assumed to behave
/// like the deepest one it did: zero acceptance at depth 1 does not leave
/// an optimistic default waiting at depth 2.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptanceStats {
    prior: f64,
    strength: f64,
    decay: f64,
    /// (accepted, rejected) weights per depth, index 0 = depth 1.
    counts: Vec<(f64, f64)>,
}

impl AcceptanceStats {
    /// `prior`: assumed rate before any observation, in [0, 1];
    /// `strength`: how many observations the prior is worth (> 0);
    /// `decay`: factor applied to a depth's counts each time it is
    /// observed, in (0, 1] (1 = never forget; 0.95 ≈ the last 20 steps).
    pub fn new(prior: f64, strength: f64, decay: f64) -> Result<AcceptanceStats, PolicyError> {
        check_unit("prior", prior)?;
        if !strength.is_finite() || strength <= 0.0 {
            return Err(PolicyError::BadConfig {
                field: "prior_strength",
                value: strength,
                reason: "must be a finite number > 0",
            });
        }
        if !(decay > 0.0 && decay <= 1.0) {
            return Err(PolicyError::BadConfig {
                field: "decay",
                value: decay,
                reason: "must be in (0, 1]",
            });
        }
        Ok(AcceptanceStats {
            prior,
            strength,
            decay,
            counts: Vec::new(),
        })
    }

    /// Replaces the prior (e.g. with a drafter's own confidence); the
    /// observations are kept. Values outside [0, 1] are clamped.
    pub fn set_prior(&mut self, prior: f64) {
        if prior.is_finite() {
            self.prior = prior.clamp(0.0, 1.0);
        }
    }

    pub fn prior(&self) -> f64 {
        self.prior
    }

    /// Records a step: depths `1..=accepted` were accepted and, when
    /// `offered > accepted`, depth `accepted + 1` was offered and refused.
    /// Deeper depths tell nothing (they were conditional on a refused one).
    /// `offered` is the depth the tree reached *below the accepted path*:
    /// [`AcceptanceStats::observe_feedback`] derives it from a verify step.
    pub fn observe(&mut self, offered: usize, accepted: usize) {
        let accepted = accepted.min(offered);
        let seen = if offered > accepted {
            accepted + 1
        } else {
            accepted
        };
        if self.counts.len() < seen {
            self.counts.resize(seen, (0.0, 0.0));
        }
        for (d, c) in self.counts[..seen].iter_mut().enumerate() {
            c.0 *= self.decay;
            c.1 *= self.decay;
            if d < accepted {
                c.0 += 1.0;
            } else {
                c.1 += 1.0;
            }
        }
    }

    /// Records a verify step from its feedback. The depth after the accepted
    /// path counts as refused only when the last accepted node had children
    /// (a leaf offered nothing deeper).
    pub fn observe_feedback(&mut self, feedback: &Feedback<'_>) {
        let (offered, accepted) = offered_and_accepted(feedback.tree, feedback.path);
        self.observe(offered, accepted);
    }

    /// The estimated conditional acceptance rate at `depth` (≥ 1).
    pub fn rate(&self, depth: usize) -> f64 {
        let mut mean = self.prior;
        for &(acc, rej) in self.counts.iter().take(depth.max(1)) {
            mean = (acc + mean * self.strength) / (acc + rej + self.strength);
        }
        mean
    }

    /// Rates for depths `1..=max_depth`, computed in one pass.
    pub fn rates(&self, max_depth: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(max_depth);
        let mut mean = self.prior;
        for d in 0..max_depth {
            if let Some(&(acc, rej)) = self.counts.get(d) {
                mean = (acc + mean * self.strength) / (acc + rej + self.strength);
            }
            out.push(mean);
        }
        out
    }
}

/// (offered, accepted) depths of a verify step: `path` is the accepted
/// root-to-node path; the next depth was offered when its last node has
/// children.
pub fn offered_and_accepted(tree: &TokenTree, path: &[usize]) -> (usize, usize) {
    let accepted = path.len().saturating_sub(1);
    let last = path.last().copied().unwrap_or(0);
    let has_children = last < tree.len() && !tree.children(last).is_empty();
    (accepted + usize::from(has_children), accepted)
}
