//! Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"): the
//! continuation of an earlier occurrence of the context's last n tokens is
//! a good guess for what comes next, above all in summarisation, editing,
//! RAG and code, where the output quotes its input.
//!
//! # Index
//!
//! Rescanning the context for every step costs O(context × n) and, at
//! thousands of tokens, tens of microseconds. Instead [`PromptLookup`]
//! keeps, per n-gram length n, a hash chain in the style of LZ77
//! compressors: `heads[hash(n-gram)]` is the latest position where that
//! n-gram ends and `prev[position]` the one before it. Each new token adds
//! one entry per length, so a step costs O(new tokens × lengths) to index
//! plus O(matches × depth) to draft, independent of the context's length
//! (bar one `memcmp` that checks the context still extends what was indexed).
//!
//! # Tree and scores
//!
//! Lengths are tried longest first; each length contributes the continuations
//! of its most recent occurrences (skipping positions a longer length already
//! used) until `max_matches` are found. Continuations become branches of one
//! tree. A node's score is `share × rate_n^depth`: `share` is the fraction of
//! that length's matches whose continuation agrees with the node's path (the
//! empirical probability of that continuation), and `rate_n` the per-token
//! acceptance rate observed for matches of length n, learned from
//! [`Feedback`] (starting from a prior that trusts longer matches more).

use specmesh_tree::TokenTree;

use crate::merged::candidates::Candidates;
use crate::merged::hashing::{FastMap, mix};
use crate::merged::rate::{Rate, survived};
use crate::merged::{checked_root, fallback};
use crate::{DraftContext, Drafter, Feedback};

const NONE: u32 = u32::MAX;
/// Longest n-gram length accepted by [`LookupConfig`].
pub const MAX_NGRAM: usize = 16;
/// Most matches accepted by [`LookupConfig`] (the share of a continuation
/// is computed with a 64-bit agreement mask).
pub const MAX_MATCHES: usize = 64;

/// Tuning of [`PromptLookup`]; out-of-range values are clamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupConfig {
    /// Shortest n-gram worth matching (≥ 1).
    pub min_ngram: usize,
    /// Longest n-gram matched (≤ [`MAX_NGRAM`]).
    pub max_ngram: usize,
    /// Most matches (branches) per step, over all lengths (≤ [`MAX_MATCHES`]).
    pub max_matches: usize,
    /// Most hash-chain links followed per length: bounds the work on
    /// degenerate text where one n-gram occurs everywhere.
    pub max_chain: usize,
}

impl Default for LookupConfig {
    fn default() -> LookupConfig {
        LookupConfig {
            min_ngram: 1,
            max_ngram: 4,
            max_matches: 4,
            max_chain: 64,
        }
    }
}

impl LookupConfig {
    fn clamped(self) -> LookupConfig {
        let max_ngram = self.max_ngram.clamp(1, MAX_NGRAM);
        LookupConfig {
            min_ngram: self.min_ngram.clamp(1, max_ngram),
            max_ngram,
            max_matches: self.max_matches.clamp(1, MAX_MATCHES),
            max_chain: self.max_chain.max(1),
        }
    }

    fn levels(&self) -> usize {
        self.max_ngram - self.min_ngram + 1
    }
}

/// The map key of an n-gram of length `n` with running hash `h`: lengths
/// get separate chains even if their running hashes collide.
#[inline]
fn key(h: u64, n: usize) -> u64 {
    mix(h, n as u32)
}

/// The prior acceptance rate of a match of length `n`: n / (n + 1.5),
/// 0.4 for unigrams, 0.73 for 4-grams, worth 4 observations; about the
/// last 50 observations weigh in.
fn prior(n: usize) -> Rate {
    Rate::new(n as f32 / (n as f32 + 1.5), 4.0, 0.98)
}

/// A continuation proposed last step: `len` tokens of the context from
/// `start`, found by a match of length `min_ngram + level`.
#[derive(Clone, Copy, Debug)]
struct Branch {
    level: usize,
    start: usize,
    len: usize,
}

/// The prompt lookup drafter; see the module docs.
#[derive(Debug)]
pub struct PromptLookup {
    cfg: LookupConfig,
    /// The tokens indexed so far (a copy, to detect a context that does not
    /// extend them).
    seen: Vec<u32>,
    heads: FastMap<u64, u32>,
    /// `prev[(end - 1) * levels + level]`: the previous end of the same
    /// n-gram, or `NONE`.
    prev: Vec<u32>,
    rates: Vec<Rate>,
    cands: Candidates,
    matches: Vec<usize>,
    used: Vec<usize>,
    last: Vec<Branch>,
    last_root: Option<u32>,
}

impl Default for PromptLookup {
    fn default() -> PromptLookup {
        PromptLookup::new(LookupConfig::default())
    }
}

impl PromptLookup {
    pub fn new(cfg: LookupConfig) -> PromptLookup {
        let cfg = cfg.clamped();
        PromptLookup {
            rates: (cfg.min_ngram..=cfg.max_ngram).map(prior).collect(),
            cfg,
            seen: Vec::new(),
            heads: FastMap::default(),
            prev: Vec::new(),
            cands: Candidates::new(),
            matches: Vec::new(),
            used: Vec::new(),
            last: Vec::new(),
            last_root: None,
        }
    }

    pub fn config(&self) -> LookupConfig {
        self.cfg
    }

    /// Brings the index up to `tokens`, incrementally when they extend what
    /// was indexed, from scratch otherwise.
    fn sync(&mut self, tokens: &[u32]) {
        let n = self.seen.len();
        if tokens.len() < n || tokens[..n] != self.seen[..] {
            self.seen.clear();
            self.heads.clear();
            self.prev.clear();
        }
        // Positions are stored as u32 with NONE reserved.
        let limit = tokens.len().min(NONE as usize - 1);
        for end in self.seen.len() + 1..=limit {
            self.seen.push(tokens[end - 1]);
            let mut h = 0u64;
            for n in 1..=self.cfg.max_ngram {
                if n > end {
                    if n >= self.cfg.min_ngram {
                        self.prev.push(NONE);
                    }
                    continue;
                }
                h = mix(h, tokens[end - n]);
                if n >= self.cfg.min_ngram {
                    let prev = self.heads.insert(key(h, n), end as u32).unwrap_or(NONE);
                    self.prev.push(prev);
                }
            }
        }
    }

    /// Ends of earlier occurrences of the context's last `n` tokens, most
    /// recent first, into `self.matches`.
    fn find(&mut self, n: usize, want: usize) {
        self.matches.clear();
        let t = &self.seen;
        let len = t.len();
        if n >= len {
            return;
        }
        let suffix = &t[len - n..];
        let h = suffix.iter().rev().fold(0u64, |h, &x| mix(h, x));
        let Some(&head) = self.heads.get(&key(h, n)) else {
            return;
        };
        let levels = self.cfg.levels();
        let level = n - self.cfg.min_ngram;
        let mut end = head;
        let mut steps = 0;
        while end != NONE && steps < self.cfg.max_chain && self.matches.len() < want {
            let e = end as usize;
            if e < len && e >= n && t[e - n..e] == *suffix && !self.used.contains(&e) {
                self.matches.push(e);
            }
            // Chain entries are ends ≥ 1; anything else ends the walk.
            end = e
                .checked_sub(1)
                .and_then(|i| self.prev.get(i * levels + level))
                .copied()
                .unwrap_or(NONE);
            steps += 1;
        }
    }

    /// Adds the continuations of `self.matches` (a match length of `n`).
    fn add_matches(&mut self, n: usize, max_depth: usize) {
        let level = n - self.cfg.min_ngram;
        let rate = self.rates[level].mean();
        let m = self.matches.len();
        let len = self.seen.len();
        for i in 0..m {
            let start = self.matches[i];
            let depth = max_depth.min(len - start);
            // Bit j: match j agrees with match i so far.
            let mut agree: u64 = if m == 64 { u64::MAX } else { (1u64 << m) - 1 };
            let mut node = 0;
            let mut score = 1.0f32;
            let mut taken = 0;
            for d in 0..depth {
                let tok = self.seen[start + d];
                for (j, &s) in self.matches.iter().enumerate() {
                    if s + d >= len || self.seen[s + d] != tok {
                        agree &= !(1u64 << j);
                    }
                }
                score *= rate;
                let share = agree.count_ones() as f32 / m as f32;
                match self.cands.insert(node, tok, share * score) {
                    Some(c) => node = c,
                    None => break,
                }
                taken += 1;
            }
            if taken > 0 {
                self.last.push(Branch {
                    level,
                    start,
                    len: taken,
                });
            }
        }
    }
}

impl Drafter for PromptLookup {
    fn name(&self) -> &'static str {
        "lookup"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let Some(root) = checked_root(ctx) else {
            return fallback(ctx);
        };
        self.sync(ctx.tokens);
        self.last.clear();
        self.last_root = Some(root);
        let limits = ctx.limits;
        if limits.max_nodes <= 1 || limits.max_depth == 0 || self.seen.len() != ctx.tokens.len() {
            return TokenTree::placeholder(Some(root), limits);
        }
        self.cands.reset(root, limits);
        self.used.clear();
        for n in (self.cfg.min_ngram..=self.cfg.max_ngram).rev() {
            let want = self.cfg.max_matches - self.used.len();
            if want == 0 {
                break;
            }
            self.find(n, want);
            if self.matches.is_empty() {
                continue;
            }
            self.used.extend_from_slice(&self.matches);
            self.add_matches(n, limits.max_depth);
        }
        self.cands.build()
    }

    /// Learns each length's acceptance rate from how far its best branch of
    /// the last proposal agreed with the committed tokens, counting only
    /// the tokens that survived into the verified tree (walked by token, so
    /// it works under [`Merged`](crate::merged::Merged) too).
    fn observe(&mut self, feedback: &Feedback<'_>) {
        if self.last_root != Some(feedback.tree.root_token()) {
            self.last.clear();
            return;
        }
        // Per length: (accepted, offered) of its best branch.
        let mut best = [None::<(usize, usize)>; MAX_NGRAM];
        for b in &self.last {
            let Some(tokens) = self.seen.get(b.start..b.start + b.len) else {
                continue;
            };
            let (accepted, offered) = survived(feedback.tree, tokens, feedback.committed);
            if offered > 0 && best[b.level].is_none_or(|(a, _)| accepted > a) {
                best[b.level] = Some((accepted, offered));
            }
        }
        for (rate, best) in self.rates.iter_mut().zip(best) {
            if let Some((accepted, offered)) = best {
                rate.observe(accepted, offered);
            }
        }
        self.last.clear();
        self.last_root = None;
    }
}

#[cfg(test)]
mod tests;
