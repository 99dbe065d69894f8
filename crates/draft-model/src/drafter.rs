//! [`ModelDrafter`]: a small model (or the target's first layers) proposing
//! token trees, one forward per depth.
//!
//! # KV bookkeeping
//!
//! The drafter keeps one [`Sequence`] per session and `cached`, the tokens
//! whose K/V it holds (committed, in position order). A propose first brings
//! it up to date with the context: it keeps the longest common prefix of
//! `cached` and `ctx.tokens` (anything after is a rejected draft or a
//! rolled-back context) and feeds the rest, root included, as one chain. The
//! root's logits come from that forward; if the cache already held every
//! context token, the root is fed again so there are logits to start from.
//!
//! A `Sequence` holds one staged block at a time, so the levels of a tree
//! cannot be stacked as staged blocks. Instead, after each level's forward
//! the path from the last committed node down to the deepest node shared by
//! every node to expand next (their common ancestor) is *committed*, and the
//! next level's block holds only what is below it. A chain thus costs one
//! one-token forward per depth, like autoregressive drafting, and a tree
//! recomputes only its branches below the common stem. The committed stem
//! stays in the cache after the propose: when the target accepts it, the
//! next propose finds its K/V already there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use specmesh_draft::{DraftContext, Drafter};
use specmesh_model::{Block, BlockError, Model, ModelError, Sequence};
use specmesh_sampling::SamplingParams;
use specmesh_tree::{TokenTree, TreeBuilder, TreeError, TreeLimits};

use crate::alloc::{Frontier, allocate};
use crate::dist::{greedy_candidates, node_seed, sample_without_replacement, sampled_candidates};
use crate::error::DraftModelError;

/// Knobs of a [`ModelDrafter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftOptions {
    /// Most children of one node. 1 drafts chains only.
    pub max_children: usize,
    /// Support of a sampled node's draft distribution: the processed
    /// distribution is truncated to its `support` most likely tokens and
    /// renormalised before children are drawn (and sent as the
    /// `DraftDist`). Larger is closer to the full q, but heavier on the wire.
    pub support: usize,
}

impl Default for DraftOptions {
    fn default() -> DraftOptions {
        DraftOptions {
            max_children: 8,
            support: 32,
        }
    }
}

impl DraftOptions {
    fn validate(&self) -> Result<(), DraftModelError> {
        if self.max_children == 0 {
            return Err(DraftModelError::BadOption {
                field: "max_children",
                value: 0,
                reason: "must be >= 1",
            });
        }
        if self.support < self.max_children {
            return Err(DraftModelError::BadOption {
                field: "support",
                value: self.support,
                reason: "must be >= max_children (a node draws its children from it)",
            });
        }
        Ok(())
    }
}

/// Stops a propose before its next tree level: another thread (the one
/// that received the outcome a guess drafted ahead was waiting for) sets
/// it, the drafter reads it between levels and keeps the tree grown so
/// far. Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Stops the propose under way (or the next one) after its level.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Lets proposes grow whole trees again.
    pub fn reset(&self) {
        self.0.store(false, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Counters for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrafterStats {
    /// Proposes that drafted at least one node.
    pub proposes: u64,
    /// Draft forwards run (catch-up and tree levels).
    pub forwards: u64,
    /// Context tokens fed to catch up (prefill and accepted tokens).
    pub context_tokens: u64,
    /// Tree tokens fed (including recomputed branch prefixes).
    pub tree_tokens: u64,
    /// Proposes that fell back to the root alone after a model error.
    pub errors: u64,
    /// Proposes stopped by their [`Cancel`] before their last level.
    pub cancelled: u64,
    /// Drafting through text ([`crate::CrossVocabDrafter`]): nanoseconds
    /// spent mapping between the vocabularies, and target tokens dropped
    /// where a draft's text ended inside one.
    pub retokenize_nanos: u64,
    pub boundary_lost: u64,
}

/// A drafter backed by a small model sharing the target's vocabulary.
#[derive(Debug)]
pub struct ModelDrafter {
    model: Arc<Model>,
    params: SamplingParams,
    options: DraftOptions,
    vocab: u32,
    seq: Sequence,
    /// The tokens whose K/V `seq` holds: `seq.len() == cached.len()`.
    cached: Vec<u32>,
    /// Running mean of the r-th largest candidate probability over the
    /// nodes expanded so far: the estimate of levels not yet computed.
    rank_probs: Vec<f32>,
    /// Proposes so far; keys the sampling uniforms.
    step: u64,
    stats: DrafterStats,
    /// Read between tree levels; see [`Cancel`].
    cancel: Cancel,
}

/// Weight of a new node in the running rank estimate.
const RANK_EMA: f32 = 0.1;

/// One expanded (or expandable) tree node: its index and candidates.
type Expandable = (usize, Vec<(u32, f32)>);

impl ModelDrafter {
    /// A drafter for one session of a request sampled with `params` (greedy
    /// when its temperature is 0), whose trees use a vocabulary of `vocab`
    /// tokens (the target's). The draft model must have exactly that
    /// vocabulary; check the pieces too with [`crate::check_vocab`] when it
    /// is a separate model.
    pub fn new(
        model: Arc<Model>,
        params: SamplingParams,
        vocab: u32,
        options: DraftOptions,
    ) -> Result<ModelDrafter, DraftModelError> {
        options.validate()?;
        let draft = model.config().vocab_size;
        if draft != vocab as usize {
            return Err(DraftModelError::VocabSize {
                draft,
                target: vocab,
            });
        }
        Ok(ModelDrafter {
            seq: model.new_sequence(),
            model,
            params,
            options,
            vocab,
            cached: Vec::new(),
            rank_probs: Vec::new(),
            step: 0,
            stats: DrafterStats::default(),
            cancel: Cancel::default(),
        })
    }

    /// The flag that stops this drafter's proposes between levels.
    pub fn cancel_handle(&self) -> Cancel {
        self.cancel.clone()
    }

    pub fn stats(&self) -> DrafterStats {
        self.stats
    }

    /// Tokens whose K/V the drafter currently holds.
    pub fn cached_len(&self) -> usize {
        self.cached.len()
    }

    /// The tokens whose K/V the drafter holds, in position order: the
    /// context it last caught up on, then possibly a drafted stem the
    /// target has not (yet) accepted.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// Appends the K/V of `tokens`, computed elsewhere by the same model
    /// (a prefix cache), after what the drafter holds: the next propose
    /// feeds only what follows them. `data` is [`Self::export_kv`]'s
    /// layout for `tokens.len()` tokens.
    pub fn import_kv(&mut self, tokens: &[u32], data: &[u8]) -> Result<(), ModelError> {
        let per = self.seq.bytes_per_token();
        if data.len() != tokens.len() * per {
            return Err(ModelError::InvalidCommit(format!(
                "imported KV holds {} bytes, not {} tokens of {per}",
                data.len(),
                tokens.len()
            )));
        }
        self.seq.import(data)?;
        self.cached.extend_from_slice(tokens);
        Ok(())
    }

    /// The K/V of held tokens `start..start + n`, for a prefix cache.
    pub fn export_kv(&self, start: usize, n: usize) -> Result<Vec<u8>, ModelError> {
        self.seq.export(start, n)
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// Brings the cache up to `tokens` and returns the last token's logits.
    fn sync(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut common = self
            .cached
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        if common == tokens.len() {
            // The root's logits are needed: feed it again.
            common = common.checked_sub(1).ok_or(BlockError::Empty)?;
        }
        self.seq.truncate(common);
        self.cached.truncate(common);
        let feed = tokens[common..].to_vec();
        let block = Block::chain(feed.clone(), common)?.last_logits_only();
        self.stats.forwards += 1;
        self.stats.context_tokens += feed.len() as u64;
        let logits = self.model.forward(&mut self.seq, &block)?;
        self.seq.commit(&(0..feed.len()).collect::<Vec<_>>())?;
        self.cached.extend_from_slice(&feed);
        Ok(logits.row(logits.rows() - 1).to_vec())
    }

    /// A node's candidate children from its logits row. A head that scores
    /// only some tokens (FR-Spec) has a column per token it keeps: the
    /// candidates, and so the q a sampled node sends, are over those
    /// tokens, every other token having q = 0 (rejection sampling stays
    /// exact with any q the children are truly drawn from).
    fn candidates(&self, row: &[f32]) -> Option<Vec<(u32, f32)>> {
        let mut c = if self.greedy() {
            greedy_candidates(row, self.options.max_children)
        } else {
            sampled_candidates(row, &self.params, self.options.support)
        }?;
        if let Some(tokens) = self.model.head_tokens() {
            for e in &mut c {
                e.0 = tokens[e.0 as usize];
            }
        }
        Some(c)
    }

    fn learn_ranks(&mut self, probs: &[(u32, f32)]) {
        let k = self.options.max_children;
        if self.rank_probs.is_empty() {
            self.rank_probs = (0..k).map(|r| probs.get(r).map_or(0.0, |e| e.1)).collect();
            return;
        }
        for (r, est) in self.rank_probs.iter_mut().enumerate() {
            let p = probs.get(r).map_or(0.0, |e| e.1);
            *est += RANK_EMA * (p - *est);
        }
    }

    /// Grows the tree from the root's logits; see the module docs.
    fn grow(
        &mut self,
        ctx: &DraftContext<'_>,
        root_logits: &[f32],
    ) -> Result<TokenTree, TreeError> {
        let limits = ctx.limits;
        let root = ctx.tokens.last().copied().unwrap_or(0);
        let mut tree = Growing::new(root, limits)?;
        let Some(root_dist) = self.candidates(root_logits) else {
            return Ok(tree.builder.build());
        };
        self.learn_ranks(&root_dist);
        let mut expandable: Vec<Expandable> = vec![(0, root_dist)];
        for depth in 1..=limits.max_depth {
            let below = limits.max_depth - depth;
            let children = self.add_children(&mut tree, &expandable, below)?;
            if below == 0 || tree.builder.is_full() || children.is_empty() {
                break;
            }
            let to_expand = self.worth_expanding(&tree, &children, below);
            if to_expand.is_empty() {
                break;
            }
            if self.cancel.is_cancelled() {
                self.stats.cancelled += 1;
                break;
            }
            match self.forward_level(&mut tree, &to_expand) {
                Ok(dists) => expandable = dists,
                // Typically the draft model's context is full: keep what
                // was drafted so far.
                Err(_) => {
                    self.stats.errors += 1;
                    break;
                }
            }
        }
        Ok(tree.builder.build())
    }

    /// Gives the `expandable` nodes their children (with `below` levels
    /// still to come) and returns the new nodes.
    fn add_children(
        &self,
        tree: &mut Growing,
        expandable: &[Expandable],
        below: usize,
    ) -> Result<Vec<usize>, TreeError> {
        let budget = tree.limits().max_nodes.saturating_sub(tree.builder.len());
        let probs: Vec<Vec<f32>> = expandable
            .iter()
            .map(|(_, d)| d.iter().map(|e| e.1).collect())
            .collect();
        let frontier: Vec<Frontier<'_>> = expandable
            .iter()
            .zip(&probs)
            .map(|((n, _), p)| Frontier {
                score: tree.scores[*n],
                probs: p,
            })
            .collect();
        let max_children = self.options.max_children;
        let counts = allocate(&frontier, &self.rank_probs, budget, below, max_children);
        let mut children = Vec::new();
        for ((node, dist), &m) in expandable.iter().zip(&counts) {
            if m == 0 {
                continue;
            }
            let picks: Vec<usize> = if self.greedy() {
                (0..m.min(dist.len())).collect()
            } else {
                let seed = node_seed(self.params.seed, self.step, *node);
                sample_without_replacement(dist, m, seed)
            };
            for i in picks {
                let (token, q) = dist[i];
                children.push(tree.push(*node, token, q)?);
            }
            if !self.greedy() {
                tree.builder.set_draft_dist(*node, dist.clone())?;
            }
        }
        Ok(children)
    }

    /// The new nodes that may get children of their own: the same
    /// best-first as [`allocate`], with the rank estimates standing in for
    /// their distributions, which only a forward would tell.
    fn worth_expanding(&self, tree: &Growing, children: &[usize], below: usize) -> Vec<usize> {
        let budget = tree.limits().max_nodes.saturating_sub(tree.builder.len());
        let est = &self.rank_probs;
        let frontier: Vec<Frontier<'_>> = children
            .iter()
            .map(|&c| Frontier {
                score: tree.scores[c],
                probs: est,
            })
            .collect();
        let next = allocate(
            &frontier,
            est,
            budget,
            below.saturating_sub(1),
            self.options.max_children,
        );
        children
            .iter()
            .zip(&next)
            .filter(|(_, n)| **n > 0)
            .map(|(&c, _)| c)
            .collect()
    }

    /// Runs one forward over `nodes` and the not-yet-committed nodes above
    /// them, returns their candidates, and commits their common stem.
    fn forward_level(
        &mut self,
        tree: &mut Growing,
        nodes: &[usize],
    ) -> Result<Vec<Expandable>, ModelError> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let anchor = tree.anchor;
        let mut in_block = vec![false; tree.parents.len()];
        for &n in nodes {
            let mut i = n;
            while i != anchor && !in_block[i] {
                in_block[i] = true;
                i = tree.parents[i];
            }
        }
        let block_nodes: Vec<usize> = (0..in_block.len()).filter(|&i| in_block[i]).collect();
        let mut local = vec![usize::MAX; tree.parents.len()];
        for (j, &n) in block_nodes.iter().enumerate() {
            local[n] = j;
        }
        let tokens = block_nodes.iter().map(|&n| tree.builder.token(n)).collect();
        let parents = block_nodes
            .iter()
            .map(|&n| {
                let p = tree.parents[n];
                (p != anchor).then_some(local[p])
            })
            .collect();
        let start = self.seq.len();
        let block = Block::tree(tokens, parents, start)?;
        self.stats.forwards += 1;
        self.stats.tree_tokens += block.len() as u64;
        let logits = self.model.forward(&mut self.seq, &block)?;

        let mut out = Vec::with_capacity(nodes.len());
        for &n in nodes {
            if let Some(d) = self.candidates(logits.row(local[n])) {
                self.learn_ranks(&d);
                out.push((n, d));
            }
        }

        // The stem: anchor → the deepest common ancestor of `nodes`.
        let mut stem = tree.path_below(anchor, nodes[0]);
        stem.truncate(
            stem.iter()
                .position(|&s| !nodes.iter().all(|&n| tree.is_ancestor(s, n)))
                .unwrap_or(stem.len()),
        );
        if stem.is_empty() {
            self.seq.discard();
        } else {
            let kept: Vec<usize> = stem.iter().map(|&s| local[s]).collect();
            if let Err(e) = self.seq.commit(&kept) {
                // Cannot happen for a path of this block; leave the cache
                // consistent anyway.
                self.seq.truncate(start);
                return Err(e);
            }
            self.cached
                .extend(stem.iter().map(|&s| tree.builder.token(s)));
            tree.anchor = *stem.last().unwrap_or(&anchor);
        }
        Ok(out)
    }

    /// The root alone ([`TokenTree::placeholder`] for a context that breaks
    /// its contract, as the model-free drafters of `specmesh-draft` answer).
    fn root_only(ctx: &DraftContext<'_>) -> TokenTree {
        TokenTree::placeholder(ctx.tokens.last().copied(), ctx.limits)
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> &'static str {
        "model"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let limits = ctx.limits;
        let bad_root = ctx.tokens.last().is_none_or(|&r| r >= limits.vocab);
        if limits.max_nodes <= 1 || limits.max_depth == 0 || limits.vocab != self.vocab || bad_root
        {
            // Speculation off (or trees this model cannot serve): the cache
            // catches up lazily, in one chain, when drafting resumes.
            return Self::root_only(ctx);
        }
        self.step += 1;
        let root_logits = match self.sync(ctx.tokens) {
            Ok(l) => l,
            Err(_) => {
                // Context overflow or a bad token: start over next time.
                self.stats.errors += 1;
                self.seq.truncate(0);
                self.cached.clear();
                return Self::root_only(ctx);
            }
        };
        let base = self.cached.len();
        let tree = self.grow(ctx, &root_logits);
        if self.seq.staged_len() > 0 {
            self.seq.discard();
        }
        debug_assert!(self.cached.len() >= base && self.seq.len() == self.cached.len());
        match tree {
            Ok(t) => {
                self.stats.proposes += 1;
                t
            }
            Err(_) => {
                self.stats.errors += 1;
                Self::root_only(ctx)
            }
        }
    }
}

/// A tree being grown, with what the builder does not expose.
struct Growing {
    builder: TreeBuilder,
    parents: Vec<usize>,
    scores: Vec<f32>,
    /// The deepest node whose K/V is committed in the draft cache.
    anchor: usize,
}

impl Growing {
    fn new(root: u32, limits: TreeLimits) -> Result<Growing, TreeError> {
        Ok(Growing {
            builder: TreeBuilder::new(root, limits)?,
            parents: vec![0],
            scores: vec![1.0],
            anchor: 0,
        })
    }

    /// Adds a child scoring its parent's score times `q`.
    fn push(&mut self, parent: usize, token: u32, q: f32) -> Result<usize, TreeError> {
        let score = (self.scores[parent] * q).clamp(0.0, 1.0);
        let score = if score.is_nan() { 0.0 } else { score };
        let i = self.builder.push(parent, token, score)?;
        if i == self.parents.len() {
            self.parents.push(parent);
            self.scores.push(self.builder.score(i));
        }
        Ok(i)
    }

    fn limits(&self) -> TreeLimits {
        self.builder.limits()
    }

    fn is_ancestor(&self, a: usize, mut b: usize) -> bool {
        loop {
            if a == b {
                return true;
            }
            if b == 0 {
                return false;
            }
            b = self.parents[b];
        }
    }

    /// Nodes strictly below `top` down to `node`, top first.
    fn path_below(&self, top: usize, node: usize) -> Vec<usize> {
        let mut path = Vec::new();
        let mut i = node;
        while i != top && i != 0 {
            path.push(i);
            i = self.parents[i];
        }
        path.reverse();
        path
    }
}
