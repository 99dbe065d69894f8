//! `specmesh token-ranking`: counts which tokens a model's answers use, for
//! a draft head that scores only the most frequent ones (the drafter's
//! `--draft-head-tokens`). The corpus is regenerable from the repository:
//! the model's greedy answers to a prompt list (`tools/ranking/prompts.txt`
//! by default), plus any text files given.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use specmesh_draft_model::TokenRanking;
use specmesh_engine::plain::greedy_batch;
use specmesh_harness::model::ModelArgs;
use specmesh_harness::prompt::encode_prompt;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompts, one per line, each sent as one user message.
    #[arg(long, default_value = "tools/ranking/prompts.txt")]
    prompts: PathBuf,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Prompts decoded together in one batched forward.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Text files counted whole, besides the generated answers.
    #[arg(long)]
    text: Vec<PathBuf>,
    /// Where to write the ranking.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    if args.batch == 0 {
        bail!("`--batch` must be at least 1");
    }
    let tokenizer = args.model.load_tokenizer()?;
    let model = args.model.load_model()?;
    let name = args
        .model
        .model
        .as_deref()
        .map_or_else(|| "smollm2-135m".into(), |p| p.display().to_string());
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading the prompts {}", args.prompts.display()))?;
    let prompts = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| encode_prompt(&tokenizer, &l.replace("\\n", "\n"), true))
        .collect::<Result<Vec<_>>>()?;
    if prompts.is_empty() {
        bail!("{} holds no prompts", args.prompts.display());
    }
    let mut counts = vec![0u64; model.config().vocab_size];
    let mut generated = 0usize;
    let t0 = Instant::now();
    for chunk in prompts.chunks(args.batch) {
        let answers = greedy_batch(
            &model,
            chunk,
            args.max_new_tokens,
            tokenizer.eos_token_ids(),
        )?;
        for &t in answers.iter().flatten() {
            counts[t as usize] += 1;
            generated += 1;
        }
        eprintln!(
            "{generated} tokens generated ({:.0} s)",
            t0.elapsed().as_secs_f64()
        );
    }
    let mut corpus = format!(
        "{} prompts of {}, {generated} greedy tokens by {name} (at most {} each)",
        prompts.len(),
        args.prompts.display(),
        args.max_new_tokens
    );
    for path in &args.text {
        let body =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let ids = tokenizer.encode(&body, false)?;
        for &t in &ids {
            if let Some(c) = counts.get_mut(t as usize) {
                *c += 1;
            }
        }
        corpus.push_str(&format!("\n{}: {} tokens", path.display(), ids.len()));
    }
    let ranking = TokenRanking::from_counts(tokenizer.vocab_fingerprint(), corpus, &counts);
    std::fs::write(&args.out, ranking.to_text())
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "{} distinct tokens of {} ranked into {}",
        ranking.counts.len(),
        counts.len(),
        args.out.display()
    );
    for n in [1024, 4096, 8192, 16384, 32768] {
        eprintln!(
            "  the top {n:>5} cover {:.2}% of the counted tokens",
            ranking.coverage(n) * 100.0
        );
    }
    Ok(())
}
