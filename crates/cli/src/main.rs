//! `specmesh`: the project's command line.

mod commands;
mod launch;
mod local;
mod specbench;

use clap::{Parser, Subcommand};

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
    /// Generate text: in this process (--local) or through a gateway.
    Generate(commands::generate::Args),
    /// Run the whole system on loopback (verifier, drafter, gateway as
    /// separate processes) until Ctrl-C.
    Up(commands::up::Args),
    /// Print the token ids (and pieces) of a text.
    Tokenize(commands::tokenize::Args),
    /// Spec-Bench through the gateway: speculation against plain decoding,
    /// interleaved, with an identity check of every greedy output.
    Bench(commands::bench::Args),
    /// Measure the model runtime: prefill, decode and the verify cost curve.
    BenchModel(commands::bench_model::Args),
    /// Score the drafters offline: tokens per verify step (τ) per Spec-Bench
    /// category, replayed against recorded greedy outputs.
    Accept(commands::accept::Args),
    /// Measure drafting and verification per call: each drafter's propose
    /// at a long context, and verifying a 64-node tree on real logits.
    BenchDraft(commands::bench_draft::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Model(c) => commands::fetch::run(c),
        Command::Generate(a) => commands::generate::run(a),
        Command::Up(a) => commands::up::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::BenchModel(a) => commands::bench_model::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Accept(a) => commands::accept::run(a),
        Command::BenchDraft(a) => commands::bench_draft::run(a),
    };
    if let Err(e) = result {
        // One line a user can act on; the chain gives the cause.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
