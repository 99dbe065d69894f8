//! Batched verify steps: one forward for the trees of many sessions, and
//! optionally one chunk of another session's prefill riding in the same
//! forward (every weight block is then read once for both, instead of once
//! per forward: on a memory-bound target the chunk costs little more than
//! its arithmetic).

use std::time::Instant;

use specmesh_model::{Block, Model, Sequence};
use specmesh_tree::TokenTree;
use specmesh_verify::{Constraint, Extras, RowMajor, verify_with};

use crate::EngineError;
use crate::session::{Session, Step};

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
    let fused = step_batch_fused(model, items, None, top_k)?;
    Ok((fused.steps, fused.times))
}

/// A chunk of one session's prefill to run in a batched step's forward.
#[derive(Debug)]
pub struct PrefillChunk<'a> {
    pub session: &'a mut Session,
    /// Context tokens to compute, at most (at least one is).
    pub max_tokens: usize,
}

/// What [`step_batch_fused`] did.
#[derive(Debug)]
pub struct FusedStep {
    /// One per tree, in input order.
    pub steps: Vec<Step>,
    pub times: BatchTimes,
    /// Context tokens the prefill chunk computed (0 without one).
    pub prefilled: usize,
}

/// [`step_batch_timed`] with a prefill chunk of another session in the
/// same forward. Rows are computed independently of their batch, so the
/// chunk's KV and every tree's logits are the same, bit for bit, as in
/// separate forwards. A failure leaves every session, the prefilling one
/// included, as it was.
pub fn step_batch_fused(
    model: &Model,
    items: &mut [(&mut Session, &TokenTree)],
    prefill: Option<PrefillChunk<'_>>,
    top_k: usize,
) -> Result<FusedStep, EngineError> {
    let t0 = Instant::now();
    // Trees of constrained sessions, fitted to their grammars: what the
    // grammar forbids cut, what it forces grafted.
    let fitted = items
        .iter_mut()
        .map(|(s, t)| s.fit(t, model))
        .collect::<Result<Vec<_>, _>>()?;
    let trees: Vec<&TokenTree> = items
        .iter()
        .zip(&fitted)
        .map(|((_, t), f)| f.as_ref().map_or(*t, |f| &f.tree))
        .collect();
    let blocks = items
        .iter()
        .zip(&trees)
        .map(|((s, _), t)| s.block(t, model))
        .collect::<Result<Vec<_>, _>>()?;
    let mut prefill = match prefill {
        Some(c) => c
            .session
            .prefill_block(c.max_tokens)?
            .map(|block| (c.session, block)),
        None => None,
    };
    let logits = {
        let mut batch: Vec<(&mut Sequence, &Block)> = items
            .iter_mut()
            .zip(&blocks)
            .map(|((s, _), b)| (&mut s.seq, b))
            .collect();
        if let Some((s, b)) = prefill.as_mut() {
            batch.push((&mut s.seq, &*b));
        }
        model.forward_batch(&mut batch)?
    };
    let t1 = Instant::now();
    let mut verdicts: Vec<specmesh_verify::Verification> = Vec::with_capacity(items.len());
    for ((((s, _), t), l), f) in items.iter_mut().zip(&trees).zip(&logits).zip(&fitted) {
        let position = s.position();
        let s: &mut Session = s;
        let verdict = RowMajor::new(l.as_slice(), l.vocab()).and_then(|rows| {
            let extras = Extras {
                constraint: s
                    .constraint
                    .as_mut()
                    .map(|c| &mut **c as &mut dyn Constraint),
                logprobs: s.logprobs,
                rejections: f.as_ref().map_or(&[], |f| f.rejections.as_slice()),
            };
            verify_with(t, &rows, &s.params, position, top_k, extras)
        });
        match verdict {
            Ok(v) => verdicts.push(v),
            Err(e) => {
                // Every session as it was: the grammars verified so far
                // went past their paths (a failed one rolled itself back).
                for ((s, _), v) in items.iter_mut().zip(&verdicts) {
                    if let Some(c) = s.constraint.as_deref_mut() {
                        let _ = c.rollback(v.path.len());
                    }
                }
                for (s, _) in items.iter_mut() {
                    s.seq.discard();
                }
                if let Some((s, _)) = prefill.as_mut() {
                    s.seq.discard();
                }
                return Err(e.into());
            }
        }
    }
    let t2 = Instant::now();
    let prefilled = match prefill {
        Some((s, b)) => {
            s.commit_prefill(b.len())?;
            b.len()
        }
        None => 0,
    };
    let steps = items
        .iter_mut()
        .zip(verdicts)
        .zip(&fitted)
        .map(|(((s, t), v), f)| {
            let origin = f.as_ref().map(|f| f.origin.as_slice());
            s.apply(origin, t.draft_len(), v)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let times = BatchTimes {
        forward: (t1 - t0).as_secs_f64(),
        verify: (t2 - t1).as_secs_f64(),
        commit: t2.elapsed().as_secs_f64(),
    };
    Ok(FusedStep {
        steps,
        times,
        prefilled,
    })
}
