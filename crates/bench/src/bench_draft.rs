//! `specmesh bench-draft`: what drafting and verification cost on the CPU,
//! per call, at a long context: each drafter's propose + observe, and the
//! verification of a 64-node tree on real logits.

use std::hint::black_box;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use specmesh_draft::{DraftContext, Feedback};
use specmesh_model::Block;
use specmesh_sampling::SamplingParams;
use specmesh_tree::{TokenTree, TreeBuilder, TreeLimits};
use specmesh_verify::{RowMajor, verify};

use crate::drafters::{self, DrafterKind};
use crate::specbench::Selection;
use specmesh_harness::model::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    select: Selection,
    /// Context length the drafters see.
    #[arg(long, default_value_t = 2048)]
    context: usize,
    /// Propose calls timed per drafter.
    #[arg(long, default_value_t = 200)]
    calls: usize,
    /// Drafted nodes per tree.
    #[arg(long, default_value_t = 64)]
    nodes: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Report {
    context: usize,
    nodes: usize,
    propose_us: Vec<(String, f64)>,
    verify_us: Vec<(String, f64)>,
}

pub fn run(mut args: Args) -> Result<()> {
    anyhow::ensure!(args.context >= 16, "`--context` must be >= 16");
    anyhow::ensure!(
        (1..=256).contains(&args.nodes),
        "`--nodes` must be in 1..=256"
    );
    args.select.per_category = 0;
    let tokenizer = args.model.load_tokenizer()?;
    let vocab = tokenizer.vocab_size() as u32;
    // Real text: the benchmark questions back to back until the context is
    // full, so n-gram and suffix matches are as frequent as in real prompts.
    let mut text = Vec::new();
    for q in args.select.load()? {
        text.extend(tokenizer.encode(q.prompt(), false)?);
        if text.len() >= args.context + args.calls {
            break;
        }
    }
    anyhow::ensure!(
        text.len() >= args.context + args.calls,
        "the questions hold only {} tokens; lower --context or --calls",
        text.len()
    );
    let limits = TreeLimits::new(args.nodes + 1, 16, vocab);
    let mut report = Report {
        context: args.context,
        nodes: args.nodes,
        propose_us: Vec::new(),
        verify_us: Vec::new(),
    };
    println!(
        "drafting at a {}-token context, trees of up to {} nodes",
        args.context, args.nodes
    );
    for kind in [
        DrafterKind::Lookup,
        DrafterKind::Suffix,
        DrafterKind::Recycle,
        DrafterKind::Merged,
    ] {
        let shared = drafters::Shared::new();
        // Earlier sessions' outputs in the global index, as on a server.
        for chunk in text[..args.context].chunks(512) {
            drafters::finish(&shared, "bench", chunk);
        }
        let mut d = drafters::make(kind, &shared, "bench");
        let start = args.context - args.calls / 2;
        let mut spent = 0.0;
        for i in 0..args.calls {
            let end = start + i;
            let ctx = DraftContext {
                tokens: &text[..end],
                prompt_len: start,
                limits,
            };
            let t0 = Instant::now();
            let tree = d.propose(&ctx);
            let path = vec![0];
            let committed = [text[end]];
            let top = vec![vec![(text[end], -0.1f32)]];
            d.observe(&Feedback {
                tree: &tree,
                path: &path,
                committed: &committed,
                top_k: &top,
            });
            // The first calls build the per-session index: not counted.
            if i >= args.calls / 2 {
                spent += t0.elapsed().as_secs_f64();
            }
        }
        let us = spent * 1e6 / (args.calls - args.calls / 2) as f64;
        println!("  {kind:<8} propose + observe {us:>8.1} µs");
        report.propose_us.push((kind.to_string(), us));
    }

    let model = args.model.load_model()?;
    let prompt = &text[..512.min(args.context)];
    let mut seq = model.new_sequence();
    model.forward(
        &mut seq,
        &Block::chain(prompt[..prompt.len() - 1].to_vec(), 0)?.last_logits_only(),
    )?;
    seq.commit(&(0..prompt.len() - 1).collect::<Vec<_>>())?;
    let tree = full_tree(
        *prompt.last().context("empty prompt")?,
        limits,
        // The text after the prompt: what the tree's paths draft.
        &text[prompt.len()..],
    );
    let block = Block::tree(tree.tokens().to_vec(), tree.parent_list(), seq.len())?;
    let logits = model.forward(&mut seq, &block)?;
    seq.discard();
    let rows = RowMajor::new(logits.as_slice(), logits.vocab())?;
    println!(
        "verifying a {}-node tree on real logits (vocabulary {})",
        tree.len(),
        logits.vocab()
    );
    let cases = [
        ("greedy", SamplingParams::greedy(), 0),
        ("greedy + top-8", SamplingParams::greedy(), 8),
        (
            "sampling t=0.8 top_p=0.95",
            SamplingParams::new(0.8, 0.95, 0, 1)?,
            0,
        ),
        (
            "sampling t=0.8 top_k=50",
            SamplingParams::new(0.8, 1.0, 50, 1)?,
            0,
        ),
    ];
    for (name, params, top_k) in cases {
        let reps = 50;
        let t0 = Instant::now();
        for r in 0..reps {
            black_box(verify(&tree, &rows, &params, r, top_k)?);
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
        println!("  {name:<28} {us:>8.1} µs");
        report.verify_us.push((name.to_string(), us));
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// A tree of exactly `limits.max_nodes` nodes: a chain of real text (so the
/// greedy walk goes deep) with siblings hanging off it.
fn full_tree(root: u32, limits: TreeLimits, text: &[u32]) -> TokenTree {
    let mut b = TreeBuilder::new(root, limits).expect("root in vocabulary");
    let mut node = 0;
    let mut i = 0;
    while !b.is_full() && i < text.len() {
        let depth = b.depth(node);
        if depth < limits.max_depth
            && let Ok(n) = b.push(node, text[i], 0.9)
        {
            let mut sib = 1;
            while !b.is_full() && sib < 4 {
                let _ = b.push(node, (text[i] + sib * 101) % limits.vocab, 0.5);
                sib += 1;
            }
            node = n;
        } else {
            node = 0;
        }
        i += 1;
    }
    b.build()
}
