//! Re-rooting: the part of a tree below one node, as a tree of its own.
//!
//! A drafter that drafts ahead grows one tree past the path it expects the
//! target to accept; the target's own next token (the bonus) then picks one
//! of that path's children, and the tree under it is the next step's tree.

use crate::{TokenTree, TreeBuilder, TreeError, TreeLimits};

impl TokenTree {
    /// The subtree under `node`, re-rooted: `node` becomes the root, its
    /// descendants keep their order, tokens and draft distributions, and
    /// scores are divided by `node`'s (cumulative probabilities from the
    /// new root). Nodes past `limits` are left out, the deepest and the
    /// last-drafted first: a node is kept only with its parent, and a
    /// node's children keep their draw order, so a kept draft
    /// distribution still describes a prefix of its children's draws.
    pub fn subtree(&self, node: usize, limits: TreeLimits) -> Result<TokenTree, TreeError> {
        if node >= self.len() {
            return Err(TreeError::NoSuchNode {
                index: node,
                len: self.len(),
            });
        }
        let mut b = TreeBuilder::new(self.token(node), limits)?;
        let scale = self.score(node);
        // Old index -> new index, for the kept nodes.
        let mut new_of = vec![None; self.len()];
        new_of[node] = Some(0);
        // Parents precede children, so one pass in index order sees every
        // parent's fate before its children.
        for i in node + 1..self.len() {
            let Some(parent) = self.parent(i).and_then(|p| new_of[p]) else {
                continue;
            };
            if b.is_full() || b.depth(parent) + 1 > limits.max_depth {
                continue;
            }
            let score = if scale > 0.0 {
                (self.score(i) / scale).clamp(0.0, 1.0)
            } else {
                0.0
            };
            new_of[i] = Some(b.push(parent, self.token(i), score)?);
        }
        for (old, new) in new_of.iter().enumerate() {
            let Some(new) = *new else { continue };
            let kept_child = self
                .children(old)
                .iter()
                .any(|&c| new_of[c as usize].is_some());
            if let Some(d) = self.draft_dist(old).filter(|_| kept_child) {
                b.set_draft_dist(new, d.entries().to_vec())?;
            }
        }
        Ok(b.build())
    }
}
