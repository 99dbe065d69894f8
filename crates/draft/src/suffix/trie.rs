//! A depth-truncated suffix trie with occurrence counts.
//!
//! Every substring of the indexed text of length at most `max_depth` is a
//! path from the root; a node's `count` is how many times its substring
//! occurs and `cont` the sum of its children's counts (how many of those
//! occurrences are followed by a token). `count(child) / cont(parent)` is
//! then the empirical probability of that next token after the substring,
//! which is what SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975)
//! scores its speculation trees with.
//!
//! Truncation keeps the trie at O(text × max_depth) nodes without the
//! bookkeeping of a compressed suffix tree, and makes deletion exact:
//! inserting a sequence increments the paths of all its suffixes truncated
//! to `max_depth`, removing it decrements the same paths and frees nodes
//! whose count reaches zero. This is what lets the global index evict whole
//! documents and the session index slide its window.
//!
//! Nodes live in one arena with a free list; children are a doubly linked
//! sibling list (for enumeration, newest first) plus one map from
//! `(parent, token)` to child (for O(1) lookup at any fan-out).

use super::Expansion;
use crate::merged::candidates::{Candidates, unit};
use crate::merged::hashing::FastMap;

const NIL: u32 = u32::MAX;
const ROOT: u32 = 0;

/// Children examined per node when expanding: bounds the cost at very wide
/// nodes (a common token after a one-token match); the newest are seen
/// first.
const SCAN_CAP: usize = 256;

#[derive(Clone, Copy, Debug)]
struct Node {
    token: u32,
    count: u32,
    cont: u32,
    first: u32,
    next: u32,
    prev: u32,
}

impl Node {
    const EMPTY: Node = Node {
        token: 0,
        count: 0,
        cont: 0,
        first: NIL,
        next: NIL,
        prev: NIL,
    };
}

/// Estimated bytes per live node: the node plus its child-map entry
/// (16-byte slot and control byte at 7/8 load).
pub(crate) const NODE_BYTES: usize = std::mem::size_of::<Node>() + 20;

#[inline]
fn key(parent: u32, token: u32) -> u64 {
    (u64::from(parent) << 32) | u64::from(token)
}

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct SuffixTrie {
    nodes: Vec<Node>,
    kids: FastMap<u64, u32>,
    free: Vec<u32>,
    max_depth: usize,
    /// Scratch: the nodes of one path being removed.
    path: Vec<u32>,
    /// Scratch: nodes left to free.
    stack: Vec<u32>,
}

impl SuffixTrie {
    /// `max_depth` is clamped to at least 2 (a match and one token after it).
    pub(crate) fn new(max_depth: usize) -> SuffixTrie {
        SuffixTrie {
            nodes: vec![Node::EMPTY],
            kids: FastMap::default(),
            free: Vec::new(),
            max_depth: max_depth.max(2),
            path: Vec::new(),
            stack: Vec::new(),
        }
    }

    pub(crate) fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Nodes in use, the root excluded.
    pub(crate) fn live_nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    /// Estimated heap bytes of the live nodes.
    pub(crate) fn bytes(&self) -> usize {
        self.live_nodes() * NODE_BYTES
    }

    #[inline]
    fn child(&self, parent: u32, token: u32) -> Option<u32> {
        self.kids.get(&key(parent, token)).copied()
    }

    /// Counts `w` more occurrences of `parent`'s substring followed by
    /// `token`, creating the child if needed. `None` only when the arena's
    /// u32 ids run out.
    fn bump(&mut self, parent: u32, token: u32, w: u32) -> Option<u32> {
        let c = match self.child(parent, token) {
            Some(c) => c,
            None => {
                let c = match self.free.pop() {
                    Some(c) => c,
                    None if self.nodes.len() < NIL as usize => {
                        self.nodes.push(Node::EMPTY);
                        (self.nodes.len() - 1) as u32
                    }
                    None => return None,
                };
                let first = self.nodes[parent as usize].first;
                self.nodes[c as usize] = Node {
                    token,
                    next: first,
                    ..Node::EMPTY
                };
                if first != NIL {
                    self.nodes[first as usize].prev = c;
                }
                self.nodes[parent as usize].first = c;
                self.kids.insert(key(parent, token), c);
                c
            }
        };
        let n = &mut self.nodes[c as usize];
        n.count = n.count.saturating_add(w);
        let p = &mut self.nodes[parent as usize];
        p.cont = p.cont.saturating_add(w);
        Some(c)
    }

    /// Appends `token` to a text whose suffixes (lengths 1, 2, … below
    /// `max_depth`) end at the nodes `active`; `next` receives the new
    /// suffixes. Both are caller-owned so a session can keep them.
    pub(crate) fn extend(
        &mut self,
        active: &mut Vec<u32>,
        next: &mut Vec<u32>,
        token: u32,
        w: u32,
    ) {
        next.clear();
        if let Some(c) = self.bump(ROOT, token, w) {
            next.push(c);
            for &a in active.iter() {
                // `a` is at depth next.len(), so its child at next.len() + 1.
                if next.len() >= self.max_depth {
                    break;
                }
                match self.bump(a, token, w) {
                    Some(c) => next.push(c),
                    None => break,
                }
            }
        }
        // Only suffixes that can still grow stay active.
        next.truncate(self.max_depth - 1);
        std::mem::swap(active, next);
    }

    /// Adds `w` occurrences of `tokens` (a whole document).
    pub(crate) fn insert(&mut self, tokens: &[u32], w: u32) {
        let (mut active, mut next) = (Vec::new(), Vec::new());
        for &t in tokens {
            self.extend(&mut active, &mut next, t, w);
        }
    }

    /// Removes `w` occurrences of `tokens`, exactly undoing
    /// [`insert`](Self::insert)`(tokens, w)`.
    pub(crate) fn remove(&mut self, tokens: &[u32], w: u32) {
        for s in 0..tokens.len() {
            let end = tokens.len().min(s + self.max_depth);
            self.remove_path(&tokens[s..end], w);
        }
    }

    /// Removes `w` occurrences of the substrings that start with the first
    /// token of `path` and are prefixes of it (one suffix of a text,
    /// truncated to `max_depth`).
    pub(crate) fn remove_path(&mut self, path: &[u32], w: u32) {
        let mut nodes = std::mem::take(&mut self.path);
        nodes.clear();
        nodes.push(ROOT);
        let mut at = ROOT;
        for &t in path.iter().take(self.max_depth) {
            let Some(c) = self.child(at, t) else { break };
            let n = &mut self.nodes[c as usize];
            n.count = n.count.saturating_sub(w);
            let p = &mut self.nodes[at as usize];
            p.cont = p.cont.saturating_sub(w);
            nodes.push(c);
            at = c;
        }
        for i in (1..nodes.len()).rev() {
            if self.nodes[nodes[i] as usize].count == 0 {
                self.free_subtree(nodes[i - 1], nodes[i]);
            }
        }
        self.path = nodes;
    }

    /// Unlinks `node` from `parent` and frees it with its descendants
    /// (normally none: a child's count never exceeds its parent's).
    fn free_subtree(&mut self, parent: u32, node: u32) {
        let n = self.nodes[node as usize];
        if n.prev == NIL {
            self.nodes[parent as usize].first = n.next;
        } else {
            self.nodes[n.prev as usize].next = n.next;
        }
        if n.next != NIL {
            self.nodes[n.next as usize].prev = n.prev;
        }
        let p = &mut self.nodes[parent as usize];
        p.cont = p.cont.saturating_sub(n.count);
        self.kids.remove(&key(parent, n.token));
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        stack.push(node);
        while let Some(x) = stack.pop() {
            let mut c = self.nodes[x as usize].first;
            while c != NIL {
                let child = self.nodes[c as usize];
                self.kids.remove(&key(x, child.token));
                stack.push(c);
                c = child.next;
            }
            self.nodes[x as usize] = Node::EMPTY;
            self.free.push(x);
        }
        self.stack = stack;
    }

    /// The node of `pattern` when it is a path of the trie.
    fn walk(&self, pattern: &[u32]) -> Option<u32> {
        pattern.iter().try_fold(ROOT, |at, &t| self.child(at, t))
    }

    /// The longest suffix of `context`, at most `max_pattern` tokens, that
    /// occurs followed by some token: its node and length. Substring sets
    /// are closed under taking suffixes, so "occurs with a continuation" is
    /// monotone in the length and a binary search finds the longest.
    pub(crate) fn longest_match(
        &self,
        context: &[u32],
        max_pattern: usize,
    ) -> Option<(u32, usize)> {
        let hi = max_pattern.min(self.max_depth - 1).min(context.len());
        if hi == 0 {
            return None;
        }
        let probe = |m: usize| {
            self.walk(&context[context.len() - m..])
                .filter(|&n| self.nodes[n as usize].cont > 0)
        };
        let mut best = (probe(1)?, 1);
        let (mut lo, mut hi) = (2, hi);
        while lo <= hi {
            let mid = lo + (hi - lo) / 2;
            match probe(mid) {
                Some(n) => {
                    best = (n, mid);
                    lo = mid + 1;
                }
                None => hi = mid - 1,
            }
        }
        Some(best)
    }

    /// Adds to `cands` (under its root) the most probable continuations of
    /// the substring at `node`, best-first by the product of next-token
    /// frequencies, at most `x.budget` nodes, skipping tokens whose
    /// conditional frequency is below `x.min_prob`.
    ///
    /// The frequency of a next token is `count / (cont + 1)` rather than
    /// `count / cont`: one pseudo-occurrence of "something else" keeps a
    /// continuation seen once from scoring a certain 1.0 (it gets 0.5; seen
    /// nine times out of nine, 0.9), so scores stay comparable with other
    /// drafters' acceptance estimates.
    pub(crate) fn expand(
        &self,
        node: u32,
        x: Expansion,
        cands: &mut Candidates,
        heap: &mut super::Heap,
    ) {
        heap.clear();
        let mut seq = 0u32;
        self.push_children(node, 1.0, 0, 1, x.min_prob, heap, &mut seq);
        let mut taken = 0;
        while taken < x.budget {
            let Some(item) = heap.pop() else { break };
            let (score, depth, trie_node, parent) =
                (f32::from_bits(item.0), (item.1).0, item.3, item.4);
            let token = self.nodes[trie_node as usize].token;
            let Some(c) = cands.insert(parent as usize, token, score) else {
                continue;
            };
            taken += 1;
            self.push_children(
                trie_node,
                score,
                c as u32,
                depth + 1,
                x.min_prob,
                heap,
                &mut seq,
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn push_children(
        &self,
        node: u32,
        score: f32,
        cand: u32,
        depth: u32,
        min_prob: f32,
        heap: &mut super::Heap,
        seq: &mut u32,
    ) {
        let n = self.nodes[node as usize];
        if n.cont == 0 {
            return;
        }
        let mut c = n.first;
        let mut seen = 0;
        while c != NIL && seen < SCAN_CAP {
            let child = &self.nodes[c as usize];
            let p = child.count as f32 / (n.cont as f32 + 1.0);
            if p >= min_prob {
                let s = unit(score * p);
                heap.push((
                    s.to_bits(),
                    std::cmp::Reverse(depth),
                    std::cmp::Reverse(*seq),
                    c,
                    cand,
                ));
                *seq = seq.wrapping_add(1);
            }
            c = child.next;
            seen += 1;
        }
    }

    /// Every node as (path, count, cont), for tests comparing tries.
    #[cfg(test)]
    pub(crate) fn dump(&self) -> std::collections::BTreeMap<Vec<u32>, (u32, u32)> {
        let mut out = std::collections::BTreeMap::new();
        let mut stack = vec![(ROOT, Vec::new())];
        while let Some((n, path)) = stack.pop() {
            let node = self.nodes[n as usize];
            out.insert(path.clone(), (node.count, node.cont));
            let mut c = node.first;
            while c != NIL {
                let mut p = path.clone();
                p.push(self.nodes[c as usize].token);
                stack.push((c, p));
                c = self.nodes[c as usize].next;
            }
        }
        out
    }
}
