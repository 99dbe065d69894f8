//! One generation on the target: KV cache, committed tokens, stop rules.

use std::time::Instant;

use specmesh_model::{Block, Model, Sequence};
use specmesh_sampling::SamplingParams;
use specmesh_tree::TokenTree;
use specmesh_verify::{RowMajor, Verification, verify};

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

/// The outcome of one verify step for one session.
#[derive(Clone, Debug)]
pub struct Step {
    /// Tokens committed by this step (EOS and anything past a limit cut).
    pub committed: Vec<u32>,
    /// Drafted nodes in the tree.
    pub drafted: usize,
    /// Drafted tokens accepted (before cutting at a limit).
    pub accepted: usize,
    pub verification: Verification,
    /// Set when this step ended the session.
    pub finish: Option<Finish>,
}

/// A generation on the target model.
#[derive(Debug)]
pub struct Session {
    seq: Sequence,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Output tokens generated before this session (a resumed session keeps
    /// counting sampling positions from there).
    generated: usize,
    params: SamplingParams,
    limits: SessionLimits,
    finish: Option<Finish>,
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
        })
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
        let done = self.seq.len();
        let target = self.tokens.len() - 1;
        let end = target.min(done.saturating_add(max_tokens.max(1)));
        if done < end {
            let block = Block::chain(self.tokens[done..end].to_vec(), done)?.last_logits_only();
            model.forward(&mut self.seq, &block)?;
            self.seq.commit(&(0..end - done).collect::<Vec<_>>())?;
        }
        Ok(end >= target)
    }

    /// Context tokens whose KV is computed (kept from a cache or
    /// prefilled so far).
    pub fn prefilled(&self) -> usize {
        self.seq.len()
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

    fn block(&self, tree: &TokenTree, model: &Model) -> Result<Block, EngineError> {
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

    fn apply(&mut self, tree: &TokenTree, v: Verification) -> Result<Step, EngineError> {
        self.seq.commit(&v.path)?;
        let accepted = v.accepted_len();
        let mut committed = v.committed();
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
        // The cache must hold exactly the committed tokens but the last.
        self.tokens.extend_from_slice(&committed);
        self.generated += committed.len();
        self.seq.truncate(self.tokens.len() - 1);
        self.finish = finish;
        Ok(Step {
            committed,
            drafted: tree.draft_len(),
            accepted,
            verification: v,
            finish,
        })
    }
}

/// Verifies one tree per session in one batched forward and commits each
/// accepted path. `top_k` target tokens per path node are returned for
/// token recycling. A failure leaves every session as it was.
pub fn step_batch(
    model: &Model,
    items: &mut [(&mut Session, &TokenTree)],
    top_k: usize,
) -> Result<Vec<Step>, EngineError> {
    step_batch_timed(model, items, top_k).map(|(steps, _)| steps)
}

/// Where a batched step's time went, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchTimes {
    /// The batched forward (every session's block).
    pub forward: f64,
    /// Sampling and acceptance: every tree's verification against its
    /// logits (and the top-k rows for token recycling).
    pub verify: f64,
    /// Committing the accepted paths into the KV caches and applying the
    /// stop rules.
    pub commit: f64,
}

/// [`step_batch`], with where its time went.
pub fn step_batch_timed(
    model: &Model,
    items: &mut [(&mut Session, &TokenTree)],
    top_k: usize,
) -> Result<(Vec<Step>, BatchTimes), EngineError> {
    let t0 = Instant::now();
    let blocks = items
        .iter()
        .map(|(s, t)| s.block(t, model))
        .collect::<Result<Vec<_>, _>>()?;
    let logits = {
        let mut batch: Vec<(&mut Sequence, &Block)> = items
            .iter_mut()
            .zip(&blocks)
            .map(|((s, _), b)| (&mut s.seq, b))
            .collect();
        model.forward_batch(&mut batch)?
    };
    let t1 = Instant::now();
    let mut verdicts = Vec::with_capacity(items.len());
    for ((s, t), l) in items.iter().zip(&logits) {
        let rows = RowMajor::new(l.as_slice(), l.vocab())?;
        match verify(t, &rows, &s.params, s.position(), top_k) {
            Ok(v) => verdicts.push(v),
            Err(e) => {
                for (s, _) in items.iter_mut() {
                    s.seq.discard();
                }
                return Err(e.into());
            }
        }
    }
    let t2 = Instant::now();
    let steps = items
        .iter_mut()
        .zip(verdicts)
        .map(|((s, t), v)| s.apply(t, v))
        .collect::<Result<Vec<_>, _>>()?;
    let times = BatchTimes {
        forward: (t1 - t0).as_secs_f64(),
        verify: (t2 - t1).as_secs_f64(),
        commit: t2.elapsed().as_secs_f64(),
    };
    Ok((steps, times))
}
