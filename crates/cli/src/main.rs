//! `specmesh`: the project's command line. The benchmark subcommands
//! (`bench`, `bench-serve`, `bench-model`, `accept`, `bench-draft`) live in
//! `specmesh-bench`; this binary only wires them in.

#![forbid(unsafe_code)]

mod commands;

use clap::{Parser, Subcommand};
use specmesh_bench as bench;

#[derive(Parser)]
#[command(
    name = "specmesh",
    version,
    about = "Distributed speculative decoding for LLM serving"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Manage model files.
    #[command(subcommand)]
    Model(commands::fetch::ModelCommand),
    /// Make API keys for the gateway's --api-keys file.
    #[command(subcommand)]
    ApiKey(commands::api_key::ApiKeyCommand),
    /// Generate text: in this process (--local) or through a gateway.
    Generate(commands::generate::Args),
    /// Run the whole system on loopback (verifier, drafter, gateway as
    /// separate processes) until Ctrl-C.
    Up(commands::up::Args),
    /// Print the token ids (and pieces) of a text.
    Tokenize(commands::tokenize::Args),
    /// Rank a model's tokens by how often its answers use them, for the
    /// drafter's cheaper head (`--draft-head-tokens`).
    TokenRanking(commands::token_ranking::Args),
    /// Spec-Bench through the gateway: speculation against plain decoding,
    /// interleaved, with an identity check of every greedy output.
    Bench(bench::bench::Args),
    /// Open-loop serving benchmark: requests arriving at given rates
    /// (Poisson or gamma), speculation off against auto, with TTFT, TPOT,
    /// ITL, end-to-end latency and goodput, over gRPC or the HTTP front.
    BenchServe(bench::serve::Args),
    /// Measure the model runtime: prefill, decode and the verify cost curve.
    BenchModel(bench::bench_model::Args),
    /// Score the drafters offline: tokens per verify step (τ) per Spec-Bench
    /// category, replayed against recorded greedy outputs.
    Accept(bench::accept::Args),
    /// Measure drafting and verification per call: each drafter's propose
    /// at a long context, and verifying a 64-node tree on real logits.
    BenchDraft(bench::bench_draft::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Model(c) => commands::fetch::run(c),
        Command::ApiKey(c) => commands::api_key::run(c),
        Command::Generate(a) => commands::generate::run(a),
        Command::Up(a) => commands::up::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::TokenRanking(a) => commands::token_ranking::run(a),
        Command::BenchModel(a) => bench::bench_model::run(a),
        Command::Bench(a) => bench::bench::run(a),
        Command::BenchServe(a) => bench::serve::run(a),
        Command::Accept(a) => bench::accept::run(a),
        Command::BenchDraft(a) => bench::bench_draft::run(a),
    };
    if let Err(e) = result {
        // One line a user can act on; the chain gives the cause.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
