//! The agents' workloads of `specmesh bench-serve --agentic N`, over the
//! OpenAI front: JSON extraction under a JSON schema (`--agentic-workload
//! json`: a document in, its title, topics, entities, sentiment and summary
//! out, `response_format: json_schema`), and a support agent's tool use
//! (`tools`: a catalogue of six tools in the prompt; a call forced by
//! `tool_choice: "required"`, its canned result fed back, a second forced
//! call and its result, then the final answer with `auto`). Our
//! speculation on (`auto`) and off run beside llama.cpp's `llama-server`
//! (`--peer`: the same `response_format` and `tools`, its own grammar
//! path), task by task, the order of the targets rotating, so drift hits
//! every target alike.
//!
//! Reported per target: output tokens per second over every request
//! (completion tokens over the requests' seconds, one request at a time),
//! the tokens our grammar forced, and how many constrained answers that
//! finished parse and follow their schema (JSON) or call a catalogue tool
//! with its required arguments (tools); then the ratios of ours to our
//! speculation off and to llama.cpp's fastest configuration.

mod drive;
mod tasks;

use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;
use specmesh_harness::grpc::Connection;
use specmesh_harness::launch::Mesh;
use specmesh_harness::layout::{Front, Layout, MeshArgs};
use specmesh_harness::model::ModelArgs;

use crate::client::{Client, Mode, Transport};
use crate::llama_cpp::PeerArgs;
use crate::llama_cpp::server::{Server, Slots};
use crate::specbench;
use crate::table::Table;
use drive::{Target, TargetStats};

/// Which agent workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Extract fields from a document under a JSON schema.
    Json,
    /// A tool-using agent: two forced calls with their results, then the
    /// answer.
    Tools,
}

/// The agent workloads' flags.
#[derive(clap::Args, Debug, Clone)]
pub struct AgenticArgs {
    /// Run N agent tasks (see --agentic-workload) over the OpenAI front
    /// instead of one-shot prompts.
    #[arg(long, default_value_t = 0)]
    pub agentic: usize,
    /// json: extraction under a JSON schema; tools: a tool-using agent.
    #[arg(long, value_enum, default_value = "json")]
    pub agentic_workload: Workload,
    /// The Spec-Bench file the documents come from.
    #[arg(long, default_value_os_t = specbench::default_path())]
    pub agentic_questions: PathBuf,
}

impl AgenticArgs {
    pub fn enabled(&self) -> bool {
        self.agentic > 0
    }
}

/// What the command was given.
pub struct Setup<'a> {
    pub model: &'a ModelArgs,
    /// `Some`: start this mesh for the run (`--up`).
    pub up: Option<&'a MeshArgs>,
    /// Without `--up`: the gateway's OpenAI front.
    pub http: Option<Connection>,
    pub peer: &'a PeerArgs,
    pub args: &'a AgenticArgs,
    pub max_new: u32,
    pub json: Option<&'a std::path::Path>,
}

/// Runs the agent workload per `setup`.
pub async fn run(setup: Setup<'_>) -> Result<()> {
    let args = setup.args;
    ensure!(
        setup.max_new >= 16,
        "`--max-new-tokens` must be at least 16 for agent tasks"
    );
    let questions = specbench::read(&args.agentic_questions, "--agentic-questions")?;
    let documents = tasks::documents(&questions, args.agentic);
    ensure!(
        documents.len() == args.agentic,
        "{} holds no summarization, rag, qa or extraction questions",
        args.agentic_questions.display()
    );
    // The peers first: a missing build fails before the mesh starts.
    let mut peers = Vec::new();
    if setup.peer.peer {
        let bin_dir = setup.peer.bin_dir();
        let model = setup.model.path()?;
        let threads = setup.model.threads_or_all();
        for spec in setup.peer.specs(None)? {
            if spec.draft_model.is_some() {
                continue;
            }
            let server = Server::start(
                &bin_dir,
                &model,
                threads,
                &spec,
                Slots {
                    parallel: 1,
                    context: 8192,
                },
            )?;
            let client = Client::llama_server(&server.url).await?;
            peers.push((spec.name(), client, server));
        }
    }
    let mesh = match setup.up {
        Some(mesh_args) => {
            let front = Front {
                http: Some(([127, 0, 0, 1], 0).into()),
                ..Front::loopback()
            };
            Some(Mesh::start(Layout::new(setup.model, mesh_args, front)?).await?)
        }
        None => None,
    };
    let http = match &mesh {
        Some(m) => m.gateway.http.clone().map(Connection::plain),
        None => setup.http.clone(),
    };
    let result = async {
        let http =
            http.context("the agent workloads run over the OpenAI front: pass --up or --http URL")?;
        let ours = Client::connect(Transport::Http, http).await?;
        let mut targets = vec![
            Target::ours("specmesh auto", ours.clone(), Mode::Auto),
            Target::ours("specmesh off", ours, Mode::Off),
        ];
        for (name, client, _) in &peers {
            targets.push(Target::peer(name, client.clone()));
        }
        let mut stats: Vec<TargetStats> = targets
            .iter()
            .map(|t| TargetStats::new(&t.name, t.peer))
            .collect();
        for (i, document) in documents.iter().enumerate() {
            // Rotate who goes first.
            for k in 0..targets.len() {
                let t = (i + k) % targets.len();
                let outcome = match args.agentic_workload {
                    Workload::Json => drive::extraction(&targets[t], document, setup.max_new).await,
                    Workload::Tools => drive::agent(&targets[t], i, document, setup.max_new).await,
                };
                match outcome {
                    Ok(o) => stats[t].totals.add(&o),
                    Err(e) if targets[t].peer => stats[t].failures.push(format!("task {i}: {e:#}")),
                    Err(e) => return Err(e.context(format!("task {i} on {}", targets[t].name))),
                }
            }
            eprintln!("agent task {} of {} done", i + 1, documents.len());
        }
        report(args, setup.max_new, &stats, setup.json)
    }
    .await;
    drop(peers);
    if let Some(m) = mesh {
        m.stop().await?;
    }
    result
}

/// Prints the table and ratios; writes `--json`.
fn report(
    args: &AgenticArgs,
    max_new: u32,
    stats: &[TargetStats],
    json_path: Option<&std::path::Path>,
) -> Result<()> {
    let mut table = Table::new(&[
        "target", "requests", "tokens", "seconds", "tok/s", "forced", "valid", "failed",
    ]);
    for s in stats {
        table.row(vec![
            s.name.clone(),
            s.totals.requests.to_string(),
            s.totals.tokens.to_string(),
            format!("{:.1}", s.totals.seconds),
            format!("{:.2}", s.totals.tokens_per_second()),
            s.totals.forced.to_string(),
            format!("{}/{}", s.totals.valid, s.totals.checked),
            s.failures.len().to_string(),
        ]);
    }
    let workload = match args.agentic_workload {
        Workload::Json => "JSON-extraction",
        Workload::Tools => "tool-using agent",
    };
    println!(
        "\n{} {workload} tasks, at most {max_new} new tokens per request, one request at a time",
        args.agentic
    );
    print!("{}", table.text());
    let auto = stats[0].totals.tokens_per_second();
    let off = stats[1].totals.tokens_per_second();
    let best_peer = stats
        .iter()
        .filter(|s| s.peer && s.failures.is_empty())
        .max_by(|a, b| {
            a.totals
                .tokens_per_second()
                .total_cmp(&b.totals.tokens_per_second())
        });
    println!("specmesh auto / off: {:.2}x", auto / off);
    if let Some(p) = best_peer {
        println!(
            "specmesh auto / {}: {:.2}x",
            p.name,
            auto / p.totals.tokens_per_second()
        );
    }
    let ours_invalid: usize = stats
        .iter()
        .filter(|s| !s.peer)
        .map(|s| s.totals.checked - s.totals.valid)
        .sum();
    if let Some(path) = json_path {
        let v = json!({
            "workload": args.agentic_workload,
            "tasks": args.agentic,
            "max_new_tokens": max_new,
            "targets": stats,
            "auto_over_off": auto / off,
            "auto_over_best_peer": best_peer.map(|p| json!({"peer": p.name, "ratio": auto / p.totals.tokens_per_second()})),
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if ours_invalid > 0 {
        bail!("{ours_invalid} of our constrained answers that finished do not follow their schema");
    }
    Ok(())
}
