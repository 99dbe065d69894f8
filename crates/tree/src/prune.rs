//! Pruning: the part of a tree a verifier chose to verify.
//!
//! A verifier that verifies only some of a drafter's nodes (its goodput
//! planner grants each session part of the batch's forward) keeps an
//! ancestor-closed subset of the tree, rooted where it was. The drafter
//! rebuilds the same pruned tree from the list of kept nodes the verifier
//! reports, so both sides read the accepted path against the same nodes.

use crate::{TokenTree, TreeBuilder, TreeError};

impl TokenTree {
    /// The tree of the nodes `keep` marks (indexed like this tree's; the
    /// root is always kept), in this tree's order, with the original index
    /// of every kept node (`kept[new] = old`). A kept node whose parent is
    /// not kept is an error: the subset must be ancestor-closed.
    ///
    /// Draft distributions survive only when nothing is cut: rejection
    /// sampling with q is lossless only over q's own draws, and a cut
    /// decided by scores depends on the draws (see [`crate::merge`]).
    /// Without q the verifier's probability-free rule is lossless for any
    /// candidate set.
    pub fn retain(&self, keep: &[bool]) -> Result<(TokenTree, Vec<usize>), TreeError> {
        if keep.len() != self.len() {
            return Err(TreeError::NoSuchNode {
                index: keep.len(),
                len: self.len(),
            });
        }
        let mut b = TreeBuilder::new(self.root_token(), self.limits())?;
        let mut new_of = vec![usize::MAX; self.len()];
        new_of[0] = 0;
        let mut kept = Vec::with_capacity(self.len());
        kept.push(0);
        for i in 1..self.len() {
            if !keep[i] {
                continue;
            }
            let parent = self.parent(i).unwrap_or(0);
            if new_of[parent] == usize::MAX {
                return Err(TreeError::BadParent { index: i, parent });
            }
            new_of[i] = b.push(new_of[parent], self.token(i), self.score(i))?;
            kept.push(i);
        }
        if kept.len() == self.len() {
            return Ok((self.clone(), kept));
        }
        Ok((b.build(), kept))
    }

    /// [`TokenTree::retain`] of the nodes listed in `nodes` (original
    /// indices, any order; the root need not be listed).
    pub fn retain_listed(&self, nodes: &[u32]) -> Result<(TokenTree, Vec<usize>), TreeError> {
        let mut keep = vec![false; self.len()];
        keep[0] = true;
        for &n in nodes {
            let n = n as usize;
            if n >= self.len() {
                return Err(TreeError::NoSuchNode {
                    index: n,
                    len: self.len(),
                });
            }
            keep[n] = true;
        }
        self.retain(&keep)
    }
}

#[cfg(test)]
mod tests {
    use crate::{TokenTree, TreeBuilder, TreeLimits};

    //   0 ─ 1 ─ 3
    //     └ 2 ─ 4
    fn tree() -> TokenTree {
        let mut b = TreeBuilder::new(7, TreeLimits::new(8, 4, 100)).unwrap();
        b.push(0, 10, 0.9).unwrap();
        b.push(0, 20, 0.5).unwrap();
        b.push(1, 30, 0.8).unwrap();
        b.push(2, 40, 0.2).unwrap();
        b.build()
    }

    #[test]
    fn keeps_an_ancestor_closed_subset_in_order() {
        let t = tree();
        let (p, kept) = t.retain(&[true, true, false, true, false]).unwrap();
        assert_eq!(kept, vec![0, 1, 3]);
        assert_eq!(p.tokens(), &[7, 10, 30]);
        assert_eq!(p.parent(2), Some(1));
        assert_eq!(p.score(2), 0.8);
        assert_eq!(p.root_token(), 7);
    }

    #[test]
    fn refuses_a_node_without_its_parent() {
        let t = tree();
        assert!(t.retain(&[true, false, false, true, false]).is_err());
        assert!(t.retain(&[true, true]).is_err());
        assert!(t.retain_listed(&[9]).is_err());
    }

    #[test]
    fn keeping_everything_or_nothing() {
        let t = tree();
        let (all, kept) = t.retain_listed(&[1, 2, 3, 4]).unwrap();
        assert_eq!(all, t);
        assert_eq!(kept, vec![0, 1, 2, 3, 4]);
        let (root, kept) = t.retain_listed(&[]).unwrap();
        assert_eq!(root.len(), 1);
        assert_eq!(kept, vec![0]);
    }
}
