//! Merging the trees of several drafters into one under a node budget.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::{TokenTree, TreeBuilder, TreeError, TreeLimits};

/// Merges trees with the same root into one that fits `limits`.
///
/// Shared prefixes collapse into one path; a node proposed by several
/// drafters keeps the highest score. The budget is then filled best-first
/// by score (shallower, then earlier nodes win ties), starting from the
/// root's children, so the result is always ancestor-closed: a node is never
/// kept without its parent.
///
/// Draft distributions survive only when a single tree is merged and
/// nothing of it is cut. Rejection sampling with q is lossless only averaged
/// over the draws of the candidates; a cut decided by scores depends on
/// which tokens were drawn, so keeping q after one would bias the output
/// (e.g. q = {a: .5, b: .5}, p = {a: .3, b: .7}, room for one child that
/// scores higher as `a`: the output becomes a .45 / b .55). A candidate set
/// mixed from several drafters was not sampled from any one q either.
/// Without q, verification uses the probability-free rule, which is
/// lossless for any candidates. So a drafter that attaches q must stay
/// within the limits it is given.
pub fn merge(trees: &[&TokenTree], limits: TreeLimits) -> Result<TokenTree, TreeError> {
    let first = trees.first().ok_or(TreeError::NothingToMerge)?;
    let root = first.root_token();
    if let Some(t) = trees.iter().find(|t| t.root_token() != root) {
        return Err(TreeError::RootMismatch {
            first: root,
            other: t.root_token(),
        });
    }

    // The union as a trie; union indices are topological because every
    // source tree is.
    let mut union = Union::new(root);
    let mut maps: Vec<Vec<usize>> = Vec::with_capacity(trees.len());
    for t in trees {
        let mut map = vec![0usize; t.len()];
        for i in 1..t.len() {
            let p = map[t.parent(i).unwrap_or(0)];
            map[i] = union.insert(p, t.token(i), t.score(i), t.depth(i));
        }
        maps.push(map);
    }

    let keep = union.best_first(limits);

    let mut b = TreeBuilder::new(root, limits)?;
    let mut out = vec![usize::MAX; union.len()];
    out[0] = 0;
    for u in 1..union.len() {
        if keep[u] {
            let p = out[union.parent[u]];
            out[u] = b.push(p, union.token[u], union.score[u])?;
        }
    }

    if let [t] = trees
        && keep.iter().all(|&k| k)
    {
        for i in 0..t.len() {
            if let Some(dist) = t.draft_dist(i) {
                b.set_draft_dist(out[maps[0][i]], dist.entries().to_vec())?;
            }
        }
    }
    Ok(b.build())
}

struct Union {
    token: Vec<u32>,
    parent: Vec<usize>,
    score: Vec<f32>,
    depth: Vec<usize>,
    kids: Vec<Vec<usize>>,
}

impl Union {
    fn new(root: u32) -> Union {
        Union {
            token: vec![root],
            parent: vec![0],
            score: vec![1.0],
            depth: vec![0],
            kids: vec![Vec::new()],
        }
    }

    fn len(&self) -> usize {
        self.token.len()
    }

    fn insert(&mut self, parent: usize, token: u32, score: f32, depth: usize) -> usize {
        if let Some(&c) = self.kids[parent].iter().find(|&&c| self.token[c] == token) {
            self.score[c] = self.score[c].max(score);
            return c;
        }
        let i = self.token.len();
        self.token.push(token);
        self.parent.push(parent);
        self.score.push(score);
        self.depth.push(depth);
        self.kids.push(Vec::new());
        self.kids[parent].push(i);
        i
    }

    /// Which union nodes fill the budget, chosen best-first from the root.
    fn best_first(&self, limits: TreeLimits) -> Vec<bool> {
        let mut keep = vec![false; self.len()];
        keep[0] = true;
        let mut kept = 1;
        // Scores are in [0, 1], where the IEEE bit pattern orders like the
        // value.
        let key = |u: usize| (self.score[u].to_bits(), Reverse(self.depth[u]), Reverse(u));
        let mut heap: BinaryHeap<_> = self.kids[0].iter().map(|&c| key(c)).collect();
        while kept < limits.max_nodes {
            let Some((_, _, Reverse(u))) = heap.pop() else {
                break;
            };
            if self.depth[u] > limits.max_depth {
                continue;
            }
            keep[u] = true;
            kept += 1;
            heap.extend(self.kids[u].iter().map(|&c| key(c)));
        }
        keep
    }
}
