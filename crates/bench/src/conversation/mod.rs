//! The conversation workload of `specmesh bench-serve --conversations N`
//! and `specmesh bench --conversations N`: multi-turn conversations
//! ([`build`]: a shared system prompt of tool descriptions, documents,
//! follow-ups, a code file to edit), every turn resending the whole
//! history as OpenAI clients do, over our gRPC API without and with a
//! `session_id` and over the OpenAI front, and to llama.cpp's
//! `llama-server` (prompt cache on, its default) in the same run
//! ([`drive`]). It reports time to first token on the first turn and on
//! the later ones, the whole pass's time and the share of prompt tokens
//! each server said it served from a cache, ours against llama.cpp's
//! fastest, and fails when any of our greedy answers differs between APIs,
//! sessions or concurrencies ([`report`]).
//!
//! Passes run by concurrency level, then repetition, then target, so
//! drift hits every target alike. Each pass has tenants and session ids of
//! its own, and llama.cpp a freshly started server, so no pass finds
//! another's warm cache.

mod build;
pub mod command;
pub mod drive;
mod oracle;
mod report;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use crate::client::Mode;
use crate::specbench;
pub use drive::{Api, PeerLaunch, Target};

/// The conversation workload's flags, the same in `bench` and
/// `bench-serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ConversationArgs {
    /// Run N multi-turn conversations (a shared system prompt of tool
    /// descriptions, a document with a question, follow-ups, a document to
    /// summarize, a code file to edit; the whole history resent each turn)
    /// instead of one-shot prompts. Their material comes from
    /// --conversation-questions and --conversation-code (--questions and
    /// its selection are the one-shot prompts').
    #[arg(long, default_value_t = 0)]
    pub conversations: usize,
    /// User turns per conversation, 1 to 5 (the first N of the above).
    #[arg(long, default_value_t = 5)]
    pub turns: usize,
    /// Conversations in flight at once, one pass per level, e.g. `1,4`.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub conversation_concurrency: Vec<usize>,
    /// Spread the conversations over this many tenants (conversation i is
    /// tenant i mod K's); each pass has tenants of its own.
    #[arg(long, default_value_t = 1)]
    pub tenants: usize,
    /// Which of our APIs the conversations go over (default: every one the
    /// gateway offers): grpc (no session id), grpc-session (a session_id
    /// per conversation), http (the OpenAI front).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub apis: Vec<Api>,
    /// The Spec-Bench file the documents and follow-ups come from.
    #[arg(long, default_value_os_t = specbench::default_path())]
    pub conversation_questions: PathBuf,
    /// The code file the code edits come from.
    #[arg(long, default_value_os_t = specbench::default_code_path())]
    pub conversation_code: PathBuf,
    /// Our speculation in the conversations: auto (the drafters choose),
    /// draft-model (the draft model alone: what its KV cache by prefix
    /// saves), off.
    #[arg(long, value_enum, default_value = "auto")]
    pub conversation_speculation: Mode,
}

impl ConversationArgs {
    pub fn enabled(&self) -> bool {
        self.conversations > 0
    }

    /// Checks the flags before anything starts.
    pub fn check(&self) -> Result<()> {
        let most = build::TURN_KINDS.len();
        ensure!(
            (1..=most).contains(&self.turns),
            "`--turns {}`: a conversation has 1 to {most} user turns",
            self.turns
        );
        ensure!(self.tenants >= 1, "`--tenants` must be >= 1");
        if let Some(&bad) = self
            .conversation_concurrency
            .iter()
            .find(|&&n| n == 0 || n > 256)
        {
            bail!("`--conversation-concurrency {bad}`: each level must be in 1..=256");
        }
        Ok(())
    }

    /// The APIs to send over, given which the gateway offers: the asked
    /// ones (each must be offered), else every offered one.
    pub fn apis(&self, grpc: bool, http: bool) -> Result<Vec<Api>> {
        let offered = |a: &Api| match a {
            Api::Grpc | Api::GrpcSession => grpc,
            Api::Http => http,
        };
        if self.apis.is_empty() {
            return Ok([Api::Grpc, Api::GrpcSession, Api::Http]
                .into_iter()
                .filter(offered)
                .collect());
        }
        if let Some(a) = self.apis.iter().find(|a| !offered(a)) {
            bail!(
                "`--apis` asks for {} but this run reaches no such front of the gateway",
                a.name()
            );
        }
        Ok(self.apis.clone())
    }
}

/// Every number of a conversation run, for `--json`.
pub struct Outcome {
    pub json: serde_json::Value,
    /// Our answers that differ between passes.
    pub mismatches: Vec<String>,
    /// Our conversations that failed, with why.
    pub failures: Vec<String>,
}

/// Runs the conversations against every target, by concurrency level,
/// repetition and target; prints the tables.
pub async fn run(
    args: &ConversationArgs,
    targets: &[Target],
    tokenizer: Option<&specmesh_tokenizer::Tokenizer>,
    max_new: u32,
    repeats: usize,
    run_id: &str,
) -> Result<Outcome> {
    let spec = specbench::read(&args.conversation_questions, "--conversation-questions")?;
    let code = specbench::read(&args.conversation_code, "--conversation-code")?;
    let conversations = Arc::new(build::conversations(
        &spec,
        &code,
        args.conversations,
        args.turns,
    )?);
    let peer_context = build::context_bound(&conversations, max_new);
    let mut passes = Vec::new();
    for &concurrency in &args.conversation_concurrency {
        for repeat in 1..=repeats.max(1) {
            for (i, target) in targets.iter().enumerate() {
                let plan = drive::Plan {
                    concurrency,
                    repeat,
                    max_new,
                    mode: args.conversation_speculation,
                    tenants: args.tenants,
                    tag: format!("{run_id}-conv-c{concurrency}-r{repeat}-{i}"),
                    peer_context,
                };
                let p = drive::pass(target, &conversations, &plan)
                    .await
                    .with_context(|| format!("starting {}", target.name()))?;
                eprintln!(
                    "conversations at concurrency {concurrency}, repeat {repeat}, {}: {} turns in {:.1} s{}",
                    p.target,
                    p.turns.len(),
                    p.duration_seconds,
                    p.failures.first().map_or(String::new(), |f| format!(
                        ", {} failed: {f}",
                        p.failures.len()
                    ))
                );
                if p.turns.is_empty()
                    && let Some(f) = p.failures.first()
                {
                    bail!("every conversation to {} failed; the first: {f}", p.target);
                }
                passes.push(p);
            }
        }
    }
    let rows: Vec<report::Row> = passes.iter().map(report::row).collect();
    // How much of what a prefix cache could reuse ours did, per pass.
    let mut reuse = Vec::new();
    if let Some(tokenizer) = tokenizer {
        for p in &passes {
            if let Some(r) = oracle::reuse(p, &conversations, args.tenants, tokenizer)? {
                reuse.push(r);
            }
        }
    }
    let versus = report::versus(&rows);
    let identity = report::identity(&passes, args.turns);
    // Ours must answer every turn: a failed conversation is a failure of
    // the run (the peer's are reported, and keep it out of the ratios).
    let failures: Vec<String> = passes
        .iter()
        .filter(|p| !p.peer)
        .flat_map(|p| p.failures.iter().map(move |f| format!("{}: {f}", p.target)))
        .collect();
    println!(
        "\n{} conversations of {} turns ({}), {max_new} new tokens per turn, {} tenant(s)",
        args.conversations,
        args.turns,
        build::TURN_KINDS[..args.turns].join(", "),
        args.tenants
    );
    print!("{}", report::table(&rows).text());
    if !versus.is_empty() {
        println!();
        print!("{}", report::versus_table(&versus).text());
    }
    if identity.peer_whole > 0 {
        println!(
            "llama.cpp's greedy answers equal ours on every turn in {} of {} conversations (its numerics differ)",
            identity.peer_equal, identity.peer_whole
        );
    }
    for r in &reuse {
        println!(
            "reuse, {} at concurrency {} (repeat {}): {} of {} reusable prompt tokens ({:.1}%; the oracle knows every verifier's cache)",
            r.target,
            r.concurrency,
            r.repeat,
            r.cached_tokens,
            r.reusable_tokens,
            100.0 * r.share
        );
    }
    if identity.compared_turns == 0 {
        println!("no identity check: one pass of ours answered each turn (add APIs or levels)");
    } else {
        println!(
            "greedy mismatches between our APIs, sessions, concurrencies and repetitions: {} of {} turns compared",
            identity.mismatches.len(),
            identity.compared_turns
        );
    }
    let json = json!({
        "conversations": args.conversations,
        "turns": args.turns,
        "tenants": args.tenants,
        "max_new_tokens": max_new,
        "system_prompt": build::SYSTEM_PROMPT,
        "rows": rows,
        "versus": versus,
        "reuse": reuse,
        "mismatches": identity.mismatches,
        "compared_turns": identity.compared_turns,
        "failures": failures,
        "peer_agreement": (identity.peer_whole > 0)
            .then_some(json!({"equal": identity.peer_equal, "of": identity.peer_whole})),
        "passes": passes,
    });
    Ok(Outcome {
        json,
        mismatches: identity.mismatches,
        failures,
    })
}
