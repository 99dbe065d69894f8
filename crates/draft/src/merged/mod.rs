//! Combining drafters, and the helpers every drafter of this crate shares.
//!
//! [`Merged`] asks several drafters for a tree each and merges them with
//! [`specmesh_tree::merge`]: shared prefixes collapse, a node proposed twice
//! keeps its best score, and the node budget is filled best-first by score,
//! so the scores of different drafters compete directly. That only works if
//! each drafter's scores estimate the same thing — the probability that the
//! target accepts the path to the node — which is why the drafters here
//! calibrate them (empirical frequencies, observed acceptance rates, the
//! target's own probabilities) instead of using ranks.
//!
//! # Feedback contract
//!
//! [`Merged::observe`] forwards the step's [`Feedback`] unchanged to every
//! sub-drafter. Its `tree` and `path` describe the *merged* tree that was
//! verified, not the tree the sub-drafter proposed: node indices mean
//! nothing to it, some of its nodes may have been cut and other drafters'
//! nodes added. A sub-drafter must therefore only rely on what is
//! independent of the tree's layout: `committed`, `top_k` paired with the
//! *tokens* of `path`, and walking `tree` by token from the root (e.g. to
//! learn how much of its own proposal survived the cut). All drafters in
//! this crate follow that rule.

use std::fmt;

use specmesh_tree::{TokenTree, merge};

use crate::{DraftContext, Drafter, Feedback};
use candidates::Candidates;

pub(crate) mod candidates;
pub(crate) mod hashing;
pub(crate) mod rate;

/// Several drafters proposing together; see the module docs. Trees are
/// merged exactly as [`specmesh_tree::merge`] does (union, best-first by
/// score), in buffers kept between steps; trees carrying draft
/// distributions go through `merge` itself, which knows when those survive.
pub struct Merged {
    drafters: Vec<Box<dyn Drafter>>,
    trees: Vec<TokenTree>,
    cands: Candidates,
    map: Vec<usize>,
}

impl fmt::Debug for Merged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Merged")
            .field("drafters", &self.names().collect::<Vec<_>>())
            .finish()
    }
}

impl Merged {
    /// Merges the trees of `drafters`; with none it proposes the root alone.
    pub fn new(drafters: Vec<Box<dyn Drafter>>) -> Merged {
        Merged {
            drafters,
            trees: Vec::new(),
            cands: Candidates::new(),
            map: Vec::new(),
        }
    }

    pub fn push(&mut self, drafter: Box<dyn Drafter>) {
        self.drafters.push(drafter);
    }

    pub fn len(&self) -> usize {
        self.drafters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.drafters.is_empty()
    }

    /// The sub-drafters' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.drafters.iter().map(|d| d.name())
    }
}

impl Drafter for Merged {
    fn name(&self) -> &'static str {
        "merged"
    }

    /// Every sub-drafter gets the full step budget (each proposes its own
    /// best tree of that size); the merge then keeps the best nodes overall.
    /// A sub-tree that does not fit the step (wrong root, a token outside
    /// the vocabulary) is dropped rather than spoiling the others, and one
    /// that drafted nothing is left out: a lone drafted tree keeps its draft
    /// distributions (a sampled model tree with them is verified by
    /// rejection sampling), which a merge with root-only trees would drop.
    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let Some(root) = checked_root(ctx) else {
            return fallback(ctx);
        };
        let vocab = ctx.limits.vocab;
        self.trees.clear();
        for d in &mut self.drafters {
            let t = d.propose(ctx);
            if t.len() > 1 && t.root_token() == root && t.tokens().iter().all(|&x| x < vocab) {
                self.trees.push(t);
            }
        }
        if self.trees.iter().any(TokenTree::has_draft_dists) {
            // Only `merge` knows when a draft distribution survives.
            let refs: Vec<&TokenTree> = self.trees.iter().collect();
            return merge(&refs, ctx.limits)
                .unwrap_or_else(|_| TokenTree::placeholder(Some(root), ctx.limits));
        }
        // The same union and best-first cut as `merge`, in reused buffers.
        self.cands.reset(root, ctx.limits);
        for t in &self.trees {
            self.map.clear();
            self.map.resize(t.len(), usize::MAX);
            self.map[0] = 0;
            for i in 1..t.len() {
                let parent = t.parent(i).map_or(usize::MAX, |p| self.map[p]);
                if let Some(c) = self.cands.insert(parent, t.token(i), t.score(i)) {
                    self.map[i] = c;
                }
            }
        }
        self.cands.build()
    }

    fn observe(&mut self, feedback: &Feedback<'_>) {
        for d in &mut self.drafters {
            d.observe(feedback);
        }
    }
}

/// The context's root when a tree can be built on it. A context that
/// breaks its contract (empty, or a root outside the vocabulary) gets
/// [`fallback`] instead of a panic; the verifier refuses that tree like any
/// other malformed one.
pub(crate) fn checked_root(ctx: &DraftContext<'_>) -> Option<u32> {
    ctx.tokens.last().copied().filter(|&r| r < ctx.limits.vocab)
}

/// The root-only tree for a context [`checked_root`] refused.
pub(crate) fn fallback(ctx: &DraftContext<'_>) -> TokenTree {
    TokenTree::placeholder(ctx.tokens.last().copied(), ctx.limits)
}

#[cfg(test)]
mod tests;
