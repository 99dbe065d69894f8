//! What an applied outcome tells the stream's end-of-session tallies.

use specmesh_draft::TokenTree;

/// What one applied outcome reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reported {
    /// Verify steps reported: more than 1 for a span of root-only steps.
    pub steps: u64,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
    /// The step verified a tree of this drafter's with at least one node.
    pub speculative: bool,
    /// A speculative step that accepted its tree's most likely full path
    /// ([`best_path`]) entirely.
    pub best_path_hit: bool,
    /// Microseconds the verifier waited for the trees of the steps
    /// reported.
    pub tree_wait_us: u64,
}

impl Reported {
    /// The report of `steps` steps that verified the root alone.
    pub fn plain(steps: u64) -> Reported {
        Reported {
            steps,
            ..Reported::default()
        }
    }

    /// The report of one step that verified `tree` and accepted `path`
    /// (empty when the verifier did not verify this tree).
    pub fn verified(tree: &TokenTree, path: &[usize]) -> Reported {
        let speculative = tree.len() > 1 && !path.is_empty();
        Reported {
            steps: 1,
            accepted: path.len().saturating_sub(1),
            speculative,
            best_path_hit: speculative && path == best_path(tree),
            tree_wait_us: 0,
        }
    }
}

/// The tree's single most likely full path, root first: from the root, the
/// child with the highest score (the first of equals), down to a leaf. How
/// often the target accepts it all tells whether drafting the next tree
/// ahead, for that outcome, could pay.
pub fn best_path(tree: &TokenTree) -> Vec<usize> {
    let mut path = vec![0];
    let mut node = 0;
    loop {
        let mut best: Option<usize> = None;
        for &c in tree.children(node) {
            let c = c as usize;
            if best.is_none_or(|b| tree.score(c) > tree.score(b)) {
                best = Some(c);
            }
        }
        let Some(next) = best else {
            return path;
        };
        path.push(next);
        node = next;
    }
}

#[cfg(test)]
mod tests {
    use specmesh_draft::TreeLimits;
    use specmesh_tree::TreeBuilder;

    use super::*;

    /// root ─┬─ a (0.4) ── c (0.3)
    ///       ├─ b (0.6) ─┬─ d (0.2)
    ///       │           └─ e (0.5)
    ///       └─ f (0.6)
    fn tree() -> TokenTree {
        let mut t = TreeBuilder::new(1, TreeLimits::new(8, 4, 100)).unwrap();
        let a = t.push(0, 2, 0.4).unwrap();
        let b = t.push(0, 3, 0.6).unwrap();
        t.push(a, 4, 0.3).unwrap();
        t.push(b, 5, 0.2).unwrap();
        t.push(b, 6, 0.5).unwrap();
        t.push(0, 7, 0.6).unwrap();
        t.build()
    }

    #[test]
    fn the_best_path_follows_the_highest_score_down_to_a_leaf() {
        let t = tree();
        let path = best_path(&t);
        let tokens: Vec<u32> = path.iter().map(|&n| t.token(n)).collect();
        assert_eq!(tokens, [1, 3, 6], "b over a, the first of b and f, then e");
        let root_only = TokenTree::root_only(1, TreeLimits::new(1, 0, 100)).unwrap();
        assert_eq!(best_path(&root_only), [0]);
    }

    #[test]
    fn a_hit_is_the_whole_best_path() {
        let t = tree();
        let best = best_path(&t);
        let hit = Reported::verified(&t, &best);
        assert!(hit.speculative && hit.best_path_hit);
        assert_eq!((hit.steps, hit.accepted), (1, 2));
        let part = Reported::verified(&t, &best[..2]);
        assert!(part.speculative && !part.best_path_hit);
        let unverified = Reported::verified(&t, &[]);
        assert!(!unverified.speculative && !unverified.best_path_hit);
        let root_only = TokenTree::root_only(1, TreeLimits::new(1, 0, 100)).unwrap();
        assert_eq!(Reported::verified(&root_only, &[0]), Reported::plain(1));
    }
}
