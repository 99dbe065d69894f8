//! Suffix decoding (Oliaro et al. 2024, "SuffixDecoding", arXiv
//! 2411.04975): draft from suffix tries of text seen before.
//!
//! Two tries are consulted each step:
//!
//! - the **session** trie over this session's prompt and output (the last
//!   [`SuffixConfig::session_window`] tokens), updated incrementally as the
//!   context grows;
//! - the tenant's trie in a [`GlobalSuffixIndex`] of earlier sessions'
//!   outputs, when the drafter was given one.
//!
//! In each, the longest suffix of the context (at most
//! [`max_pattern`](SuffixConfig::max_pattern) tokens) that occurs with a
//! continuation is found, and its subtree is expanded best-first by the
//! product of next-token frequencies, skipping tokens rarer than
//! [`min_token_prob`](SuffixConfig::min_token_prob) — a tree of the most
//! frequent continuations, not a single chain. As in the paper, the number
//! of nodes drafted from a match grows with its length
//! (`spec_factor × length + spec_offset`): a long match is trustworthy, a
//! one-token match barely. Both sources' trees are merged best-first.
//!
//! A session's output joins the global index only when the caller says the
//! session is over: [`SuffixDrafter::finish`] (or
//! [`GlobalSuffixIndex::insert`] directly). Nothing happens on drop, so an
//! aborted or failed session can simply be dropped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, RwLock};

use specmesh_tree::TokenTree;

use crate::merged::candidates::Candidates;
use crate::merged::{checked_root, fallback};
use crate::{DraftContext, Drafter, Feedback};

mod global;
mod trie;

pub use global::{GlobalConfig, GlobalSuffixIndex, TenantKey};
use global::{TenantIndex, read};
use trie::SuffixTrie;

/// Best-first frontier: (score bits, Reverse(depth), Reverse(sequence),
/// trie node, candidate parent).
pub(crate) type Heap = BinaryHeap<(u32, Reverse<u32>, Reverse<u32>, u32, u32)>;

/// How much of one match's subtree to draft.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expansion {
    pub(crate) budget: usize,
    pub(crate) min_prob: f32,
}

/// Tuning of [`SuffixDrafter`]; out-of-range values are clamped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SuffixConfig {
    /// Depth of the session trie: longest pattern plus continuation (≥ 2).
    pub max_depth: usize,
    /// Longest context suffix matched (further capped so that the trie has
    /// room below the match for the step's depth, or half its own depth).
    pub max_pattern: usize,
    /// Nodes drafted per match: `spec_factor × match length + spec_offset`
    /// (at least 1, at most the step's budget).
    pub spec_factor: f32,
    pub spec_offset: f32,
    /// Continuations rarer than this after their parent are not drafted.
    pub min_token_prob: f32,
    /// The session trie covers the last this many tokens (0: no session
    /// trie, only the global index). Raised to `2 × max_depth` if smaller.
    /// Memory is at most about `session_window × max_depth × 44` bytes.
    pub session_window: usize,
}

impl Default for SuffixConfig {
    /// The reference implementation's defaults (ArcticInference / vLLM:
    /// depth 24, factor 1, offset 0, minimum probability 0.1), a 12-token
    /// pattern cap and a 4096-token session window.
    fn default() -> SuffixConfig {
        SuffixConfig {
            max_depth: 24,
            max_pattern: 12,
            spec_factor: 1.0,
            spec_offset: 0.0,
            min_token_prob: 0.1,
            session_window: 4096,
        }
    }
}

impl SuffixConfig {
    fn clamped(self) -> SuffixConfig {
        let max_depth = self.max_depth.max(2);
        let finite = |x: f32, default: f32| if x.is_finite() { x.max(0.0) } else { default };
        SuffixConfig {
            max_depth,
            max_pattern: self.max_pattern.max(1),
            spec_factor: finite(self.spec_factor, 1.0),
            spec_offset: finite(self.spec_offset, 0.0),
            min_token_prob: finite(self.min_token_prob, 0.1).min(1.0),
            session_window: match self.session_window {
                0 => 0,
                w => w.max(2 * max_depth),
            },
        }
    }

    /// Nodes to draft from a match of `len` tokens.
    fn budget(&self, len: usize, max_nodes: usize) -> usize {
        let b = self.spec_factor * len as f32 + self.spec_offset;
        // `as` saturates; a NaN cannot occur (both terms are finite).
        (b as usize).clamp(1, max_nodes.saturating_sub(1).max(1))
    }
}

/// The session's own trie over a sliding window of its tokens.
#[derive(Debug)]
struct SessionIndex {
    trie: SuffixTrie,
    /// All tokens seen (the window is `seen[start..]`).
    seen: Vec<u32>,
    start: usize,
    window: usize,
    active: Vec<u32>,
    next: Vec<u32>,
}

impl SessionIndex {
    fn new(cfg: &SuffixConfig) -> SessionIndex {
        SessionIndex {
            trie: SuffixTrie::new(cfg.max_depth),
            seen: Vec::new(),
            start: 0,
            window: cfg.session_window,
            active: Vec::new(),
            next: Vec::new(),
        }
    }

    /// Brings the trie up to `tokens`: incrementally when they extend what
    /// was seen, from scratch otherwise. O(new tokens × depth).
    fn sync(&mut self, tokens: &[u32]) {
        let n = self.seen.len();
        if tokens.len() < n || tokens[..n] != self.seen[..] {
            self.trie = SuffixTrie::new(self.trie.max_depth());
            self.seen.clear();
            self.start = 0;
            self.active.clear();
        }
        let depth = self.trie.max_depth();
        for &t in &tokens[self.seen.len()..] {
            self.seen.push(t);
            if self.window == 0 {
                continue;
            }
            self.trie.extend(&mut self.active, &mut self.next, t, 1);
            // The window is at least 2 × depth, so the suffix leaving it is
            // complete (not active) and its paths are exactly removable.
            if self.seen.len() - self.start > self.window {
                let end = self.seen.len().min(self.start + depth);
                self.trie.remove_path(&self.seen[self.start..end], 1);
                self.start += 1;
            }
        }
    }
}

/// The global index as one drafter sees it: its tenant's shard.
#[derive(Debug)]
struct GlobalView {
    index: GlobalSuffixIndex,
    tenant: TenantKey,
    shard: Arc<RwLock<TenantIndex>>,
}

/// The suffix decoding drafter; see the module docs.
#[derive(Debug)]
pub struct SuffixDrafter {
    cfg: SuffixConfig,
    session: SessionIndex,
    global: Option<GlobalView>,
    cands: Candidates,
    heap: Heap,
    prompt_len: usize,
    /// Tokens committed since the last proposal (the next context's tail).
    pending: Vec<u32>,
}

impl Default for SuffixDrafter {
    fn default() -> SuffixDrafter {
        SuffixDrafter::new(SuffixConfig::default())
    }
}

impl SuffixDrafter {
    /// A drafter over the session's own text only.
    pub fn new(cfg: SuffixConfig) -> SuffixDrafter {
        let cfg = cfg.clamped();
        SuffixDrafter {
            session: SessionIndex::new(&cfg),
            cfg,
            global: None,
            cands: Candidates::new(),
            heap: Heap::new(),
            prompt_len: 0,
            pending: Vec::new(),
        }
    }

    /// A drafter that also reads `tenant`'s part of `index`, and only that.
    pub fn with_global(
        cfg: SuffixConfig,
        index: &GlobalSuffixIndex,
        tenant: TenantKey,
    ) -> SuffixDrafter {
        let mut d = SuffixDrafter::new(cfg);
        d.global = Some(GlobalView {
            shard: index.shard(&tenant),
            index: index.clone(),
            tenant,
        });
        d
    }

    pub fn config(&self) -> SuffixConfig {
        self.cfg
    }

    /// The session's output so far: tokens after the prompt, including
    /// those committed since the last proposal.
    pub fn output(&self) -> Vec<u32> {
        let mut out = self
            .session
            .seen
            .get(self.prompt_len..)
            .unwrap_or_default()
            .to_vec();
        out.extend_from_slice(&self.pending);
        out
    }

    /// Ends the session: its output joins the global index (if the drafter
    /// has one) for the tenant's later sessions.
    pub fn finish(self) {
        if let Some(g) = &self.global {
            g.index.insert(&g.tenant, &self.output());
        }
    }
}

/// Drafts from the longest match of the context in `trie` into `cands`.
fn draft_from(
    trie: &SuffixTrie,
    ctx: &DraftContext<'_>,
    cfg: &SuffixConfig,
    cands: &mut Candidates,
    heap: &mut Heap,
) {
    // Pattern and continuation share the trie's depth: leave room for
    // min(step depth, half the trie) tokens after the match.
    let room = ctx.limits.max_depth.min(trie.max_depth() / 2);
    let max_pattern = cfg.max_pattern.min(trie.max_depth() - room);
    if let Some((node, len)) = trie.longest_match(ctx.tokens, max_pattern) {
        let x = Expansion {
            budget: cfg.budget(len, ctx.limits.max_nodes),
            min_prob: cfg.min_token_prob,
        };
        trie.expand(node, x, cands, heap);
    }
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> &'static str {
        "suffix"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let Some(root) = checked_root(ctx) else {
            return fallback(ctx);
        };
        self.session.sync(ctx.tokens);
        self.prompt_len = ctx.prompt_len;
        self.pending.clear();
        if ctx.limits.max_nodes <= 1 || ctx.limits.max_depth == 0 {
            return TokenTree::placeholder(Some(root), ctx.limits);
        }
        let SuffixDrafter {
            cfg,
            session,
            global,
            cands,
            heap,
            ..
        } = self;
        cands.reset(root, ctx.limits);
        if session.window > 0 {
            draft_from(&session.trie, ctx, cfg, cands, heap);
        }
        if let Some(g) = global {
            draft_from(&read(&g.shard).trie, ctx, cfg, cands, heap);
        }
        cands.build()
    }

    /// Remembers the committed tokens, so that [`finish`](Self::finish)
    /// sees the whole output even if no proposal follows the last step.
    fn observe(&mut self, feedback: &Feedback<'_>) {
        self.pending.extend_from_slice(feedback.committed);
    }
}

#[cfg(test)]
mod tests;
