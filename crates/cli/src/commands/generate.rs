//! `specmesh generate --local`: plain (non-speculative) decoding in-process,
//! the reference every speculative path must reproduce.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use specmesh_model::{Block, Model};
use specmesh_sampling::SamplingParams;
use specmesh_tokenizer::{ChatMessage, Tokenizer};

use crate::local::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Run the model in this process with plain decoding.
    #[arg(long, conflicts_with = "gateway")]
    local: bool,
    /// Generate through the gateway at this URL (e.g. http://127.0.0.1:50051).
    #[arg(long, env = "SPECMESH_GATEWAY")]
    gateway: Option<String>,
    /// With --gateway: stream tokens as they are committed.
    #[arg(long, requires = "gateway")]
    stream: bool,
    /// With --gateway: plain decoding, no speculation.
    #[arg(long, requires = "gateway")]
    no_speculation: bool,
    #[command(flatten)]
    model: ModelArgs,
    /// Apply the model's chat template to PROMPT as one user message.
    #[arg(long)]
    chat: bool,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling mass, in (0, 1].
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed of the sampler (same seed, same output).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// The prompt.
    prompt: String,
}

#[derive(Serialize)]
struct Output {
    text: String,
    token_ids: Vec<u32>,
    prompt_tokens: usize,
    completion_tokens: usize,
    finish_reason: &'static str,
    prefill_seconds: f64,
    decode_seconds: f64,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(url) = &args.gateway {
        let top_k = u32::try_from(args.top_k).context("`--top-k` is too large")?;
        let ask = crate::commands::client::Ask {
            prompt: args.prompt.clone(),
            chat: args.chat,
            max_new_tokens: u32::try_from(args.max_new_tokens)
                .context("`--max-new-tokens` is too large")?,
            sampling: specmesh_proto::v1::SamplingParams {
                temperature: args.temperature,
                top_p: args.top_p,
                top_k,
                seed: args.seed,
            },
            no_speculation: args.no_speculation,
            stream: args.stream,
            json: args.json,
        };
        return crate::commands::client::run(url, ask);
    }
    if !args.local {
        bail!("pass --local (run the model in this process) or --gateway URL");
    }
    if args.max_new_tokens == 0 {
        bail!("`--max-new-tokens` must be >= 1");
    }
    let params = SamplingParams::new(args.temperature, args.top_p, args.top_k, args.seed)?;
    if args.prompt.is_empty() {
        bail!("the prompt is empty: pass the text to continue as PROMPT");
    }
    // The model before the tokenizer: the model loader tells a missing, a
    // non-GGUF and a truncated file apart; the tokenizer only sees a bad header.
    let model = args.model.load_model()?;
    let tokenizer = args.model.load_tokenizer()?;
    let prompt_ids = encode_prompt(&tokenizer, &args.prompt, args.chat)?;
    let max_ctx = model.config().max_context;
    if prompt_ids.len() + args.max_new_tokens > max_ctx {
        bail!(
            "the prompt ({} tokens) + `--max-new-tokens` ({}) exceed the model's context of {max_ctx} tokens",
            prompt_ids.len(),
            args.max_new_tokens
        );
    }

    let stdout = std::io::stdout();
    let mut detok = tokenizer.incremental_decoder();
    let mut on_token = |id: u32| -> Result<()> {
        if !args.json
            && let Some(text) = detok.push(id)?
        {
            let mut out = stdout.lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
        Ok(())
    };
    let generation = decode(
        &model,
        &prompt_ids,
        &params,
        args.max_new_tokens,
        tokenizer.eos_token_ids(),
        &mut on_token,
    )?;
    let text = tokenizer.decode(&generation.tokens, true)?;
    if args.json {
        let out = Output {
            text,
            completion_tokens: generation.tokens.len(),
            token_ids: generation.tokens,
            prompt_tokens: prompt_ids.len(),
            finish_reason: generation.finish_reason,
            prefill_seconds: generation.prefill_seconds,
            decode_seconds: generation.decode_seconds,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        print!("{}", detok.finish());
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {}, prefill {:.1} ms, decode {:.1} tok/s]",
            prompt_ids.len(),
            generation.tokens.len(),
            generation.finish_reason,
            generation.prefill_seconds * 1e3,
            generation.tokens.len().saturating_sub(1) as f64 / generation.decode_seconds.max(1e-9),
        );
    }
    Ok(())
}

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
