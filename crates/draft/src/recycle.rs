//! Token recycling (Luo et al. 2024, "Turning Trash into Treasure:
//! Accelerating Inference of Large Language Models with Token Recycling",
//! arXiv 2408.08696).
//!
//! Every verify step computes the target's distribution after each accepted
//! token and then throws most of it away. Token recycling keeps, for every
//! token, the target's top-k candidates that last followed it (an adjacency
//! table), and drafts by walking that table from the root: the target's own
//! recent preferences, at no model cost. It needs no repetition in the text,
//! which makes it the complement of lookup and suffix drafting.
//!
//! # Table
//!
//! Rows are stored sparsely: a session touches a few thousand distinct
//! tokens, so a dense `vocab × k` table (1.6 MB at 50k × 8 with u32 tokens,
//! twice that with log-probabilities, per session) would be mostly empty. A
//! row is `k` (token, log-probability) slots in one flat arena, found
//! through a token → row map, allocated on first sight of the token. A row
//! is replaced wholesale by each new observation, as in the paper: the
//! latest context is the best predictor of the next.
//!
//! # Tree
//!
//! Like the paper's static tree, the shape is fixed: at most `shape[d]`
//! children per node at depth `d` (wide near the root, narrowing below, and
//! nothing beyond the shape). Within it the step's node budget is filled
//! best-first by score, the product along the path of the target's recorded
//! probabilities (`exp(log-prob)`), so trimming the shape to a small budget
//! keeps its most probable part.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use specmesh_tree::{TokenTree, TreeBuilder};

use crate::merged::candidates::unit;
use crate::merged::hashing::FastMap;
use crate::merged::{checked_root, fallback};
use crate::{DraftContext, Drafter, Feedback};

/// Marks an empty slot of a row (a real token never reaches it: it is
/// refused on the way in).
const EMPTY: u32 = u32::MAX;
/// Most successors kept per token.
pub const MAX_K: usize = 64;

/// Tuning of [`TokenRecycler`]; out-of-range values are clamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecycleConfig {
    /// Successors kept per token (1..=[`MAX_K`]).
    pub k: usize,
    /// Children per node at each depth; the tree is no deeper than this is
    /// long. Entries above `k` act as `k`.
    pub shape: Vec<usize>,
}

impl Default for RecycleConfig {
    /// k = 8 as in the paper, and a static tree of its flavour: 8 ways at
    /// depth 1 narrowing to a chain, 8 deep.
    fn default() -> RecycleConfig {
        RecycleConfig {
            k: 8,
            shape: vec![8, 4, 3, 2, 2, 1, 1, 1],
        }
    }
}

/// Best-first frontier: (score bits, Reverse(depth), Reverse(sequence),
/// parent node in the builder, token).
type Heap = BinaryHeap<(u32, Reverse<u32>, Reverse<u32>, u32, u32)>;

/// The token recycling drafter; see the module docs.
#[derive(Debug)]
pub struct TokenRecycler {
    k: usize,
    shape: Vec<usize>,
    rows: FastMap<u32, u32>,
    /// Row `r` is `succ[r * k..(r + 1) * k]`, most likely first.
    succ: Vec<u32>,
    logp: Vec<f32>,
    heap: Heap,
}

impl Default for TokenRecycler {
    fn default() -> TokenRecycler {
        TokenRecycler::new(RecycleConfig::default())
    }
}

impl TokenRecycler {
    pub fn new(cfg: RecycleConfig) -> TokenRecycler {
        let k = cfg.k.clamp(1, MAX_K);
        TokenRecycler {
            k,
            shape: cfg.shape.iter().map(|&w| w.min(k)).collect(),
            rows: FastMap::default(),
            succ: Vec::new(),
            logp: Vec::new(),
            heap: Heap::new(),
        }
    }

    /// Tokens with a row.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The recorded successors of `token`, most likely first, as
    /// (token, log-probability).
    pub fn successors(&self, token: u32) -> impl Iterator<Item = (u32, f32)> + '_ {
        let range = self.row(token).unwrap_or(0..0);
        self.succ[range.clone()]
            .iter()
            .zip(&self.logp[range])
            .take_while(|(t, _)| **t != EMPTY)
            .map(|(&t, &lp)| (t, lp))
    }

    fn row(&self, token: u32) -> Option<std::ops::Range<usize>> {
        let r = *self.rows.get(&token)? as usize;
        Some(r * self.k..(r + 1) * self.k)
    }

    /// Replaces `token`'s successors with the first `k` distinct entries of
    /// `top` (a most-likely-first list).
    pub fn record(&mut self, token: u32, top: &[(u32, f32)]) {
        let k = self.k;
        let range = match self.row(token) {
            Some(r) => r,
            None => {
                let Ok(r) = u32::try_from(self.rows.len()) else {
                    return;
                };
                self.rows.insert(token, r);
                self.succ.resize(self.succ.len() + k, EMPTY);
                self.logp.resize(self.logp.len() + k, f32::NEG_INFINITY);
                let r = r as usize;
                r * k..(r + 1) * k
            }
        };
        let (succ, logp) = (&mut self.succ[range.clone()], &mut self.logp[range]);
        let mut n = 0;
        for &(t, lp) in top {
            if n == k {
                break;
            }
            if t == EMPTY || succ[..n].contains(&t) {
                continue;
            }
            succ[n] = t;
            logp[n] = if lp.is_nan() { f32::NEG_INFINITY } else { lp };
            n += 1;
        }
        succ[n..].fill(EMPTY);
        logp[n..].fill(f32::NEG_INFINITY);
    }

    /// Queues `token`'s successors as children of builder node `parent`
    /// (at depth `depth`), at most the shape's width there.
    fn push_children(
        &mut self,
        parent: usize,
        token: u32,
        depth: usize,
        score: f32,
        vocab: u32,
        seq: &mut u32,
    ) {
        let Some(&width) = self.shape.get(depth) else {
            return;
        };
        let Some(range) = self.row(token) else { return };
        let row = self.succ[range.clone()].iter().zip(&self.logp[range]);
        for (rank, (&t, &lp)) in row.take(width).enumerate() {
            if t == EMPTY {
                break;
            }
            if t >= vocab {
                continue;
            }
            let p = if lp.is_finite() {
                lp.exp()
            } else {
                // No usable log-probability: fall back on the rank.
                1.0 / (rank as f32 + 2.0)
            };
            let s = unit(score * p);
            self.heap.push((
                s.to_bits(),
                Reverse(depth as u32 + 1),
                Reverse(*seq),
                parent as u32,
                t,
            ));
            *seq = seq.wrapping_add(1);
        }
    }
}

impl Drafter for TokenRecycler {
    fn name(&self) -> &'static str {
        "recycle"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let Some(root) = checked_root(ctx) else {
            return fallback(ctx);
        };
        let limits = ctx.limits;
        let Ok(mut b) = TreeBuilder::new(root, limits) else {
            return TokenTree::placeholder(Some(root), limits);
        };
        self.heap.clear();
        let mut seq = 0;
        self.push_children(0, root, 0, 1.0, limits.vocab, &mut seq);
        while !b.is_full() {
            let Some((bits, Reverse(depth), _, parent, token)) = self.heap.pop() else {
                break;
            };
            let depth = depth as usize;
            if depth > limits.max_depth {
                continue;
            }
            let score = f32::from_bits(bits);
            let before = b.len();
            let Ok(node) = b.push(parent as usize, token, score) else {
                continue;
            };
            // A reused sibling was expanded already.
            if b.len() > before {
                self.push_children(node, token, depth, score, limits.vocab, &mut seq);
            }
        }
        b.build()
    }

    /// Records the target's top-k after every accepted node: entry `j` of
    /// `top_k` follows the token of `path[j]` (looked up in the verified
    /// tree by index, which is all `path` means — see the
    /// [feedback contract](crate::merged#feedback-contract)).
    fn observe(&mut self, feedback: &Feedback<'_>) {
        for (&node, top) in feedback.path.iter().zip(feedback.top_k) {
            if node < feedback.tree.len() {
                self.record(feedback.tree.token(node), top);
            }
        }
    }
}

#[cfg(test)]
mod tests;
