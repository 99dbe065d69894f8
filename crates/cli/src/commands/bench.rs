//! `specmesh bench`: Spec-Bench through the gateway, speculation against
//! plain decoding of the same model on the same machine.
//!
//! Configurations run interleaved prompt by prompt (A B A B …), so machine
//! drift hits all of them alike; one warm-up request is not counted. Greedy
//! outputs with speculation must equal those without: any difference is a
//! failure (non-zero exit), not a footnote.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use specmesh_draft::{Adaptive, CostCurve, PolicyConfig, SpecPolicy};
use specmesh_engine::{Session, SessionLimits};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use specmesh_sampling::SamplingParams;
use specmesh_tree::TreeLimits;
use tonic::transport::Channel;

use crate::commands::drafters::{self, DrafterKind};
use crate::commands::generate::encode_prompt;
use crate::commands::up::Mesh;
use crate::local::ModelArgs;
use crate::specbench::{Question, Selection};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    select: Selection,
    /// A running gateway; without it, --up starts the system here.
    #[arg(long, env = "SPECMESH_GATEWAY", conflicts_with = "up")]
    gateway: Option<String>,
    /// Start verifier, drafter and gateway on loopback for the run.
    #[arg(long)]
    up: bool,
    /// New tokens per request (greedy).
    #[arg(long, default_value_t = 128)]
    max_new_tokens: u32,
    /// Also run both configurations in this process (no gRPC), to measure
    /// what the distributed loop costs per round.
    #[arg(long)]
    in_process: bool,
    /// Write every raw number as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Config {
    Off,
    Auto,
    InProcessOff,
    InProcessAuto,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Off => "off",
            Config::Auto => "auto",
            Config::InProcessOff => "in-process off",
            Config::InProcessAuto => "in-process auto",
        }
    }
}

/// One request's numbers.
#[derive(Clone, Debug, Serialize)]
struct Run {
    question: String,
    category: String,
    config: Config,
    tokens: Vec<u32>,
    completion_tokens: usize,
    wall_seconds: f64,
    /// From the first token to the last.
    decode_seconds: f64,
    ttft_seconds: f64,
    /// Per-token gaps between streamed chunks (a chunk's tokens share its gap).
    inter_token_seconds: Vec<f64>,
    verify_steps: u32,
    drafted_tokens: u32,
    accepted_tokens: u32,
}

#[derive(Serialize)]
struct Report {
    max_new_tokens: u32,
    questions: usize,
    mismatches: Vec<String>,
    runs: Vec<Run>,
}

pub fn run(args: Args) -> Result<()> {
    let questions = args.select.load()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mesh = if args.up {
            Some(
                Mesh::start(
                    args.model.path()?,
                    args.model.threads,
                    "127.0.0.1:0".parse()?,
                    1,
                    1,
                    Duration::from_secs(300),
                )
                .await?,
            )
        } else {
            None
        };
        let url = match (&args.gateway, &mesh) {
            (Some(u), _) => u.clone(),
            (None, Some(m)) => m.gateway.url(),
            (None, None) => bail!("pass --gateway URL or --up"),
        };
        let result = bench(&args, &questions, &url).await;
        if let Some(m) = mesh {
            m.stop().await?;
        }
        result
    })
}

async fn bench(args: &Args, questions: &[Question], url: &str) -> Result<()> {
    let mut client = GenerationClient::connect(url.to_string())
        .await
        .with_context(|| format!("connecting to the gateway at {url}"))?;
    let local = if args.in_process {
        Some(InProcess::load(&args.model)?)
    } else {
        None
    };
    let mut configs = vec![Config::Off, Config::Auto];
    if local.is_some() {
        configs.extend([Config::InProcessOff, Config::InProcessAuto]);
    }
    // Warm-up: caches, connections, page faults. Not counted.
    request(&mut client, &questions[0], Config::Off, args.max_new_tokens).await?;
    let mut runs = Vec::new();
    let mut mismatches = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        let mut by_config = BTreeMap::new();
        for &c in &configs {
            let r = match c {
                Config::Off | Config::Auto => {
                    request(&mut client, q, c, args.max_new_tokens).await?
                }
                _ => local
                    .as_ref()
                    .expect("in-process model")
                    .run(q, c, args.max_new_tokens)?,
            };
            by_config.insert(c, r);
        }
        let reference = &by_config[&Config::Off].tokens;
        for (c, r) in &by_config {
            if &r.tokens != reference {
                mismatches.push(format!(
                    "{} ({}): {} differs from off",
                    q.id(),
                    q.category,
                    c.name()
                ));
            }
        }
        let (off, auto) = (&by_config[&Config::Off], &by_config[&Config::Auto]);
        eprintln!(
            "[{}/{}] {:<14} off {:>6.1} tok/s  auto {:>6.1} tok/s  τ {:.2}",
            i + 1,
            questions.len(),
            q.category,
            off.completion_tokens as f64 / off.wall_seconds,
            auto.completion_tokens as f64 / auto.wall_seconds,
            auto.completion_tokens as f64 / f64::from(auto.verify_steps.max(1)),
        );
        runs.extend(by_config.into_values());
    }
    print_report(&runs, questions, &configs);
    let report = Report {
        max_new_tokens: args.max_new_tokens,
        questions: questions.len(),
        mismatches: mismatches.clone(),
        runs,
    };
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if !mismatches.is_empty() {
        for m in &mismatches {
            eprintln!("MISMATCH {m}");
        }
        bail!(
            "{} outputs differ between configurations: speculation changed the answer",
            mismatches.len()
        );
    }
    Ok(())
}

async fn request(
    client: &mut GenerationClient<Channel>,
    q: &Question,
    c: Config,
    max_new: u32,
) -> Result<Run> {
    let mode = if c == Config::Off {
        v1::SpeculationMode::Off
    } else {
        v1::SpeculationMode::Unspecified
    };
    let req = v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages: vec![v1::ChatMessage {
                role: "user".into(),
                content: q.prompt().into(),
            }],
        })),
        max_new_tokens: max_new,
        speculation: Some(v1::SpeculationParams {
            mode: mode as i32,
            max_draft_tokens: 0,
        }),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut stream = client
        .generate_stream(req)
        .await
        .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    let (mut tokens, mut gaps) = (Vec::new(), Vec::new());
    let (mut first, mut last) = (None, t0);
    let mut spec = v1::SpeculationStats::default();
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?
    {
        let now = Instant::now();
        if !chunk.token_ids.is_empty() {
            if first.is_none() {
                first = Some(now);
            } else {
                let per = (now - last).as_secs_f64() / chunk.token_ids.len() as f64;
                gaps.extend(std::iter::repeat_n(per, chunk.token_ids.len()));
            }
            last = now;
            tokens.extend_from_slice(&chunk.token_ids);
        }
        if let Some(s) = chunk.speculation {
            spec = s;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let first = first.unwrap_or(last);
    Ok(Run {
        question: q.id(),
        category: q.category.clone(),
        config: c,
        completion_tokens: tokens.len(),
        tokens,
        wall_seconds: wall,
        decode_seconds: (last - first).as_secs_f64(),
        ttft_seconds: (first - t0).as_secs_f64(),
        inter_token_seconds: gaps,
        verify_steps: spec.verify_steps,
        drafted_tokens: spec.drafted_tokens,
        accepted_tokens: spec.accepted_tokens,
    })
}

/// The same decoding loops without any network: the engine and drafters
/// called directly.
struct InProcess {
    model: specmesh_model::Model,
    tokenizer: specmesh_tokenizer::Tokenizer,
}

impl InProcess {
    fn load(args: &ModelArgs) -> Result<InProcess> {
        Ok(InProcess {
            model: args.load_model()?,
            tokenizer: args.load_tokenizer()?,
        })
    }

    fn run(&self, q: &Question, c: Config, max_new: u32) -> Result<Run> {
        let prompt = encode_prompt(&self.tokenizer, q.prompt(), true)?;
        let vocab = self.model.config().vocab_size as u32;
        let limits = SessionLimits {
            max_new_tokens: max_new as usize,
            eos: self.tokenizer.eos_token_ids().to_vec(),
        };
        let shared = drafters::Shared::new();
        let mut drafter = Adaptive::new(
            drafters::make(DrafterKind::Merged, &shared, "bench"),
            SpecPolicy::new(CostCurve::cpu_default(), PolicyConfig::default())?,
        );
        let mut budget = |_: &Session| TreeLimits::new(65, 16, vocab);
        let t0 = Instant::now();
        let mut first = None;
        let mut on_commit = |_: &[u32]| {
            first.get_or_insert_with(Instant::now);
        };
        let g = specmesh_engine::generate(
            &self.model,
            &prompt,
            SamplingParams::greedy(),
            limits,
            (c == Config::InProcessAuto)
                .then_some(&mut drafter as &mut dyn specmesh_draft::Drafter),
            &mut budget,
            &mut on_commit,
        )?;
        let wall = t0.elapsed().as_secs_f64();
        let first = first.map_or(wall, |f| (f - t0).as_secs_f64());
        Ok(Run {
            question: q.id(),
            category: q.category.clone(),
            config: c,
            completion_tokens: g.tokens.len(),
            tokens: g.tokens,
            wall_seconds: wall,
            decode_seconds: g.stats.decode_seconds,
            ttft_seconds: first,
            inter_token_seconds: Vec::new(),
            verify_steps: g.stats.verify_steps as u32,
            drafted_tokens: g.stats.drafted_tokens as u32,
            accepted_tokens: g.stats.accepted_tokens as u32,
        })
    }
}

#[derive(Default, Clone, Copy)]
struct Sum {
    tokens: f64,
    wall: f64,
    steps: f64,
}

fn print_report(runs: &[Run], questions: &[Question], configs: &[Config]) {
    let mut cats: Vec<String> = Vec::new();
    for q in questions {
        if !cats.contains(&q.category) {
            cats.push(q.category.clone());
        }
    }
    cats.push("overall".into());
    let mut sums: BTreeMap<(String, Config), Sum> = BTreeMap::new();
    for r in runs {
        for key in [r.category.clone(), "overall".to_string()] {
            let s = sums.entry((key, r.config)).or_default();
            s.tokens += r.completion_tokens as f64;
            s.wall += r.wall_seconds;
            s.steps += f64::from(r.verify_steps);
        }
    }
    println!();
    println!(
        "{:<16} {:>6} {:>10} {:>10} {:>8} {:>6}",
        "category", "prompts", "off tok/s", "auto tok/s", "speedup", "τ"
    );
    for c in &cats {
        let get = |cfg| sums.get(&(c.clone(), cfg)).copied().unwrap_or_default();
        let (off, auto) = (get(Config::Off), get(Config::Auto));
        let n = questions
            .iter()
            .filter(|q| &q.category == c || c == "overall")
            .count();
        println!(
            "{:<16} {:>6} {:>10.1} {:>10.1} {:>7.2}x {:>6.2}",
            c,
            n,
            off.tokens / off.wall.max(1e-9),
            auto.tokens / auto.wall.max(1e-9),
            off.wall / auto.wall.max(1e-9) * auto.tokens / off.tokens.max(1e-9),
            auto.tokens / auto.steps.max(1.0),
        );
    }
    let pct = |mut v: Vec<f64>, p: f64| {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    println!();
    for &cfg in configs {
        let rs: Vec<&Run> = runs.iter().filter(|r| r.config == cfg).collect();
        let ttft: Vec<f64> = rs.iter().map(|r| r.ttft_seconds).collect();
        let itl: Vec<f64> = rs
            .iter()
            .flat_map(|r| r.inter_token_seconds.iter().copied())
            .collect();
        let s = sums
            .get(&("overall".to_string(), cfg))
            .copied()
            .unwrap_or_default();
        let decode: f64 = rs.iter().map(|r| r.decode_seconds).sum();
        println!(
            "{:<16} {:>7.1} tok/s  τ {:.2}  TTFT p50 {:>6.1} ms  ITL p50 {:>5.2} ms p99 {:>5.2} ms  {:.2} ms per verify step",
            cfg.name(),
            s.tokens / s.wall.max(1e-9),
            s.tokens / s.steps.max(1.0),
            pct(ttft, 0.5) * 1e3,
            pct(itl.clone(), 0.5) * 1e3,
            pct(itl, 0.99) * 1e3,
            decode / s.steps.max(1.0) * 1e3,
        );
    }
}
