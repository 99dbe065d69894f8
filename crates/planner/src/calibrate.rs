//! Calibrating drafter scores against what the target accepted.
//!
//! A drafter scores each node with its estimate that the target accepts
//! the path to it. Drafters are optimistic or pessimistic in their own
//! ways (a lookup chain's `rate^depth`, a suffix tree's frequencies), so
//! the planner does not take the scores as probabilities: it bins them
//! (ten bins of width 0.1) and learns, per bin, how often a verified node
//! with such a score was on the accepted path.
//!
//! Two tables feed an estimate: the session's own, and one shared by the
//! verifier's sessions of the same kind of drafting (`auto`, `model-free`,
//! …), which is the session's prior. The shared table's prior is the score
//! itself (the bin's middle). Counts decay at every step, so the tables
//! follow a session that turns predictable or stops being so:
//!
//! ```text
//!   shared(b)  = (hits_g(b) + K_g · mid(b)) / (seen_g(b) + K_g)
//!   session(b) = (hits_s(b) + K_s · shared(b)) / (seen_s(b) + K_s)
//! ```
//!
//! Estimates are then made non-increasing along every path (a path cannot
//! be likelier than its prefix), which the planner's greedy allocation
//! relies on.

use specmesh_tree::TokenTree;

use crate::unit;

/// Score bins.
pub const BINS: usize = 10;

/// How many observations a shared bin's prior (the score itself) is worth.
const SHARED_PRIOR: f64 = 8.0;
/// How many observations a session bin's prior (the shared bin) is worth.
const SESSION_PRIOR: f64 = 4.0;
/// Forgetting per step: a session's table half-forgets in ~35 steps, the
/// shared one in ~350.
const SESSION_DECAY: f64 = 0.98;
const SHARED_DECAY: f64 = 0.998;

/// Decayed hit and seen counts per score bin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreTable {
    hits: [f64; BINS],
    seen: [f64; BINS],
}

impl Default for ScoreTable {
    fn default() -> ScoreTable {
        ScoreTable {
            hits: [0.0; BINS],
            seen: [0.0; BINS],
        }
    }
}

impl ScoreTable {
    fn decay(&mut self, by: f64) {
        for (h, s) in self.hits.iter_mut().zip(self.seen.iter_mut()) {
            *h *= by;
            *s *= by;
        }
    }

    fn add(&mut self, bin: usize, hit: bool) {
        self.seen[bin] += 1.0;
        if hit {
            self.hits[bin] += 1.0;
        }
    }

    /// Observations in a bin (decayed).
    pub fn seen(&self, bin: usize) -> f64 {
        self.seen[bin]
    }

    fn rate(&self, bin: usize, prior: f64, weight: f64) -> f64 {
        (self.hits[bin] + weight * prior) / (self.seen[bin] + weight)
    }
}

/// The bin of a score (NaN and out-of-range scores are clamped first).
pub fn bin(score: f32) -> usize {
    let s = unit(f64::from(score));
    ((s * BINS as f64) as usize).min(BINS - 1)
}

fn mid(bin: usize) -> f64 {
    (bin as f64 + 0.5) / BINS as f64
}

/// A session's calibration, with a reference to the shared table it
/// learns into as well.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Calibration {
    session: ScoreTable,
}

impl Calibration {
    /// The calibrated estimate for a raw `score`.
    pub fn estimate(&self, shared: &ScoreTable, score: f32) -> f64 {
        let b = bin(score);
        let prior = shared.rate(b, mid(b), SHARED_PRIOR);
        unit(self.session.rate(b, prior, SESSION_PRIOR))
    }

    /// Estimates for every node of `tree` into `out` (index 0, the root,
    /// is 1: always committed), non-increasing along every path.
    pub fn estimates(&self, shared: &ScoreTable, tree: &TokenTree, out: &mut Vec<f64>) {
        out.clear();
        out.push(1.0);
        for i in 1..tree.len() {
            let parent = tree.parent(i).unwrap_or(0);
            let e = self.estimate(shared, tree.score(i)).min(out[parent]);
            out.push(e);
        }
    }

    /// The target verified `tree` and accepted `path` (node indices, root
    /// first): every verified node is an observation, a hit when on the
    /// path. Nodes of a tree with nothing drafted teach nothing.
    pub fn observe(&mut self, shared: &mut ScoreTable, tree: &TokenTree, path: &[usize]) {
        if tree.len() <= 1 {
            return;
        }
        self.session.decay(SESSION_DECAY);
        shared.decay(SHARED_DECAY);
        for i in 1..tree.len() {
            let b = bin(tree.score(i));
            let hit = path.contains(&i);
            self.session.add(b, hit);
            shared.add(b, hit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specmesh_tree::{TreeBuilder, TreeLimits};

    fn chain(scores: &[f32]) -> TokenTree {
        let mut b = TreeBuilder::new(1, TreeLimits::new(16, 16, 100)).unwrap();
        for (i, &s) in scores.iter().enumerate() {
            b.push(i, 10 + i as u32, s).unwrap();
        }
        b.build()
    }

    #[test]
    fn untrained_estimates_are_the_scores_bins() {
        let c = Calibration::default();
        let shared = ScoreTable::default();
        assert!((c.estimate(&shared, 0.93) - 0.95).abs() < 1e-12);
        assert!((c.estimate(&shared, 0.0) - 0.05).abs() < 1e-12);
        assert_eq!(bin(f32::NAN), 0);
        assert_eq!(bin(-3.0), 0);
        assert_eq!(bin(7.0), BINS - 1);
        assert_eq!(bin(1.0), BINS - 1);
    }

    /// `steps` verifications of `tree`, step `i` accepting `path(i)`.
    fn teach(
        c: &mut Calibration,
        shared: &mut ScoreTable,
        tree: &TokenTree,
        steps: usize,
        path: impl Fn(usize) -> Vec<usize>,
    ) {
        for i in 0..steps {
            c.observe(shared, tree, &path(i));
        }
    }

    #[test]
    fn an_optimistic_drafter_is_corrected() {
        // The drafter says 0.95 for every node; the target accepts the
        // first node one time in five and never the second.
        let tree = chain(&[0.95, 0.95]);
        let mut c = Calibration::default();
        let mut shared = ScoreTable::default();
        teach(&mut c, &mut shared, &tree, 200, |i| {
            if i % 5 == 0 { vec![0, 1] } else { vec![0] }
        });
        let e = c.estimate(&shared, 0.95);
        assert!(e < 0.2, "{e}");
        // A new session of the same kind starts from the shared table.
        let fresh = Calibration::default();
        assert!(fresh.estimate(&shared, 0.95) < 0.25);
        // Another bin is untouched.
        assert!((c.estimate(&shared, 0.45) - 0.45).abs() < 1e-12);
    }

    #[test]
    fn a_session_whose_acceptance_decays_is_followed_within_tens_of_steps() {
        // Accepted at first, then, deep into its context, never: the
        // session's own table follows within 60 steps while the shared
        // one, which other sessions teach too, still remembers the start.
        let tree = chain(&[0.75, 0.75]);
        let mut c = Calibration::default();
        let mut shared = ScoreTable::default();
        teach(&mut c, &mut shared, &tree, 100, |_| vec![0, 1, 2]);
        assert!(c.estimate(&shared, 0.75) > 0.9);
        teach(&mut c, &mut shared, &tree, 60, |_| vec![0]);
        let fresh = Calibration::default();
        assert!(fresh.estimate(&shared, 0.75) > 0.5);
        let e = c.estimate(&shared, 0.75);
        assert!(e < 0.3, "{e}");
    }

    #[test]
    fn estimates_never_grow_along_a_path() {
        let tree = chain(&[0.3, 0.3, 0.3]);
        let mut c = Calibration::default();
        let mut shared = ScoreTable::default();
        // Train bin 3 high but make the session's bin 3 look low first:
        // the child estimate is capped by its parent's.
        for _ in 0..50 {
            c.observe(&mut shared, &tree, &[0, 1, 2, 3]);
        }
        let mut out = Vec::new();
        c.estimates(&shared, &tree, &mut out);
        assert_eq!(out[0], 1.0);
        assert!(out.windows(2).all(|w| w[1] <= w[0]), "{out:?}");
        assert!(out[1] > 0.8);
    }

    #[test]
    fn a_root_only_tree_teaches_nothing() {
        let tree = chain(&[]);
        let mut c = Calibration::default();
        let mut shared = ScoreTable::default();
        c.observe(&mut shared, &tree, &[0]);
        assert_eq!(c, Calibration::default());
        assert_eq!(shared, ScoreTable::default());
    }
}
