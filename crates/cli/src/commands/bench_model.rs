//! `specmesh bench-model`: what the runtime costs on this machine.
//!
//! * prefill tok/s for a long prompt,
//! * plain greedy decode tok/s,
//! * the verify cost curve: one forward over k new tokens at a fixed context,
//!   relative to k = 1. Speculation pays only while cost(k)/cost(1) stays
//!   well below the tokens it accepts per step.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;
use specmesh_model::Block;
use specmesh_model::cost::ordinary_tokens as tokens;
use specmesh_sampling::SamplingParams;

use crate::commands::generate::decode;
use crate::local::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length for the prefill measurement and context for the cost curve.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Tokens generated in the decode measurement.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Block sizes of the cost curve.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    ks: Vec<usize>,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    isa: String,
    threads: usize,
    compiled_features: Vec<&'static str>,
    streamed_weight_mib: f64,
    context: usize,
    prefill_tokens_per_second: f64,
    decode_tokens_per_second: f64,
    cost_curve: Vec<CostPoint>,
}

#[derive(Serialize)]
struct CostPoint {
    k: usize,
    /// Median over the repetitions.
    ms: f64,
    relative_to_k1: f64,
    /// Fastest repetition: what the forward costs when the VM is quiet.
    best_ms: f64,
    best_relative_to_k1: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn compiled_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if cfg!(target_feature = "avx2") {
        f.push("avx2");
    }
    if cfg!(target_feature = "fma") {
        f.push("fma");
    }
    if cfg!(target_feature = "f16c") {
        f.push("f16c");
    }
    if cfg!(target_feature = "avx512f") {
        f.push("avx512f");
    }
    f
}

pub fn run(args: Args) -> Result<()> {
    anyhow::ensure!(args.reps >= 1, "`--reps` must be >= 1");
    anyhow::ensure!(args.context >= 1, "`--context` must be >= 1");
    let path = args.model.path()?;
    let model = args.model.load_model()?;
    let max_k = args.ks.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(
        args.context + max_k.max(args.decode_tokens) + 32 <= model.config().max_context,
        "`--context` + the largest k exceed the model's context of {}",
        model.config().max_context
    );
    eprintln!(
        "model {} | isa {} | threads {} | compiled for {:?}",
        path.display(),
        model.isa(),
        model.threads(),
        compiled_features()
    );

    // Prefill: a fresh sequence each time.
    let prompt = tokens(args.context, 1);
    let prefill = Block::chain(prompt, 0)?.last_logits_only();
    let mut times = Vec::new();
    for _ in 0..args.reps.min(3) {
        let mut seq = model.new_sequence();
        let t = Instant::now();
        model.forward(&mut seq, &prefill)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let prefill_tps = args.context as f64 / median(times);
    eprintln!(
        "prefill  {:>8.1} tok/s  ({} tokens)",
        prefill_tps, args.context
    );

    // Plain greedy decoding after a short prompt.
    let short = tokens(32, 2);
    let generation = decode(
        &model,
        &short,
        &SamplingParams::greedy(),
        args.decode_tokens,
        &[],
        &mut |_| Ok(()),
    )?;
    let decode_tps = (generation.tokens.len() - 1) as f64 / generation.decode_seconds;
    eprintln!(
        "decode   {:>8.1} tok/s  ({} tokens, greedy)",
        decode_tps,
        generation.tokens.len()
    );

    // Cost curve: a k-token chain on top of `context` committed tokens.
    anyhow::ensure!(args.ks.iter().all(|&k| k >= 1), "every k must be >= 1");
    let samples = specmesh_model::cost::measure(&model, args.context, &args.ks, args.reps)?;
    let (k1, k1_best) = (samples[0].median * 1e3, samples[0].fastest * 1e3);
    let mut curve = Vec::new();
    for s in samples {
        let (ms, best_ms) = (s.median * 1e3, s.fastest * 1e3);
        curve.push(CostPoint {
            k: s.k,
            ms,
            relative_to_k1: ms / k1,
            best_ms,
            best_relative_to_k1: best_ms / k1_best,
        });
        eprintln!(
            "k={:<3} {ms:>8.2} ms  {:>5.2}x   (fastest {best_ms:.2} ms, {:.2}x)",
            s.k,
            ms / k1,
            best_ms / k1_best
        );
    }

    let report = Report {
        model: path.display().to_string(),
        isa: model.isa().to_string(),
        threads: model.threads(),
        compiled_features: compiled_features(),
        streamed_weight_mib: model.streamed_weight_bytes() as f64 / (1 << 20) as f64,
        context: args.context,
        prefill_tokens_per_second: prefill_tps,
        decode_tokens_per_second: decode_tps,
        cost_curve: curve,
    };
    print_table(&report);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

fn print_table(r: &Report) {
    println!("| metric | value |");
    println!("|---|---|");
    println!("| ISA / threads | {} / {} |", r.isa, r.threads);
    println!(
        "| prefill ({} tokens) | {:.1} tok/s |",
        r.context, r.prefill_tokens_per_second
    );
    println!(
        "| decode (greedy) | {:.1} tok/s |",
        r.decode_tokens_per_second
    );
    println!();
    println!(
        "| k | forward ms (context {}), median | cost(k)/cost(1) | fastest ms | fastest cost(k)/cost(1) |",
        r.context
    );
    println!("|---|---|---|---|---|");
    for p in &r.cost_curve {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p.k, p.ms, p.relative_to_k1, p.best_ms, p.best_relative_to_k1
        );
    }
}
