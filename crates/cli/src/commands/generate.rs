//! `specmesh generate --local`: plain (non-speculative) decoding in-process,
//! the reference every speculative path must reproduce.

use std::io::Write;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use specmesh_engine::plain::decode;
use specmesh_harness::model::ModelArgs;
use specmesh_harness::prompt::encode_prompt;
use specmesh_sampling::SamplingParams;

#[derive(clap::Args)]
pub struct Args {
    /// Run the model in this process with plain decoding.
    #[arg(long, conflicts_with = "gateway")]
    local: bool,
    /// Generate through the gateway at this URL (e.g. http://127.0.0.1:50051).
    #[arg(long, env = "SPECMESH_GATEWAY")]
    gateway: Option<String>,
    /// With --gateway: the API key to send (`authorization: Bearer KEY`).
    #[arg(
        long,
        env = "SPECMESH_API_KEY",
        requires = "gateway",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// With --gateway: connect over TLS, trusting this CA file (PEM).
    #[arg(long, requires = "gateway")]
    tls_ca: Option<std::path::PathBuf>,
    /// With --tls-ca: the name the gateway's certificate carries (default:
    /// the URL's host).
    #[arg(long, requires = "tls_ca")]
    tls_name: Option<String>,
    /// With --gateway: stream tokens as they are committed.
    #[arg(long, requires = "gateway")]
    stream: bool,
    /// With --gateway: plain decoding, no speculation (`--speculation off`).
    #[arg(long, requires = "gateway", conflicts_with = "speculation")]
    no_speculation: bool,
    /// With --gateway: what to draft with (auto lets the drafter's policy
    /// choose; draft-model and combined need `specmesh-drafter --draft-model`).
    #[arg(long, value_enum, requires = "gateway", default_value_t = Speculation::Auto)]
    speculation: Speculation,
    /// With --gateway: the output you expect, or most of it (e.g. the code
    /// an edit rewrites): drafts for the request without changing its output.
    #[arg(long, requires = "gateway", conflicts_with = "prediction_file")]
    prediction: Option<String>,
    /// With --gateway: --prediction read from this file.
    #[arg(long, requires = "gateway")]
    prediction_file: Option<std::path::PathBuf>,
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
            speculation: if args.no_speculation {
                specmesh_proto::v1::SpeculationMode::Off
            } else {
                args.speculation.mode()
            },
            stream: args.stream,
            json: args.json,
            prediction: match (&args.prediction, &args.prediction_file) {
                (Some(p), _) => p.clone(),
                (None, Some(path)) => std::fs::read_to_string(path)
                    .with_context(|| format!("reading `--prediction-file` {}", path.display()))?,
                (None, None) => String::new(),
            },
        };
        let connection = crate::commands::client::Connection {
            url: url.clone(),
            api_key: args.api_key.clone(),
            tls_ca: args.tls_ca.clone(),
            tls_name: args.tls_name.clone(),
        };
        return crate::commands::client::run(&connection, ask);
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
            finish_reason: generation.finish.name(),
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
            generation.finish.name(),
            generation.prefill_seconds * 1e3,
            generation.tokens.len().saturating_sub(1) as f64 / generation.decode_seconds.max(1e-9),
        );
    }
    Ok(())
}

/// `--speculation`: the request's `SpeculationMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Speculation {
    Auto,
    Off,
    ModelFree,
    DraftModel,
    Combined,
}

impl Speculation {
    pub fn mode(self) -> specmesh_proto::v1::SpeculationMode {
        use specmesh_proto::v1::SpeculationMode as M;
        match self {
            Speculation::Auto => M::Unspecified,
            Speculation::Off => M::Off,
            Speculation::ModelFree => M::ModelFree,
            Speculation::DraftModel => M::DraftModel,
            Speculation::Combined => M::Combined,
        }
    }
}
