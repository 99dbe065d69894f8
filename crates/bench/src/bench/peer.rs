//! llama.cpp as a peer on the same machine: its own `llama-server`, built
//! natively by `tools/bench/setup.sh`, one server process per peer
//! configuration (plain decoding, its model-free speculation types, its
//! draft-model speculation and their mixes: [`PeerSpec`]), driven over
//! HTTP so its runs interleave with ours prompt by prompt.
//!
//! The peer gets the exact prompt token ids the gateway decodes (our chat
//! template and tokenizer, sent as a token array to `/completion`), the same
//! threads and greedy decoding; only the decoder differs. Its numbers come
//! from the server's own `timings` (decode time, drafted and accepted
//! tokens), not from our clock.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Deserialize;
use specmesh_harness::prompt::encode_prompt;

use super::{Config, Run};
use crate::llama_cpp::server::{Server, Slots};
use crate::llama_cpp::spec::PeerSpec;
use crate::specbench::Question;

/// The context of the bench's one slot: the longest Spec-Bench prompt and
/// its answer.
const CONTEXT: usize = 8192;

/// One `llama-server` process serving one configuration, one request at a
/// time.
pub struct Peer {
    pub server: Server,
    agent: ureq::Agent,
    tokenizer: specmesh_tokenizer::Tokenizer,
}

#[derive(Deserialize)]
struct Completion {
    tokens: Vec<u32>,
    timings: Timings,
}

#[derive(Deserialize)]
struct Timings {
    prompt_ms: f64,
    predicted_n: u32,
    predicted_ms: f64,
    #[serde(default)]
    draft_n: u32,
    #[serde(default)]
    draft_n_accepted: u32,
}

impl Peer {
    /// Starts `llama-server` with one slot (the bench sends one request at
    /// a time, and n slots would split the KV cache n ways).
    pub fn start(
        bin_dir: &Path,
        model: &Path,
        threads: usize,
        tokenizer: specmesh_tokenizer::Tokenizer,
        spec: &PeerSpec,
    ) -> Result<Peer> {
        let slots = Slots {
            parallel: 1,
            context: CONTEXT,
        };
        Ok(Peer {
            server: Server::start(bin_dir, model, threads, spec, slots)?,
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(600)))
                .build()
                .into(),
            tokenizer,
        })
    }

    pub fn run(&mut self, q: &Question, config: Config, max_new: u32) -> Result<Run> {
        let prompt = encode_prompt(&self.tokenizer, q.prompt(), true)?;
        let body = serde_json::json!({
            "prompt": prompt,
            "n_predict": max_new,
            "temperature": 0.0,
            "top_k": 1,
            "seed": 0,
            "cache_prompt": false,
            "return_tokens": true,
        });
        let t = Instant::now();
        let reply: Completion = self
            .agent
            .post(format!("{}/completion", self.server.url))
            .send_json(&body)
            .with_context(|| format!("llama-server on {} ({})", q.id(), config.name()))?
            .body_mut()
            .read_json()
            .context("reading llama-server's answer")?;
        let wall = t.elapsed().as_secs_f64();
        let tm = &reply.timings;
        // Each target forward after the prompt yields its accepted drafts
        // plus one token of its own.
        let steps = tm.predicted_n.saturating_sub(tm.draft_n_accepted);
        Ok(Run {
            question: q.id(),
            category: q.category.clone(),
            config,
            completion_tokens: reply.tokens.len(),
            tokens: reply.tokens,
            wall_seconds: wall,
            decode_seconds: tm.predicted_ms / 1e3,
            ttft_seconds: tm.prompt_ms / 1e3,
            inter_token_seconds: Vec::new(),
            verify_steps: steps,
            drafted_tokens: tm.draft_n,
            accepted_tokens: tm.draft_n_accepted,
            tree_wait_seconds: 0.0,
            drafted_ahead_steps: 0,
        })
    }
}
