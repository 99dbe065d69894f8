//! `specmesh bench-model`: what the runtime costs on this machine.
//!
//! * prefill tok/s for a long prompt,
//! * plain greedy decode tok/s,
//! * the verify cost curve: one forward over k new tokens at each given
//!   context, relative to k = 1. Speculation pays only while
//!   cost(k)/cost(1) stays well below the tokens it accepts per step,
//! * the memory-read floor of a 1-token step: the weight bytes a forward
//!   reads ÷ this machine's read bandwidth (measured here),
//! * weight bytes and resident size,
//! * the peer: llama.cpp's own `llama-bench` on the same file and threads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use specmesh_kernels::ThreadPool;
use specmesh_model::Block;
use specmesh_model::cost::ordinary_tokens as tokens;
use specmesh_sampling::SamplingParams;

use crate::llama_cpp;
use specmesh_engine::plain::decode;
use specmesh_harness::model::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Committed contexts of the cost curve; the first is also the prefill's prompt length.
    #[arg(
        long,
        alias = "context",
        value_delimiter = ',',
        default_value = "512,2048"
    )]
    contexts: Vec<usize>,
    /// Tokens generated in the decode measurement.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Block sizes of the cost curve.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    ks: Vec<usize>,
    /// Contexts of the 1-token step at long context (filled with zero K/V
    /// rather than prefilled; contexts the model cannot hold are skipped;
    /// `0`: none).
    #[arg(long, value_delimiter = ',', default_value = "512,4096,16384")]
    step_contexts: Vec<usize>,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Directory with llama.cpp's `llama-bench` (tools/bench/setup.sh builds it).
    #[arg(long, env = "SPECMESH_PEER_BIN")]
    peer_bin: Option<PathBuf>,
    /// Skip the llama.cpp peer.
    #[arg(long)]
    no_peer: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    isa: String,
    /// The ISA and, on AMX, which calls take tiles (`Model::kernels`).
    kernels: String,
    /// What the KV cache stores (`--kv-dtype`).
    kv_dtype: String,
    threads: usize,
    compiled_features: Vec<&'static str>,
    weight_mb: f64,
    resident_mb: Option<f64>,
    streamed_weight_mib: f64,
    read_bandwidth_gb_s: f64,
    /// Streamed weight bytes ÷ read bandwidth: no 1-token step is faster.
    memory_floor_ms: f64,
    prefill_tokens: usize,
    prefill_tokens_per_second: f64,
    decode_tokens_per_second: f64,
    cost_curves: Vec<Curve>,
    /// The 1-token step at each of `--step-contexts`.
    steps: Vec<Step>,
    peer: Option<PeerBench>,
}

#[derive(Serialize)]
struct Step {
    context: usize,
    /// Median over the repetitions.
    ms: f64,
    /// Relative to the step at the first context.
    relative_to_first: f64,
    best_ms: f64,
}

#[derive(Serialize)]
struct Curve {
    context: usize,
    points: Vec<CostPoint>,
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

/// llama.cpp's own numbers on the same file.
#[derive(Serialize)]
struct PeerBench {
    tool: String,
    build: String,
    prefill_tokens: usize,
    prefill_tokens_per_second: f64,
    decode_tokens: usize,
    decode_tokens_per_second: f64,
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
    anyhow::ensure!(
        !args.contexts.is_empty() && args.contexts.iter().all(|&c| c >= 1),
        "`--contexts` must list contexts >= 1"
    );
    anyhow::ensure!(args.ks.iter().all(|&k| k >= 1), "every k must be >= 1");
    let path = args.model.path()?;
    let model = args.model.load_model()?;
    let max_k = args.ks.iter().copied().max().unwrap_or(1);
    let max_ctx = args.contexts.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(
        max_ctx + max_k.max(args.decode_tokens) + 32 <= model.config().max_context,
        "the largest context + k exceed the model's context of {}",
        model.config().max_context
    );
    let resident = specmesh_model::process::resident_bytes();
    eprintln!(
        "model {} | kernels {} | {} KV | threads {} | compiled for {:?} | {}",
        path.display(),
        model.kernels(),
        model.kv_dtype(),
        model.threads(),
        compiled_features(),
        specmesh_model::process::memory_line(model.weight_bytes())
    );

    // The floor: this machine's read bandwidth with the model's threads.
    let bandwidth = {
        let pool = ThreadPool::new(model.threads());
        specmesh_kernels::membw::read_bandwidth(&pool, 512 << 20, 5)
    };
    let floor_ms = model.streamed_weight_bytes() as f64 / bandwidth * 1e3;
    eprintln!(
        "memory   {:>8.1} GB/s read; {:.0} MB of weights per forward: floor {floor_ms:.1} ms per 1-token step",
        bandwidth / 1e9,
        model.streamed_weight_bytes() as f64 / 1e6
    );

    // Prefill: a fresh sequence each time.
    let prefill_len = args.contexts[0];
    let prompt = tokens(prefill_len, 1);
    let prefill = Block::chain(prompt, 0)?.last_logits_only();
    let mut times = Vec::new();
    for _ in 0..args.reps.min(3) {
        let mut seq = model.new_sequence();
        let t = Instant::now();
        model.forward(&mut seq, &prefill)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let prefill_tps = prefill_len as f64 / median(times);
    eprintln!("prefill  {prefill_tps:>8.1} tok/s  ({prefill_len} tokens)");

    // Plain greedy decoding after a short prompt.
    let short = tokens(32, 2);
    let generation = decode(
        &model,
        &short,
        &SamplingParams::greedy(),
        args.decode_tokens,
        &[],
        &mut |_| Ok::<(), anyhow::Error>(()),
    )?;
    let decode_tps = (generation.tokens.len() - 1) as f64 / generation.decode_seconds;
    eprintln!(
        "decode   {:>8.1} tok/s  ({} tokens, greedy)",
        decode_tps,
        generation.tokens.len()
    );

    // Cost curves: a k-token chain on top of each context.
    let mut curves = Vec::new();
    for &context in &args.contexts {
        let samples = specmesh_model::cost::measure(&model, context, &args.ks, args.reps)?;
        let (k1, k1_best) = (samples[0].median * 1e3, samples[0].fastest * 1e3);
        let mut points = Vec::new();
        for s in samples {
            let (ms, best_ms) = (s.median * 1e3, s.fastest * 1e3);
            points.push(CostPoint {
                k: s.k,
                ms,
                relative_to_k1: ms / k1,
                best_ms,
                best_relative_to_k1: best_ms / k1_best,
            });
            eprintln!(
                "context {context} k={:<3} {ms:>8.2} ms  {:>5.2}x   (fastest {best_ms:.2} ms, {:.2}x)",
                s.k,
                ms / k1,
                best_ms / k1_best
            );
        }
        curves.push(Curve { context, points });
    }

    // The 1-token step as the context grows (attention's share).
    let mut steps: Vec<Step> = Vec::new();
    let contexts: Vec<usize> = args
        .step_contexts
        .iter()
        .copied()
        .filter(|&c| c > 0)
        .collect();
    for s in specmesh_model::cost::measure_steps(&model, &contexts, args.reps)? {
        let (ms, best_ms) = (s.median * 1e3, s.fastest * 1e3);
        let relative_to_first = steps.first().map_or(1.0, |f| ms / f.ms);
        eprintln!(
            "step at context {:<6} {ms:>8.2} ms  {relative_to_first:>5.2}x   (fastest {best_ms:.2} ms)",
            s.context
        );
        steps.push(Step {
            context: s.context,
            ms,
            relative_to_first,
            best_ms,
        });
    }

    let peer = if args.no_peer {
        None
    } else {
        let dir = args
            .peer_bin
            .clone()
            .unwrap_or_else(llama_cpp::default_bin_dir);
        match llama_bench(
            &dir,
            &path,
            model.threads(),
            prefill_len,
            args.decode_tokens,
        ) {
            Ok(p) => {
                eprintln!(
                    "peer     {} ({}): prefill {:.1} tok/s, decode {:.1} tok/s",
                    p.tool, p.build, p.prefill_tokens_per_second, p.decode_tokens_per_second
                );
                Some(p)
            }
            Err(e) => {
                eprintln!("peer     skipped: {e:#}");
                None
            }
        }
    };

    let report = Report {
        model: path.display().to_string(),
        isa: model.isa().to_string(),
        kernels: model.kernels(),
        kv_dtype: model.kv_dtype().to_string(),
        threads: model.threads(),
        compiled_features: compiled_features(),
        weight_mb: model.weight_bytes() as f64 / 1e6,
        resident_mb: resident.map(|r| r as f64 / 1e6),
        streamed_weight_mib: model.streamed_weight_bytes() as f64 / (1 << 20) as f64,
        read_bandwidth_gb_s: bandwidth / 1e9,
        memory_floor_ms: floor_ms,
        prefill_tokens: prefill_len,
        prefill_tokens_per_second: prefill_tps,
        decode_tokens_per_second: decode_tps,
        cost_curves: curves,
        steps,
        peer,
    };
    print_table(&report);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// `llama-bench -p N -n M` on the same file and threads, 3 repetitions.
fn llama_bench(
    dir: &Path,
    model: &Path,
    threads: usize,
    prefill: usize,
    decode: usize,
) -> Result<PeerBench> {
    let bin = dir.join("llama-bench");
    anyhow::ensure!(
        bin.exists(),
        "no {} (build it with tools/bench/setup.sh, or pass --peer-bin / --no-peer)",
        bin.display()
    );
    let out = Command::new(&bin)
        .arg("-m")
        .arg(model)
        .args(["-t", &threads.to_string(), "-p", &prefill.to_string()])
        .args(["-n", &decode.to_string(), "-r", "3", "-o", "json"])
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "llama-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
    let runs: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).context("reading llama-bench's JSON")?;
    let rate = |pp: bool| {
        runs.iter()
            .find(|r| (r["n_prompt"].as_u64().unwrap_or(0) > 0) == pp)
            .and_then(|r| r["avg_ts"].as_f64())
            .context("llama-bench reported no such test")
    };
    let build = runs
        .first()
        .and_then(|r| r["build_commit"].as_str())
        .unwrap_or("?")
        .to_owned();
    Ok(PeerBench {
        tool: "llama.cpp llama-bench".into(),
        build: llama_cpp::build_info(dir).unwrap_or(build),
        prefill_tokens: prefill,
        prefill_tokens_per_second: rate(true)?,
        decode_tokens: decode,
        decode_tokens_per_second: rate(false)?,
    })
}

fn print_table(r: &Report) {
    println!("| metric | value |");
    println!("|---|---|");
    println!(
        "| ISA / KV / threads | {} / {} / {} |",
        r.isa, r.kv_dtype, r.threads
    );
    println!(
        "| weights / resident | {:.0} MB / {} |",
        r.weight_mb,
        r.resident_mb.map_or("?".into(), |m| format!("{m:.0} MB"))
    );
    println!(
        "| read bandwidth / 1-token floor | {:.1} GB/s / {:.1} ms ({:.1} tok/s) |",
        r.read_bandwidth_gb_s,
        r.memory_floor_ms,
        1e3 / r.memory_floor_ms
    );
    println!(
        "| prefill ({} tokens) | {:.1} tok/s |",
        r.prefill_tokens, r.prefill_tokens_per_second
    );
    println!(
        "| decode (greedy) | {:.1} tok/s |",
        r.decode_tokens_per_second
    );
    if let Some(p) = &r.peer {
        println!(
            "| llama.cpp prefill / decode ({}) | {:.1} / {:.1} tok/s |",
            p.build.lines().next().unwrap_or(""),
            p.prefill_tokens_per_second,
            p.decode_tokens_per_second
        );
    }
    for c in &r.cost_curves {
        println!();
        println!(
            "| k | forward ms (context {}), median | cost(k)/cost(1) | fastest ms | fastest cost(k)/cost(1) |",
            c.context
        );
        println!("|---|---|---|---|---|");
        for p in &c.points {
            println!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                p.k, p.ms, p.relative_to_k1, p.best_ms, p.best_relative_to_k1
            );
        }
    }
    if !r.steps.is_empty() {
        println!();
        println!("| context | 1-token step ms, median | relative to the first | fastest ms |");
        println!("|---|---|---|---|");
        for s in &r.steps {
            println!(
                "| {} | {:.2} | {:.2} | {:.2} |",
                s.context, s.ms, s.relative_to_first, s.best_ms
            );
        }
    }
}
