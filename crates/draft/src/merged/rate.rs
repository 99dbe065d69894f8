//! Per-token acceptance rates of chain-proposing drafters (prompt lookup,
//! predicted outputs), learned from what survived of their last proposal.

use specmesh_tree::TokenTree;

/// A per-token acceptance rate: decayed counts plus a prior, so it starts
/// sensible and follows drift (about the last `1 / (1 - decay)`
/// observations weigh in).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rate {
    hits: f32,
    trials: f32,
    decay: f32,
}

impl Rate {
    /// A prior of `mean` worth `weight` observations.
    pub(crate) fn new(mean: f32, weight: f32, decay: f32) -> Rate {
        Rate {
            hits: mean * weight,
            trials: weight,
            decay,
        }
    }

    pub(crate) fn mean(&self) -> f32 {
        self.hits / self.trials
    }

    /// One proposal of which `accepted` of `offered` tokens were taken:
    /// the tokens up to and including the first rejection are the trials.
    pub(crate) fn observe(&mut self, accepted: usize, offered: usize) {
        self.hits = self.hits * self.decay + accepted as f32;
        self.trials = self.trials * self.decay + (accepted + 1).min(offered) as f32;
    }
}

/// How much of `chain` (tokens below the root) the verified `tree` held,
/// walked by token so it works under a merge, and how much of that the
/// target committed: `(accepted, offered)`.
pub(crate) fn survived(tree: &TokenTree, chain: &[u32], committed: &[u32]) -> (usize, usize) {
    let mut node = 0;
    let mut offered = 0;
    for &t in chain {
        match tree.child_with(node, t) {
            Some(c) => node = c,
            None => break,
        }
        offered += 1;
    }
    let accepted = chain[..offered]
        .iter()
        .zip(committed)
        .take_while(|(a, b)| a == b)
        .count();
    (accepted, offered)
}
