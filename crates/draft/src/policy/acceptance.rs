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
/// an optimistic default waiting at depth 2. Where earlier sessions of the
/// same workload taught a rate per depth ([`AcceptanceStats::set_learned`],
/// see [`super::ledger`]), that rate is the depth's prior instead.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptanceStats {
    prior: f64,
    strength: f64,
    decay: f64,
    /// (accepted, rejected) weights per depth, index 0 = depth 1.
    counts: Vec<(f64, f64)>,
    /// Learned prior rates per depth, index 0 = depth 1; deeper depths
    /// chain as without.
    learned: Vec<f64>,
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
            learned: Vec::new(),
        })
    }

    /// The same prior, strength and decay, with nothing observed or
    /// learned.
    pub fn unobserved(&self) -> AcceptanceStats {
        AcceptanceStats {
            counts: Vec::new(),
            learned: Vec::new(),
            ..*self
        }
    }

    /// Takes `rates` (index 0 = depth 1) as the prior of each depth they
    /// cover, in place of the chained one; the observations are kept.
    /// Rates that are not numbers end the list; others are clamped to
    /// [0, 1].
    pub fn set_learned(&mut self, rates: &[f64]) {
        self.learned = rates
            .iter()
            .take_while(|r| r.is_finite())
            .map(|r| r.clamp(0.0, 1.0))
            .collect();
    }

    /// Adds `other`'s observations to these, after scaling these by
    /// `keep` (in [0, 1]; others: 1): a record of many sessions where each
    /// session's evidence fades as later ones arrive.
    pub fn absorb(&mut self, other: &AcceptanceStats, keep: f64) {
        let keep = if (0.0..=1.0).contains(&keep) {
            keep
        } else {
            1.0
        };
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), (0.0, 0.0));
        }
        for (i, c) in self.counts.iter_mut().enumerate() {
            let (a, r) = other.counts.get(i).copied().unwrap_or((0.0, 0.0));
            *c = (c.0 * keep + a, c.1 * keep + r);
        }
    }

    /// Observation weight at depth 1: how much evidence these counts hold.
    pub fn weight(&self) -> f64 {
        self.counts.first().map_or(0.0, |&(a, r)| a + r)
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
        self.chain().take(depth.max(1)).last().unwrap_or(self.prior)
    }

    /// Rates for depths `1..=max_depth`, computed in one pass.
    pub fn rates(&self, max_depth: usize) -> Vec<f64> {
        self.chain().take(max_depth).collect()
    }

    /// The rate of each depth from 1 on, without end: its posterior over
    /// its prior (the learned rate, else the depth above's rate).
    fn chain(&self) -> impl Iterator<Item = f64> + '_ {
        let mut mean = self.prior;
        (0..).map(move |d| {
            let prior = self.learned.get(d).copied().unwrap_or(mean);
            mean = match self.counts.get(d) {
                Some(&(acc, rej)) => (acc + prior * self.strength) / (acc + rej + self.strength),
                None => prior,
            };
            mean
        })
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
