//! One generation on the target: KV cache, committed tokens, stop rules.

use std::time::Instant;

use specmesh_model::{Block, Model, Sequence};
use specmesh_sampling::SamplingParams;
use specmesh_tree::TokenTree;
use specmesh_verify::{Constrained, Constraint, TokenLogprobs, Verification, constrain};

/// Nodes a step grafts onto a constrained session's tree from what its
/// grammar forces, at most: JSON keys and punctuation run a few tokens at
/// a time, and each grafted node costs a row of the forward.
pub const MAX_GRAFTED: usize = 16;

use crate::EngineError;

/// Token-level stop rules, enforced where tokens are committed so that no
/// forward is spent past them. (Stop strings are text: the gateway's.)
#[derive(Clone, Debug)]
pub struct SessionLimits {
    /// Tokens to generate in this session, >= 1.
    pub max_new_tokens: usize,
    /// End-of-sequence ids: generation ends there, the token is not kept.
    pub eos: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Length,
    Eos,
}

impl Finish {
    /// As the APIs name it: `length` or `eos`.
    pub fn name(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Eos => "eos",
        }
    }
}

/// The outcome of one verify step for one session.
#[derive(Clone, Debug)]
pub struct Step {
    /// Tokens committed by this step (EOS and anything past a limit cut).
    pub committed: Vec<u32>,
    /// Drafted nodes in the tree.
    pub drafted: usize,
    /// Drafted tokens accepted (before cutting at a limit).
    pub accepted: usize,
    /// Tokens accepted from what the output's grammar forced (nodes
    /// grafted onto the tree, not drafted), before cutting at a limit.
    pub forced: usize,
    /// With logprobs on: one per committed token.
    pub logprobs: Vec<TokenLogprobs>,
    /// The verification, its path in the indices of the tree as given
    /// (cut before the first grafted node).
    pub verification: Verification,
    /// Set when this step ended the session.
    pub finish: Option<Finish>,
}

/// A generation on the target model.
#[derive(Debug)]
pub struct Session {
    pub(crate) seq: Sequence,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Output tokens generated before this session (a resumed session keeps
    /// counting sampling positions from there).
    generated: usize,
    pub(crate) params: SamplingParams,
    limits: SessionLimits,
    finish: Option<Finish>,
    /// The output's grammar, at the next token.
    pub(crate) constraint: Option<Box<dyn Constraint>>,
    /// Report each committed token's log-probability with this many
    /// alternatives.
    pub(crate) logprobs: Option<usize>,
}

impl Session {
    /// A session over `tokens` (prompt, then any output already committed
    /// elsewhere), reusing `cache` when given: its KV for the longest common
    /// prefix is kept. Nothing is computed until [`Session::prefill`].
    pub fn new(
        model: &Model,
        tokens: Vec<u32>,
        prompt_len: usize,
        params: SamplingParams,
        limits: SessionLimits,
        cache: Option<(Sequence, &[u32])>,
    ) -> Result<Session, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyContext);
        }
        let seq = match cache {
            Some((mut seq, cached)) => {
                let common = cached
                    .iter()
                    .zip(&tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                seq.truncate(common.min(tokens.len() - 1));
                seq
            }
            None => model.new_sequence(),
        };
        let prompt_len = prompt_len.min(tokens.len());
        Ok(Session {
            seq,
            generated: 0,
            prompt_len,
            tokens,
            params,
            limits,
            finish: None,
            constraint: None,
            logprobs: None,
        })
    }

    /// Constrains the output to `constraint` (a grammar), which must
    /// already follow the output committed before this session.
    pub fn constrain(&mut self, constraint: Box<dyn Constraint>) {
        self.constraint = Some(constraint);
    }

    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// The output's grammar, for its statistics.
    pub fn constraint_mut(&mut self) -> Option<&mut (dyn Constraint + 'static)> {
        self.constraint.as_deref_mut()
    }

    /// Reports each committed token's log-probability with `top`
    /// alternatives.
    pub fn with_logprobs(&mut self, top: usize) {
        self.logprobs = Some(top);
    }

    /// Allocates the KV cache for `total` tokens up front.
    pub fn reserve_kv(&mut self, total: usize) {
        self.seq.reserve_total(total);
    }

    /// Computes the KV of every context token but the last (the first
    /// tree's root). Returns the tokens reused from the cache and seconds.
    pub fn prefill(&mut self, model: &Model) -> Result<(usize, f64), EngineError> {
        let t0 = Instant::now();
        let reused = self.seq.len();
        while !self.prefill_chunk(model, usize::MAX)? {}
        Ok((reused, t0.elapsed().as_secs_f64()))
    }

    /// Computes the KV of at most `max_tokens` more context tokens (a chunk
    /// of the prefill, so a verifier can run other sessions' steps between
    /// chunks); returns whether the prefill is complete. Each row of a
    /// forward is computed on its own, so the KV is the same, bit for bit,
    /// however the prefill is chunked.
    pub fn prefill_chunk(&mut self, model: &Model, max_tokens: usize) -> Result<bool, EngineError> {
        if let Some(block) = self.prefill_block(max_tokens)? {
            model.forward(&mut self.seq, &block)?;
            self.commit_prefill(block.len())?;
        }
        Ok(self.prefill_left() == 0)
    }

    /// Context tokens whose KV is still to compute before the first step.
    pub fn prefill_left(&self) -> usize {
        (self.tokens.len() - 1).saturating_sub(self.seq.len())
    }

    /// The next chunk of the prefill, at most `max_tokens` (at least one)
    /// context tokens, with only its last row's logits; `None` when the
    /// prefill is complete.
    pub(crate) fn prefill_block(&self, max_tokens: usize) -> Result<Option<Block>, EngineError> {
        let done = self.seq.len();
        let n = self.prefill_left().min(max_tokens.max(1));
        if n == 0 {
            return Ok(None);
        }
        let tokens = self.tokens[done..done + n].to_vec();
        Ok(Some(Block::chain(tokens, done)?.last_logits_only()))
    }

    /// Keeps the `n` staged rows of a prefill chunk.
    pub(crate) fn commit_prefill(&mut self, n: usize) -> Result<(), EngineError> {
        self.seq.commit(&(0..n).collect::<Vec<_>>())?;
        Ok(())
    }

    /// Context tokens whose KV is computed (kept from a cache or
    /// prefilled so far).
    pub fn prefilled(&self) -> usize {
        self.seq.len()
    }

    /// The KV of committed context tokens `start..start + n`, for a
    /// prefix cache ([`specmesh_model::Sequence::export`]'s layout).
    pub fn export_kv(&self, start: usize, n: usize) -> Result<Vec<u8>, EngineError> {
        Ok(self.seq.export(start, n)?)
    }

    /// Bytes one token's exported KV takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.seq.bytes_per_token()
    }

    /// Takes KV another sequence of the same model computed for this
    /// session's next context tokens (a cached prefix) instead of
    /// prefilling them; returns the tokens taken. The caller vouches that
    /// `data` is the KV of exactly those tokens at those positions (a
    /// prefix cache keys it by every token before and in it). Never past
    /// the prefill: the last context token is the first tree's root.
    pub fn import_kv(&mut self, data: &[u8]) -> Result<usize, EngineError> {
        let per = self.seq.bytes_per_token().max(1);
        let n = data.len() / per;
        if n > self.prefill_left() {
            return Err(EngineError::Model(
                specmesh_model::ModelError::InvalidCommit(format!(
                    "importing {n} tokens of KV past the prefill ({} left)",
                    self.prefill_left()
                )),
            ));
        }
        self.seq.import(data)?;
        Ok(n)
    }

    /// Prompt then output; the last token is the next tree's root.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    pub fn root(&self) -> u32 {
        *self.tokens.last().expect("a session is never empty")
    }

    /// Output tokens committed by this session.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// The output position of the token after the root: the key of its
    /// random draw, so a resumed session samples as an uninterrupted one.
    pub fn position(&self) -> u64 {
        (self.tokens.len() - self.prompt_len) as u64
    }

    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn kv_bytes(&self) -> usize {
        self.seq.kv_bytes()
    }

    /// Gives the KV cache back (to keep it for a later turn) with the tokens
    /// it holds.
    pub fn into_cache(self) -> (Sequence, Vec<u32>) {
        let mut tokens = self.tokens;
        tokens.truncate(self.seq.len());
        (self.seq, tokens)
    }

    /// Most drafted tokens a tree may have without overflowing the context.
    pub fn room(&self, model: &Model) -> usize {
        model.config().max_context.saturating_sub(self.tokens.len())
    }

    /// `tree` fitted to the output's grammar (`None` without one): at most
    /// [`MAX_GRAFTED`] forced nodes, within the context's room.
    pub(crate) fn fit(
        &mut self,
        tree: &TokenTree,
        model: &Model,
    ) -> Result<Option<Constrained>, EngineError> {
        let room = self.room(model).saturating_sub(tree.draft_len());
        if self.finish.is_some() || tree.root_token() != self.root() {
            // Refused by `block`, with its own message.
            return Ok(None);
        }
        let Some(c) = self.constraint.as_deref_mut() else {
            return Ok(None);
        };
        let fitted = constrain(tree, c, MAX_GRAFTED.min(room))
            .map_err(specmesh_verify::VerifyError::from)?;
        Ok(Some(fitted))
    }

    pub(crate) fn block(&self, tree: &TokenTree, model: &Model) -> Result<Block, EngineError> {
        if self.finish.is_some() {
            return Err(EngineError::Finished);
        }
        if tree.root_token() != self.root() {
            return Err(EngineError::RootMismatch {
                tree: tree.root_token(),
                session: self.root(),
            });
        }
        let max = model.config().max_context;
        if self.seq.len() + tree.len() > max {
            return Err(EngineError::ContextFull {
                tokens: self.tokens.len(),
                tree: tree.draft_len(),
                max,
            });
        }
        Ok(Block::tree(
            tree.tokens().to_vec(),
            tree.parent_list(),
            self.seq.len(),
        )?)
    }

    /// Commits the verified path of the tree the forward ran (the one
    /// given, of `drafted` drafted nodes, or that tree fitted to the
    /// grammar, `origin` mapping its nodes back to the given one) and
    /// applies the stop rules.
    pub(crate) fn apply(
        &mut self,
        origin: Option<&[Option<usize>]>,
        drafted: usize,
        mut v: Verification,
    ) -> Result<Step, EngineError> {
        self.seq.commit(&v.path)?;
        let mut accepted = v.accepted_len();
        let mut forced = 0;
        if let Some(origin) = origin {
            forced = v.path[1..].iter().filter(|&&n| origin[n].is_none()).count();
            accepted -= forced;
            // The callers read the path against the tree they gave.
            let keep = v.path.iter().take_while(|&&n| origin[n].is_some()).count();
            v.path.truncate(keep);
            v.top_k.truncate(keep);
            for n in &mut v.path {
                *n = origin[*n].expect("kept nodes have an origin");
            }
        }
        let mut committed = v.committed();
        let mut logprobs = std::mem::take(&mut v.logprobs);
        let mut finish = None;
        if let Some(i) = committed.iter().position(|t| self.limits.eos.contains(t)) {
            committed.truncate(i);
            finish = Some(Finish::Eos);
        }
        let left = self.limits.max_new_tokens.saturating_sub(self.generated);
        if committed.len() >= left {
            committed.truncate(left);
            finish = finish.or(Some(Finish::Length));
        }
        logprobs.truncate(committed.len());
        // The cache must hold exactly the committed tokens but the last.
        self.tokens.extend_from_slice(&committed);
        self.generated += committed.len();
        self.seq.truncate(self.tokens.len() - 1);
        self.finish = finish;
        Ok(Step {
            committed,
            drafted,
            accepted,
            forced,
            logprobs,
            verification: v,
            finish,
        })
    }
}
