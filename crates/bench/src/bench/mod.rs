//! `specmesh bench`: Spec-Bench through the gateway, speculation against
//! plain decoding of the same model on the same machine.
//!
//! The per-category pass runs one request at a time with the configurations
//! interleaved prompt by prompt (A B A B …), so machine drift hits all of
//! them alike; one warm-up request is not counted. The concurrency sweep then
//! runs waves of `n` clients, off and auto alternating. Greedy outputs with
//! speculation, and at every concurrency, must equal the one-at-a-time output
//! without speculation: any difference is a failure (non-zero exit), not a
//! footnote. llama.cpp runs as an optional peer on the same prompts.

mod gateway;
mod in_process;
mod peer;
mod plot;
mod report;
mod sweep;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use specmesh_proto::v1::generation_client::GenerationClient;

use crate::conversation::ConversationArgs;
use crate::conversation::command::Setup;
use crate::llama_cpp::PeerArgs;
use crate::specbench::{Question, Selection};
use specmesh_harness::grpc::Connection;
use specmesh_harness::launch::Mesh;
use specmesh_harness::layout::{Front, Layout, MeshArgs};
use specmesh_harness::model::ModelArgs;

#[derive(clap::Args, Debug)]
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
    /// Concurrency levels to sweep, e.g. `1,4,16`. Level 1 is the
    /// per-category pass, which always runs.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1",
        conflicts_with = "conversations"
    )]
    concurrency: Vec<usize>,
    /// Also run both configurations in this process (no gRPC), to measure
    /// what the distributed loop costs per round.
    #[arg(long, conflicts_with = "conversations")]
    in_process: bool,
    #[command(flatten)]
    peer: PeerArgs,
    #[command(flatten)]
    conversation: ConversationArgs,
    /// Our configurations, interleaved prompt by prompt (default: off and
    /// auto, plus model-free, draft-model and combined with --draft-model).
    /// `prediction` is auto with the prompt's first fenced code block as the
    /// predicted output (for the code-edit questions: the original code).
    #[arg(long, value_delimiter = ',', value_parser = parse_ours, conflicts_with = "conversations")]
    configs: Vec<Config>,
    /// Our configurations in the concurrency sweep (default: off and auto).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_ours,
        default_value = "off,auto",
        conflicts_with = "conversations"
    )]
    sweep_configs: Vec<Config>,
    // With --up: the mesh to start. `--draft-model` also adds the
    // model-free, draft-model and combined configurations to off and auto,
    // and is llama.cpp's draft model.
    #[command(flatten)]
    mesh: MeshArgs,
    /// Write every raw number as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write speedup and τ per category and tok/s against concurrency as an
    /// SVG to this file.
    #[arg(long, conflicts_with = "conversations")]
    plot: Option<PathBuf>,
    /// Write the printed tables as Markdown to this file (for a README).
    #[arg(long, conflicts_with = "conversations")]
    markdown: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Config {
    Off,
    Auto,
    ModelFree,
    DraftModel,
    Combined,
    /// Automatic, with the prompt's code block as the predicted output
    /// (`GenerateRequest.prediction`): an edit request's original code.
    Prediction,
    InProcessOff,
    InProcessAuto,
    PeerPlain,
    /// One of llama.cpp's speculative configurations, by name.
    Peer(&'static str),
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Off => "off",
            Config::Auto => "auto",
            Config::ModelFree => "model-free",
            Config::DraftModel => "draft-model",
            Config::Combined => "combined",
            Config::Prediction => "prediction",
            Config::InProcessOff => "in-process off",
            Config::InProcessAuto => "in-process auto",
            Config::PeerPlain => "llama.cpp",
            Config::Peer(name) => name,
        }
    }

    /// Ours must reproduce plain greedy decoding bit for bit; the peer has
    /// its own numerics, so its agreement is reported, not required.
    fn must_match(self) -> bool {
        !self.is_peer()
    }

    fn is_peer(self) -> bool {
        matches!(self, Config::PeerPlain | Config::Peer(_))
    }

    /// Ours through the gateway, speculating.
    fn is_ours_speculative(self) -> bool {
        matches!(
            self,
            Config::Auto
                | Config::ModelFree
                | Config::DraftModel
                | Config::Combined
                | Config::Prediction
        )
    }

    /// Through the gateway (streamed, so with inter-token gaps).
    fn via_gateway(self) -> bool {
        self == Config::Off || self.is_ours_speculative()
    }
}

/// As its name: JSON map keys must be strings.
impl Serialize for Config {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

fn parse_ours(s: &str) -> Result<Config, String> {
    Ok(match s {
        "off" => Config::Off,
        "auto" => Config::Auto,
        "model-free" => Config::ModelFree,
        "draft-model" => Config::DraftModel,
        "combined" => Config::Combined,
        "prediction" => Config::Prediction,
        _ => {
            return Err(format!(
                "unknown configuration `{s}`: use off, auto, model-free, draft-model, combined or prediction"
            ));
        }
    })
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
    /// Seconds the verify steps waited for the drafter's trees.
    tree_wait_seconds: f64,
    /// Steps that verified a tree the drafter drafted ahead.
    drafted_ahead_steps: u32,
}

#[derive(Serialize)]
struct Report {
    max_new_tokens: u32,
    questions: usize,
    peer: Option<String>,
    mismatches: Vec<String>,
    /// Prompts where llama.cpp's greedy tokens equal ours (its numerics
    /// differ, so near-ties may go the other way).
    peer_agreement: Option<usize>,
    summary: report::Summary,
    runs: Vec<Run>,
    waves: Vec<sweep::Wave>,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(&bad) = args.concurrency.iter().find(|&&n| n == 0 || n > 256) {
        bail!("--concurrency {bad}: each level must be in 1..=256");
    }
    if args.conversation.enabled() {
        let rt = tokio::runtime::Runtime::new()?;
        return rt.block_on(crate::conversation::command::run(Setup {
            model: &args.model,
            up: args.up.then_some(&args.mesh),
            draft_model: args.mesh.draft_model.as_deref(),
            grpc: args.gateway.clone().map(Connection::plain),
            http: None,
            peer: &args.peer,
            args: &args.conversation,
            max_new: args.max_new_tokens,
            repeats: 1,
            json: args.json.as_deref(),
        }));
    }
    // The peers first: a missing setup should fail before minutes of start-up.
    let peers = if args.peer.peer {
        let dir = args.peer.bin_dir();
        let threads = args.model.threads_or_all();
        let mut kinds = Vec::new();
        for spec in args.peer.specs(args.mesh.draft_model.as_deref())? {
            let config = if spec.types.is_empty() {
                Config::PeerPlain
            } else {
                // Leaked once per configuration: names live for the whole run.
                Config::Peer(Box::leak(spec.name().into_boxed_str()))
            };
            kinds.push((config, spec));
        }
        let mut peers = Vec::new();
        for (config, spec) in kinds {
            eprintln!("starting {}", config.name());
            let p = peer::Peer::start(
                &dir,
                &args.model.path()?,
                threads,
                args.model.load_tokenizer()?,
                &spec,
            )?;
            peers.push((config, p));
        }
        peers
    } else {
        Vec::new()
    };
    let questions = args.select.load()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mesh = if args.up {
            let layout = Layout::new(&args.model, &args.mesh, Front::loopback())?;
            Some(Mesh::start(layout).await?)
        } else {
            None
        };
        let url = match (&args.gateway, &mesh) {
            (Some(u), _) => u.clone(),
            (None, Some(m)) => m.gateway.url(),
            (None, None) => bail!("pass --gateway URL or --up"),
        };
        if let Some(m) = &mesh
            && let Some(p) = m.proxies.first()
        {
            let measured = specmesh_harness::launch::measure_rtt(&format!("http://{}", p.addr()), 21).await?;
            println!(
                "drafter link: {} via {}, +{:.1} ms added, health-check round trip {:.2} ms (median of 21)",
                p.upstream(),
                args.mesh.link.drafter_netns.as_deref().unwrap_or("this namespace"),
                p.rtt().as_secs_f64() * 1e3,
                measured.as_secs_f64() * 1e3
            );
        }
        let result = bench(&args, &questions, &url, peers).await;
        if let Some(m) = mesh {
            m.stop().await?;
        }
        result
    })
}

async fn bench(
    args: &Args,
    questions: &[Question],
    url: &str,
    mut peers: Vec<(Config, peer::Peer)>,
) -> Result<()> {
    let mut client = GenerationClient::connect(url.to_string())
        .await
        .with_context(|| format!("connecting to the gateway at {url}"))?;
    let local = if args.in_process {
        Some(in_process::InProcess::load(&args.model)?)
    } else {
        None
    };
    let mut configs = if !args.configs.is_empty() {
        let mut c = args.configs.clone();
        if !c.contains(&Config::Off) {
            // Every output is checked against plain decoding.
            c.insert(0, Config::Off);
        }
        c
    } else if args.mesh.draft_model.is_some() {
        vec![
            Config::Off,
            Config::Auto,
            Config::ModelFree,
            Config::DraftModel,
            Config::Combined,
        ]
    } else {
        vec![Config::Off, Config::Auto]
    };
    if local.is_some() {
        configs.extend([Config::InProcessOff, Config::InProcessAuto]);
    }
    configs.extend(peers.iter().map(|(c, _)| *c));
    let levels: Vec<usize> = args
        .concurrency
        .iter()
        .copied()
        .filter(|&n| n > 1)
        .collect();
    let total = questions.len() * configs.len()
        + levels
            .iter()
            .map(|&n| args.sweep_configs.len() * sweep::waves(questions.len(), n))
            .sum::<usize>();
    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    // A fresh tenant per bench run: the drafter's cross-session index must
    // not remember an earlier run's answers to the same prompts.
    let tenant = format!(
        "bench-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );

    // Warm-up: caches, connections, page faults. Not counted.
    bar.set_message("warm-up");
    gateway::request(
        &mut client,
        &questions[0],
        Config::Off,
        args.max_new_tokens,
        "warm-up",
    )
    .await?;
    for (c, p) in peers.iter_mut() {
        tokio::task::block_in_place(|| p.run(&questions[0], *c, args.max_new_tokens))?;
    }

    let mut runs = Vec::new();
    let mut reference: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut mismatches = Vec::new();
    let mut peer_agreement = 0;
    for (i, q) in questions.iter().enumerate() {
        let mut by_config = BTreeMap::new();
        for &c in &configs {
            bar.set_message(format!("{} {}", q.category, c.name()));
            let r = match c {
                c if c.via_gateway() => {
                    // A tenant per configuration: one must not draft from
                    // another's answer to the same prompt.
                    let tenant = format!("{tenant}-c1-{}", c.name());
                    gateway::request(&mut client, q, c, args.max_new_tokens, &tenant).await?
                }
                Config::InProcessOff | Config::InProcessAuto => local
                    .as_ref()
                    .expect("in-process model")
                    .run(q, c, args.max_new_tokens)?,
                _ => {
                    let (_, p) = peers
                        .iter_mut()
                        .find(|(pc, _)| *pc == c)
                        .expect("a server per peer configuration");
                    tokio::task::block_in_place(|| p.run(q, c, args.max_new_tokens))?
                }
            };
            by_config.insert(c, r);
            bar.inc(1);
        }
        let off = by_config[&Config::Off].tokens.clone();
        for (c, r) in &by_config {
            if c.must_match() && r.tokens != off {
                mismatches.push(format!(
                    "{} ({}): {} differs from off",
                    q.id(),
                    q.category,
                    c.name()
                ));
            }
        }
        if by_config
            .get(&Config::PeerPlain)
            .is_some_and(|r| r.tokens == off)
        {
            peer_agreement += 1;
        }
        let line: Vec<String> = by_config
            .values()
            .map(|r| {
                format!(
                    "{} {:.1}",
                    r.config.name(),
                    r.completion_tokens as f64 / r.wall_seconds
                )
            })
            .collect();
        bar.suspend(|| {
            eprintln!(
                "[{}/{}] {:<14} tok/s: {}",
                i + 1,
                questions.len(),
                q.category,
                line.join("  ")
            )
        });
        reference.insert(q.id(), off);
        runs.extend(by_config.into_values());
    }

    let mut waves = Vec::new();
    for &n in &levels {
        for w in 0..sweep::waves(questions.len(), n) {
            for &c in &args.sweep_configs {
                bar.set_message(format!("concurrency {n}, wave {}, {}", w + 1, c.name()));
                let wave =
                    sweep::wave(&client, questions, n, w, c, args.max_new_tokens, &tenant).await?;
                for r in &wave.runs {
                    if reference.get(&r.question) != Some(&r.tokens) {
                        mismatches.push(format!(
                            "{} ({}): {} at concurrency {n} differs from off at concurrency 1",
                            r.question,
                            r.category,
                            c.name()
                        ));
                    }
                }
                waves.push(wave);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();

    let summary = report::summarize(&runs, &configs, &waves);
    let tables = report::tables(&summary, &configs);
    for t in &tables {
        println!("\n{}", t.text());
    }
    let peer_line = peers.first().map(|(_, p)| {
        format!(
            "peer: {}; its greedy output equals ours on {peer_agreement} of {} prompts",
            p.server.version,
            questions.len()
        )
    });
    if let Some(line) = &peer_line {
        println!("{line}");
    }
    if let Some(path) = &args.markdown {
        let mut md: Vec<String> = tables.iter().map(|t| t.markdown()).collect();
        md.extend(peer_line.clone());
        std::fs::write(path, md.join("\n") + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        plot::write(path, &summary)?;
        eprintln!("plot written to {}", path.display());
    }
    let report = Report {
        max_new_tokens: args.max_new_tokens,
        questions: questions.len(),
        peer: peers.first().map(|(_, p)| p.server.version.clone()),
        mismatches: mismatches.clone(),
        peer_agreement: (!peers.is_empty()).then_some(peer_agreement),
        summary,
        runs,
        waves,
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
            "{} outputs differ from plain decoding: speculation or batching changed the answer",
            mismatches.len()
        );
    }
    Ok(())
}
