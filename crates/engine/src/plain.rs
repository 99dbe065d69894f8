//! Plain (non-speculative) decoding in-process: one target forward per
//! token. The reference every speculative path must reproduce, and what
//! `specmesh generate --local`, `specmesh token-ranking` and the benchmarks'
//! runtime measurements run.

use std::time::Instant;

use specmesh_model::{Block, Logits, Model, Sequence};
use specmesh_sampling::SamplingParams;

use crate::EngineError;
use crate::session::Finish;

/// What [`decode`] produced.
#[derive(Clone, Debug)]
pub struct Decoded {
    /// The new tokens (the EOS that ended them not included).
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// Plain decoding of `prompt`: at most `max_new_tokens` tokens sampled
/// with `params`, each handed to `on_token` as it is chosen. An EOS token
/// ends generation and is not part of the output; an error of `on_token`
/// (a closed pipe, say) ends it too and is returned.
pub fn decode<E: From<EngineError>>(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    max_new_tokens: usize,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<(), E>,
) -> Result<Decoded, E> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyContext.into());
    }
    let mut seq = model.new_sequence();
    let t0 = Instant::now();
    let mut logits = prefill(model, &mut seq, prompt)?;
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut tokens = Vec::with_capacity(max_new_tokens);
    let mut finish = Finish::Length;
    while tokens.len() < max_new_tokens {
        let last = logits.row(logits.rows() - 1);
        let next = specmesh_sampling::sample(last, params, tokens.len() as u64);
        if eos.contains(&next) {
            finish = Finish::Eos;
            break;
        }
        tokens.push(next);
        on_token(next)?;
        if tokens.len() == max_new_tokens {
            break;
        }
        logits = step(model, &mut seq, next)?;
    }
    Ok(Decoded {
        tokens,
        finish,
        prefill_seconds,
        decode_seconds: t1.elapsed().as_secs_f64(),
    })
}

/// Greedy decoding of many prompts at once: each step is one batched
/// forward over every unfinished prompt's last token, so the weights are
/// read once per step for all of them. Returns each prompt's new tokens
/// (EOS ends a prompt and is not included).
pub fn greedy_batch(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    eos: &[u32],
) -> Result<Vec<Vec<u32>>, EngineError> {
    let mut seqs = Vec::with_capacity(prompts.len());
    let mut next = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        if prompt.is_empty() {
            return Err(EngineError::EmptyContext);
        }
        let mut seq = model.new_sequence();
        let logits = prefill(model, &mut seq, prompt)?;
        next.push(logits.argmax(logits.rows() - 1));
        seqs.push(seq);
    }
    let mut out = vec![Vec::with_capacity(max_new_tokens); prompts.len()];
    let mut live: Vec<usize> = (0..prompts.len()).collect();
    while !live.is_empty() {
        live.retain(|&i| {
            let done = eos.contains(&next[i]) || out[i].len() == max_new_tokens;
            if !done {
                out[i].push(next[i]);
            }
            !done && out[i].len() < max_new_tokens
        });
        if live.is_empty() {
            break;
        }
        let blocks = live
            .iter()
            .map(|&i| Block::chain(vec![next[i]], seqs[i].len()))
            .collect::<Result<Vec<_>, _>>()?;
        // `live` stays in increasing order (`retain` keeps it), so the live
        // sequences, in order, pair with their blocks.
        let mut items: Vec<(&mut Sequence, &Block)> = seqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| live.binary_search(i).is_ok())
            .map(|(_, seq)| seq)
            .zip(&blocks)
            .collect();
        let logits = model.forward_batch(&mut items)?;
        drop(items);
        for (&i, l) in live.iter().zip(&logits) {
            seqs[i].commit(&[0])?;
            next[i] = l.argmax(0);
        }
    }
    Ok(out)
}

/// Computes the KV of `prompt` into `seq`; the logits are its last
/// position's.
fn prefill(model: &Model, seq: &mut Sequence, prompt: &[u32]) -> Result<Logits, EngineError> {
    let block = Block::chain(prompt.to_vec(), 0)?.last_logits_only();
    let logits = model.forward(seq, &block)?;
    seq.commit(&(0..prompt.len()).collect::<Vec<_>>())?;
    Ok(logits)
}

/// One token on top of `seq`: its logits.
fn step(model: &Model, seq: &mut Sequence, token: u32) -> Result<Logits, EngineError> {
    let block = Block::chain(vec![token], seq.len())?;
    let logits = model.forward(seq, &block)?;
    seq.commit(&[0])?;
    Ok(logits)
}
