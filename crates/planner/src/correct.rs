//! What the calibrated estimates of granted nodes missed by, per depth.
//!
//! The score calibration ([`crate::calibrate`]) learns, per score bin, how
//! often a verified node was on the accepted path, over nodes of every
//! depth and of trees with sibling branches alike: a bin's rate is right on
//! average but not for the nodes the planner grants. Under load the
//! planner grants few nodes per session, the ones whose estimates are
//! highest, and a noisy estimate that came out high is likelier granted
//! (the winner's curse); deep nodes and siblings, of which at most one can
//! be accepted, are overestimated too. Measured on a 2-core AMD EPYC with
//! SmolLM2-135M on code at 16 streams, the planner expected 20% more
//! accepted tokens than the target accepted.
//!
//! So the planner also learns, per depth (1 to [`DEPTHS`], deeper nodes
//! as the deepest), the ratio of the tokens the target accepted among the
//! granted nodes to what their estimates expected, and scales the
//! estimates down by it: what the planner expects of the nodes it grants
//! then matches what it gets. Counts decay, so the ratio follows the load.

use specmesh_tree::TokenTree;

/// Depths corrected apart; deeper nodes share the last.
pub const DEPTHS: usize = 8;

/// How many expected tokens the prior (a ratio of 1) is worth per depth.
const PRIOR: f64 = 3.0;

/// Forgetting per verified tree: ~500 trees of memory.
const DECAY: f64 = 0.998;

/// A ratio below this is not believed (a handful of unlucky steps).
const MIN_FACTOR: f64 = 0.25;
/// Estimates are only ever lowered. Raising them grants more nodes, and
/// the drafting those cost (a draft model's forwards on shared cores) is
/// priced per session, not per node: measured with the 1.5B and a draft
/// model at 4 streams, raised estimates granted 8x the nodes and the pass
/// ran at 0.90x of plain decoding.
const MAX_FACTOR: f64 = 1.0;

/// Decayed expected and accepted tokens of granted nodes, per depth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DepthCorrection {
    expected: [f64; DEPTHS],
    accepted: [f64; DEPTHS],
}

impl Default for DepthCorrection {
    fn default() -> DepthCorrection {
        DepthCorrection {
            expected: [0.0; DEPTHS],
            accepted: [0.0; DEPTHS],
        }
    }
}

fn slot(depth: usize) -> usize {
    depth.clamp(1, DEPTHS) - 1
}

impl DepthCorrection {
    /// The factor estimates of nodes at `depth` are scaled by.
    pub fn factor(&self, depth: usize) -> f64 {
        let d = slot(depth);
        ((self.accepted[d] + PRIOR) / (self.expected[d] + PRIOR)).clamp(MIN_FACTOR, MAX_FACTOR)
    }

    /// Scales `estimates` (one per node of `tree`, as
    /// [`crate::Calibration::estimates`] made them) by their depths'
    /// factors, keeping them probabilities that never grow along a path.
    pub fn apply(&self, tree: &TokenTree, estimates: &mut [f64]) {
        for i in 1..estimates.len().min(tree.len()) {
            let parent = tree.parent(i).unwrap_or(0);
            let scaled = crate::unit(estimates[i] * self.factor(tree.depth(i)));
            estimates[i] = scaled.min(estimates[parent]);
        }
    }

    /// The target verified `tree` (the granted nodes), whose uncorrected
    /// estimates were `estimates`, accepting `path` (root first).
    pub fn observe(&mut self, tree: &TokenTree, estimates: &[f64], path: &[usize]) {
        if tree.len() <= 1 {
            return;
        }
        for (e, a) in self.expected.iter_mut().zip(self.accepted.iter_mut()) {
            *e *= DECAY;
            *a *= DECAY;
        }
        for (i, &e) in estimates.iter().enumerate().take(tree.len()).skip(1) {
            let d = slot(tree.depth(i));
            self.expected[d] += crate::unit(e);
            if path.contains(&i) {
                self.accepted[d] += 1.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specmesh_tree::{TreeBuilder, TreeLimits};

    /// A root with two children (0.6 each): at most one can be accepted.
    fn siblings() -> TokenTree {
        let mut b = TreeBuilder::new(1, TreeLimits::new(8, 8, 100)).unwrap();
        b.push(0, 10, 0.6).unwrap();
        b.push(0, 11, 0.6).unwrap();
        b.build()
    }

    #[test]
    fn overestimated_nodes_are_scaled_to_what_the_target_accepts() {
        let tree = siblings();
        let raw = [1.0, 0.6, 0.6];
        let mut c = DepthCorrection::default();
        assert_eq!(c.factor(1), 1.0);
        // The first child is accepted two steps in three, the second never:
        // 0.67 accepted against 1.2 expected.
        for i in 0..600 {
            let path: &[usize] = if i % 3 == 0 { &[0] } else { &[0, 1] };
            c.observe(&tree, &raw, path);
        }
        let mut e = raw.to_vec();
        c.apply(&tree, &mut e);
        let expected: f64 = e[1..].iter().sum();
        assert!((expected - 2.0 / 3.0).abs() < 0.03, "{e:?}");
        // Other depths keep their estimates.
        assert_eq!(c.factor(2), 1.0);
    }

    #[test]
    fn an_underestimate_is_left_and_estimates_stay_path_probabilities() {
        let mut b = TreeBuilder::new(1, TreeLimits::new(8, 8, 100)).unwrap();
        b.push(0, 10, 0.4).unwrap();
        b.push(1, 11, 0.4).unwrap();
        let chain = b.build();
        let mut c = DepthCorrection::default();
        for _ in 0..600 {
            c.observe(&chain, &[1.0, 0.3, 0.3], &[0, 1]);
        }
        assert_eq!(c.factor(1), 1.0);
        let mut e = vec![1.0, 0.3, 0.3];
        c.apply(&chain, &mut e);
        assert!((e[1] - 0.3).abs() < 1e-9);
        // Depth 2 was never accepted: scaled down, and never above depth 1.
        assert!(e[2] < 0.3 && e[2] <= e[1], "{e:?}");
        // Nothing drafted teaches nothing.
        let root = TreeBuilder::new(1, TreeLimits::new(8, 8, 100))
            .unwrap()
            .build();
        let before = c;
        c.observe(&root, &[1.0], &[0]);
        assert_eq!(c, before);
    }
}
