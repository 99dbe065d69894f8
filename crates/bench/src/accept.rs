//! `specmesh accept`: the drafters' own scoreboard.
//!
//! Greedy verification only ever reads the target's argmax along the path
//! it accepts, and that argmax is the next token of the greedy output. So
//! once the target's greedy output for a prompt is recorded (with its top-k
//! at every position, the token-recycling input), any drafter can be
//! replayed against it offline, exactly: each step proposes a tree for the
//! committed context, the accepted path is the longest branch that follows
//! the recorded output, and the bonus is the recorded token after it. The
//! result is τ, the mean tokens committed per verify step (bonus included),
//! per Spec-Bench category, drafter and tree budget.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use specmesh_draft::{DraftContext, Drafter, Feedback};
use specmesh_model::{Block, Model};
use specmesh_tree::{TokenTree, TreeLimits};

use crate::drafters::{self, DrafterKind};
use crate::specbench::{Question, Selection};
use specmesh_harness::model::ModelArgs;
use specmesh_harness::prompt::encode_prompt;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    select: Selection,
    /// Tokens of greedy output recorded per question.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Tree budgets (drafted nodes per step, root not counted).
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64")]
    budgets: Vec<usize>,
    /// Layers of the target the self-draft model keeps.
    #[arg(long, default_value_t = 8)]
    self_draft_layers: usize,
    /// Drafters to score: lookup, suffix, recycle, merged, self-draft.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lookup,suffix,recycle,merged"
    )]
    drafters: Vec<DrafterKind>,
    /// Target top-k recorded per position (what token recycling learns from).
    #[arg(long, default_value_t = 8)]
    top_k: usize,
    /// Cache of recorded greedy outputs (default: beside the model cache).
    #[arg(long, env = "SPECMESH_ACCEPT_RECORD")]
    record: Option<PathBuf>,
    /// Also write every number as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The target's top tokens at one position as (token, log-probability).
type TopK = Vec<(u32, f32)>;

/// The target's greedy output for one question.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Recording {
    id: String,
    category: String,
    model: String,
    max_new_tokens: usize,
    prompt: Vec<u32>,
    output: Vec<u32>,
    /// `top_k[i]`: the target's top tokens for output position i, as
    /// (token, log-probability).
    top_k: Vec<TopK>,
}

#[derive(Debug, Default, Clone, Serialize)]
struct Score {
    steps: u64,
    committed: u64,
    drafted: u64,
    propose_seconds: f64,
}

impl Score {
    fn tau(&self) -> f64 {
        self.committed as f64 / self.steps.max(1) as f64
    }
}

#[derive(Serialize)]
struct Report {
    model: String,
    questions: usize,
    max_new_tokens: usize,
    /// drafter → budget → category → score ("overall" included).
    scores: BTreeMap<String, BTreeMap<usize, BTreeMap<String, Score>>>,
}

pub fn run(args: Args) -> Result<()> {
    anyhow::ensure!(args.max_new_tokens > 0, "`--max-new-tokens` must be >= 1");
    anyhow::ensure!(
        args.budgets.iter().all(|&b| (1..=1024).contains(&b)),
        "`--budgets` must be between 1 and 1024 drafted nodes"
    );
    let questions = args.select.load()?;
    let model_path = args.model.path()?;
    let model_name = model_path.file_name().map_or_else(
        || model_path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let record_path = match &args.record {
        Some(p) => p.clone(),
        None => specmesh_catalog::cache_dir()?
            .join("records")
            .join("accept.jsonl"),
    };
    let recordings = record(&args, &questions, &model_name, &record_path)?;
    let vocab = recordings.vocab;
    let draft_model = if args.drafters.contains(&DrafterKind::SelfDraft) {
        let m = args.model.load_model()?;
        Some(std::sync::Arc::new(m.truncated(args.self_draft_layers)?))
    } else {
        None
    };

    let mut report = Report {
        model: model_name,
        questions: questions.len(),
        max_new_tokens: args.max_new_tokens,
        scores: BTreeMap::new(),
    };
    for kind in &args.drafters {
        for &budget in &args.budgets {
            let limits = TreeLimits::new(budget + 1, budget.min(32), vocab);
            let by_cat = replay(*kind, limits, &recordings.items, draft_model.clone());
            report
                .scores
                .entry(kind.to_string())
                .or_default()
                .insert(budget, by_cat);
        }
    }
    print_table(&report, &args.budgets, &questions);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

struct Recordings {
    items: Vec<Recording>,
    vocab: u32,
}

/// Loads recordings from the cache and records whatever is missing.
fn record(
    args: &Args,
    questions: &[Question],
    model_name: &str,
    path: &std::path::Path,
) -> Result<Recordings> {
    let mut cached: BTreeMap<(String, String), Recording> = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(path) {
        for line in text.lines() {
            // A line from an older format is simply recorded again.
            if let Ok(r) = serde_json::from_str::<Recording>(line)
                && r.model == model_name
                && r.max_new_tokens == args.max_new_tokens
                && r.top_k.first().is_none_or(|k| k.len() >= args.top_k)
            {
                cached.insert((r.category.clone(), r.id.clone()), r);
            }
        }
    }
    let tokenizer = args.model.load_tokenizer()?;
    let vocab = tokenizer.vocab_size() as u32;
    let missing: Vec<&Question> = questions
        .iter()
        .filter(|q| !cached.contains_key(&(q.category.clone(), q.id())))
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "recording greedy outputs of {} questions ({} cached in {})",
            missing.len(),
            questions.len() - missing.len(),
            path.display()
        );
        let model = args.model.load_model()?;
        for q in missing {
            let prompt = encode_prompt(&tokenizer, q.prompt(), true)?;
            let (output, top_k) = greedy_with_top_k(
                &model,
                &prompt,
                args.max_new_tokens,
                tokenizer.eos_token_ids(),
                args.top_k,
            )?;
            let r = Recording {
                id: q.id(),
                category: q.category.clone(),
                model: model_name.to_string(),
                max_new_tokens: args.max_new_tokens,
                prompt,
                output,
                top_k,
            };
            cached.insert((r.category.clone(), r.id.clone()), r);
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut text = String::new();
        for r in cached.values() {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)?;
    }
    let items = questions
        .iter()
        .map(|q| cached[&(q.category.clone(), q.id())].clone())
        .collect();
    Ok(Recordings { items, vocab })
}

/// Plain greedy decoding that also keeps the top-k of every step. EOS ends
/// the output and is not part of it.
fn greedy_with_top_k(
    model: &Model,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
    k: usize,
) -> Result<(Vec<u32>, Vec<TopK>)> {
    let mut seq = model.new_sequence();
    let block = Block::chain(prompt.to_vec(), 0)?.last_logits_only();
    let mut logits = model.forward(&mut seq, &block)?;
    seq.commit(&(0..prompt.len()).collect::<Vec<_>>())?;
    let (mut out, mut tops) = (Vec::new(), Vec::new());
    while out.len() < max_new {
        let row = logits.rows() - 1;
        let next = logits.argmax(row);
        if eos.contains(&next) {
            break;
        }
        tops.push(
            logits
                .top_k(row, k)
                .into_iter()
                .map(|t| (t.token, t.logprob))
                .collect(),
        );
        out.push(next);
        let step = Block::chain(vec![next], seq.len())?;
        logits = model.forward(&mut seq, &step)?;
        seq.commit(&[0])?;
    }
    Ok((out, tops))
}

/// Replays one drafter over every recording, in order (the suffix drafter's
/// global index sees earlier outputs, as on a server).
fn replay(
    kind: DrafterKind,
    limits: TreeLimits,
    items: &[Recording],
    draft_model: Option<std::sync::Arc<Model>>,
) -> BTreeMap<String, Score> {
    let shared = drafters::Shared {
        draft_model,
        ..drafters::Shared::new()
    };
    let mut scores: BTreeMap<String, Score> = BTreeMap::new();
    for r in items {
        let mut drafter = drafters::make(kind, &shared, "bench");
        let s = replay_one(drafter.as_mut(), limits, r);
        drafters::finish(&shared, "bench", &r.output);
        for key in [r.category.clone(), "overall".to_string()] {
            let e = scores.entry(key).or_default();
            e.steps += s.steps;
            e.committed += s.committed;
            e.drafted += s.drafted;
            e.propose_seconds += s.propose_seconds;
        }
    }
    scores
}

fn replay_one(drafter: &mut dyn Drafter, limits: TreeLimits, r: &Recording) -> Score {
    let mut tokens = r.prompt.clone();
    let mut score = Score::default();
    let mut i = 0;
    while i < r.output.len() {
        let ctx = DraftContext {
            tokens: &tokens,
            prompt_len: r.prompt.len(),
            limits,
        };
        let t0 = Instant::now();
        let tree = drafter.propose(&ctx);
        score.propose_seconds += t0.elapsed().as_secs_f64();
        let path = accepted_path(&tree, &r.output[i..]);
        let n = path.len().min(r.output.len() - i);
        let committed = &r.output[i..i + n];
        let top_k = &r.top_k[i..i + n];
        drafter.observe(&Feedback {
            tree: &tree,
            path: &path,
            committed,
            top_k,
        });
        score.steps += 1;
        score.committed += n as u64;
        score.drafted += tree.draft_len() as u64;
        tokens.extend_from_slice(committed);
        i += n;
    }
    score
}

/// The greedy verifier's walk, with the recorded output as the target's
/// argmax: root first, then each child that matches the next token.
fn accepted_path(tree: &TokenTree, next: &[u32]) -> Vec<usize> {
    let mut path = vec![0];
    let mut node = 0;
    for &t in next {
        match tree.child_with(node, t) {
            Some(c) => {
                path.push(c);
                node = c;
            }
            None => break,
        }
    }
    path
}

fn print_table(report: &Report, budgets: &[usize], questions: &[Question]) {
    let mut cats: Vec<String> = Vec::new();
    for q in questions {
        if !cats.contains(&q.category) {
            cats.push(q.category.clone());
        }
    }
    cats.push("overall".into());
    println!(
        "τ = tokens committed per verify step (bonus included), {} questions, {} new tokens, greedy",
        report.questions, report.max_new_tokens
    );
    for (name, by_budget) in &report.scores {
        println!();
        let mut header = format!("{:<16}", name);
        for b in budgets {
            header.push_str(&format!(" {:>8}", format!("τ@{b}")));
        }
        header.push_str(&format!(" {:>12}", "propose µs"));
        println!("{header}");
        for c in &cats {
            let mut line = format!("{c:<16}");
            for b in budgets {
                let tau = by_budget
                    .get(b)
                    .and_then(|m| m.get(c))
                    .map_or(0.0, Score::tau);
                line.push_str(&format!(" {tau:>8.2}"));
            }
            let us = budgets
                .last()
                .and_then(|b| by_budget.get(b))
                .and_then(|m| m.get(c))
                .map_or(0.0, |s| s.propose_seconds * 1e6 / s.steps.max(1) as f64);
            line.push_str(&format!(" {us:>12.1}"));
            println!("{line}");
        }
    }
}
