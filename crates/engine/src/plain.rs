//! Prompt encoding and plain (non-speculative) decoding in-process: the
//! reference every speculative path must reproduce, shared by
//! `specmesh generate --local`, `specmesh tokenize` and the benchmarks.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use specmesh_model::{Block, Model};
use specmesh_sampling::SamplingParams;
use specmesh_tokenizer::{ChatMessage, Tokenizer};

/// The token ids of `prompt`, with the model's chat template applied to it
/// as one user message when `chat`.
pub fn encode_prompt(tokenizer: &Tokenizer, prompt: &str, chat: bool) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let ids = if chat {
        let rendered = tokenizer.apply_chat_template(
            &[ChatMessage {
                role: "user".into(),
                content: prompt.into(),
            }],
            true,
        )?;
        tokenizer.encode_for_model(&rendered)?
    } else {
        tokenizer.encode_for_model(prompt)?
    };
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    Ok(ids)
}

/// What [`decode`] produced.
#[derive(Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish_reason: &'static str,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// Plain decoding: one forward per token. The EOS token ends generation and
/// is not part of the output.
pub fn decode(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    max_new_tokens: usize,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    let mut seq = model.new_sequence();
    let t0 = Instant::now();
    let prefill = Block::chain(prompt.to_vec(), 0)?.last_logits_only();
    let mut logits = model.forward(&mut seq, &prefill).context("prefill")?;
    seq.commit(&(0..prompt.len()).collect::<Vec<_>>())?;
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut tokens = Vec::with_capacity(max_new_tokens);
    let mut finish_reason = "length";
    while tokens.len() < max_new_tokens {
        let next =
            specmesh_sampling::sample(logits.row(logits.rows() - 1), params, tokens.len() as u64);
        if eos.contains(&next) {
            finish_reason = "eos";
            break;
        }
        tokens.push(next);
        on_token(next)?;
        if tokens.len() == max_new_tokens {
            break;
        }
        let step = Block::chain(vec![next], seq.len())?;
        logits = model.forward(&mut seq, &step)?;
        seq.commit(&[0])?;
    }
    Ok(Generation {
        tokens,
        finish_reason,
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
) -> Result<Vec<Vec<u32>>> {
    let mut seqs = Vec::with_capacity(prompts.len());
    let mut next = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let mut seq = model.new_sequence();
        let block = Block::chain(prompt.clone(), 0)?.last_logits_only();
        let logits = model.forward(&mut seq, &block).context("prefill")?;
        seq.commit(&(0..prompt.len()).collect::<Vec<_>>())?;
        seqs.push(seq);
        next.push(logits.argmax(logits.rows() - 1));
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
        let mut items: Vec<(&mut specmesh_model::Sequence, &Block)> = seqs
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
