//! A reusable scratch trie of candidate continuations, emitted best-first.
//!
//! A drafter often has several candidate continuations for one step (the
//! matches of several n-gram lengths, the session's and the global suffix
//! index). They share prefixes, and the node budget should go to the most
//! likely nodes whatever their source. [`Candidates`] collects them as a
//! trie (duplicate siblings collapse, keeping the higher score) and then
//! fills the budget best-first from the root, the same rule as
//! [`specmesh_tree::merge`]. Unlike `merge` it keeps its buffers between
//! calls, so a drafter's steady state allocates only the output tree.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use specmesh_tree::{TokenTree, TreeBuilder, TreeLimits};

const NIL: u32 = u32::MAX;

/// Candidates beyond this multiple of the node budget are refused: the
/// best-first cut would drop them anyway, and it bounds the work of a step.
const CAP_FACTOR: usize = 16;

#[derive(Clone, Copy, Debug)]
struct Cand {
    token: u32,
    parent: u32,
    depth: u32,
    score: f32,
    first_child: u32,
    next_sibling: u32,
}

/// See the module docs. Node 0 is the root.
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    limits: Option<TreeLimits>,
    nodes: Vec<Cand>,
    heap: BinaryHeap<(u32, Reverse<u32>, Reverse<u32>)>,
    out: Vec<u32>,
}

/// Maps a score into `[0, 1]`, NaN and negative zero to 0, so that its bit
/// pattern orders like its value.
#[inline]
pub(crate) fn unit(score: f32) -> f32 {
    if score > 0.0 { score.min(1.0) } else { 0.0 }
}

impl Candidates {
    pub(crate) fn new() -> Candidates {
        Candidates::default()
    }

    /// Starts a new step: the root alone. `root` must be below
    /// `limits.vocab` (see [`super::checked_root`]).
    pub(crate) fn reset(&mut self, root: u32, limits: TreeLimits) {
        self.limits = Some(limits);
        self.nodes.clear();
        self.nodes.push(Cand {
            token: root,
            parent: 0,
            depth: 0,
            score: 1.0,
            first_child: NIL,
            next_sibling: NIL,
        });
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Adds `token` under `parent` with `score` (clamped to the parent's)
    /// and returns its node. An existing sibling with the same token is
    /// reused and keeps the higher score. Returns `None` when the node could
    /// never be in the tree (too deep, token outside the vocabulary) or the
    /// candidate cap is reached; the caller should stop extending that path.
    pub(crate) fn insert(&mut self, parent: usize, token: u32, score: f32) -> Option<usize> {
        let limits = self.limits?;
        let p = *self.nodes.get(parent)?;
        if token >= limits.vocab || p.depth as usize >= limits.max_depth {
            return None;
        }
        let score = unit(score).min(p.score);
        let mut c = p.first_child;
        while c != NIL {
            let node = &mut self.nodes[c as usize];
            if node.token == token {
                node.score = node.score.max(score);
                return Some(c as usize);
            }
            c = node.next_sibling;
        }
        let cap = limits.max_nodes.saturating_mul(CAP_FACTOR).max(64);
        let index = self.nodes.len();
        if index >= cap || index >= NIL as usize {
            return None;
        }
        self.nodes.push(Cand {
            token,
            parent: parent as u32,
            depth: p.depth + 1,
            score,
            first_child: NIL,
            next_sibling: p.first_child,
        });
        self.nodes[parent].first_child = index as u32;
        Some(index)
    }

    fn push_children(&mut self, node: usize) {
        let mut c = self.nodes[node].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            self.heap
                .push((n.score.to_bits(), Reverse(n.depth), Reverse(c)));
            c = n.next_sibling;
        }
    }

    /// The tree of the best candidates under the limits given to
    /// [`reset`](Self::reset): best-first by score, shallower then earlier
    /// nodes winning ties, always ancestor-closed.
    pub(crate) fn build(&mut self) -> TokenTree {
        let (Some(limits), Some(root)) = (self.limits, self.nodes.first().map(|n| n.token)) else {
            return TokenTree::placeholder(None, TreeLimits::new(1, 0, 1));
        };
        let Ok(mut b) = TreeBuilder::new(root, limits) else {
            return TokenTree::placeholder(Some(root), limits);
        };
        self.out.clear();
        self.out.resize(self.nodes.len(), NIL);
        self.out[0] = 0;
        self.heap.clear();
        self.push_children(0);
        while !b.is_full() {
            let Some((_, _, Reverse(c))) = self.heap.pop() else {
                break;
            };
            let n = self.nodes[c as usize];
            let parent = self.out[n.parent as usize];
            if parent == NIL {
                continue;
            }
            if let Ok(i) = b.push(parent as usize, n.token, n.score) {
                self.out[c as usize] = i as u32;
                self.push_children(c as usize);
            }
        }
        b.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(nodes: usize, depth: usize) -> TreeLimits {
        TreeLimits::new(nodes, depth, 100)
    }

    #[test]
    fn duplicates_collapse_and_keep_the_higher_score() {
        let mut c = Candidates::new();
        c.reset(1, limits(10, 4));
        let a = c.insert(0, 2, 0.3).unwrap();
        let b = c.insert(0, 2, 0.6).unwrap();
        assert_eq!(a, b);
        assert_eq!(c.len(), 2);
        let t = c.build();
        assert_eq!(t.tokens(), &[1, 2]);
        assert_eq!(t.score(1), 0.6);
    }

    #[test]
    fn budget_goes_to_the_best_nodes_and_stays_ancestor_closed() {
        let mut c = Candidates::new();
        c.reset(0, limits(4, 8));
        // A long weak chain and a strong short branch.
        let mut p = 0;
        for t in 10..16 {
            p = c.insert(p, t, 0.2).unwrap();
        }
        let s = c.insert(0, 20, 0.9).unwrap();
        c.insert(s, 21, 0.8).unwrap();
        let t = c.build();
        assert_eq!(t.len(), 4);
        assert_eq!(t.path_tokens(2), vec![0, 20, 21]);
        assert_eq!(t.token(3), 10);
    }

    #[test]
    fn refuses_out_of_vocab_too_deep_and_bad_parents() {
        let mut c = Candidates::new();
        c.reset(0, limits(10, 1));
        assert!(c.insert(0, 100, 0.5).is_none());
        let a = c.insert(0, 5, f32::NAN).unwrap();
        assert!(c.insert(a, 6, 0.5).is_none());
        assert!(c.insert(99, 6, 0.5).is_none());
        let t = c.build();
        assert_eq!(t.score(1), 0.0);
    }

    #[test]
    fn unreset_build_is_a_placeholder() {
        let t = Candidates::new().build();
        assert_eq!(t.len(), 1);
    }
}
