//! `specmesh bench-serve`: an open-loop serving benchmark, after `vllm
//! bench serve`, speculation off against auto.
//!
//! Requests arrive on their own schedule ([`arrivals`]: Poisson, or gamma
//! with a burstiness, at each `--request-rate`), whether or not the earlier
//! ones have finished, optionally capped by `--max-concurrency` (an arrival
//! then waits for a slot, and is timed from when it is sent). For each rate
//! the passes run off, auto, then auto, off, and so on (`--repeats` of
//! each, the order turned at every repetition) on the same prompts and the
//! same arrival times, so drift hits both alike: a machine slowing or
//! speeding up through the run favours neither mode. Each pass is its own
//! tenant, so the drafter never drafts from an earlier pass's answers.
//! Before the first pass a warm-up sends a pass's concurrency of requests
//! (at most 16 without `--max-concurrency`) in each mode, uncounted: the
//! first measured pass would otherwise pay for the mesh's page faults and
//! the planner's first lessons alone. Every greedy output must equal the
//! first output without speculation of the same prompt: a difference is a
//! failure (non-zero exit). What is measured is [`stats`]; what is
//! printed, written and plotted is [`report`].

mod arrivals;
mod report;
mod stats;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::client::{Client, Completion, Mode, Output, Transport};
use crate::conversation::ConversationArgs;
use crate::conversation::command::Setup;
use crate::llama_cpp::PeerArgs;
use crate::specbench::{Question, Selection};
use arrivals::Rate;
use specmesh_harness::grpc::Connection;
use specmesh_harness::launch::Mesh;
use specmesh_harness::layout::{Front, Layout, MeshArgs};
use specmesh_harness::model::ModelArgs;
use stats::Slo;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["gateway", "http", "up"])))]
pub struct Args {
    // With --up: the model to serve.
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    select: Selection,
    /// A running gateway's gRPC API, e.g. http://127.0.0.1:50051.
    #[arg(long, env = "SPECMESH_GATEWAY")]
    gateway: Option<String>,
    /// A running gateway's OpenAI-compatible HTTP front (its
    /// `--http-listen`), e.g. http://127.0.0.1:8080: streamed chat
    /// completions, speculation in the `speculation` body field.
    #[arg(long)]
    http: Option<String>,
    /// Start verifier, drafter and gateway on loopback for the run.
    #[arg(long)]
    up: bool,
    // With --up: the mesh to start.
    #[command(flatten)]
    mesh: MeshArgs,
    // The conversation workload (`--conversations N`) instead of one-shot
    // prompts at request rates.
    #[command(flatten)]
    conversation: ConversationArgs,
    // The agent workloads (`--agentic N`): JSON extraction or tool use.
    #[command(flatten)]
    agentic: crate::agentic::AgenticArgs,
    // llama.cpp's llama-server beside ours, with `--conversations` or
    // `--agentic`.
    #[command(flatten)]
    peer: PeerArgs,
    /// With --up: which of the gateway's APIs the requests use.
    #[arg(
        long,
        value_enum,
        default_value_t = Transport::Grpc,
        requires = "up",
        conflicts_with = "conversations"
    )]
    transport: Transport,
    /// The API key to send (`authorization: Bearer KEY`). The key fixes
    /// the tenant, so the passes then share one drafter index.
    #[arg(long, env = "SPECMESH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Connect over TLS, trusting this CA file (PEM).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// With --tls-ca: the name the gateway's certificate carries (default:
    /// the URL's host).
    #[arg(long, requires = "tls_ca")]
    tls_name: Option<String>,
    /// Request rates to run, in requests per second; `inf` sends every
    /// request at once.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = Rate::parse,
        default_value = "inf",
        conflicts_with = "conversations"
    )]
    request_rate: Vec<Rate>,
    /// Shape of the gamma-distributed inter-arrival times (mean 1/rate): 1
    /// is Poisson, larger is more regular, smaller burstier.
    #[arg(long, value_parser = arrivals::parse_burstiness, default_value_t = 1.0, conflicts_with = "conversations")]
    burstiness: f64,
    /// Seed of the arrival times (the same for off and auto).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Requests per pass (one rate, one mode), the selected questions in
    /// order, cycled (default: each selected question once).
    #[arg(long, conflicts_with = "conversations")]
    num_prompts: Option<usize>,
    /// At most this many requests in flight; later arrivals wait for a slot
    /// (default: no limit).
    #[arg(long, conflicts_with = "conversations")]
    max_concurrency: Option<usize>,
    /// New tokens per request (greedy).
    #[arg(long, default_value_t = 128)]
    max_new_tokens: u32,
    /// Passes of each mode per rate, interleaved off, auto, auto, off, …
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Count the requests meeting every bound, in milliseconds, as goodput:
    /// e.g. `ttft:500,tpot:50` (also `e2el:MS`).
    #[arg(long, value_parser = Slo::parse, conflicts_with = "conversations")]
    goodput: Option<Slo>,
    /// Write a record per pass (vllm bench serve's field names) as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write output tok/s and p99 TPOT against the request rate as an SVG.
    #[arg(long, conflicts_with = "conversations")]
    plot: Option<PathBuf>,
}

/// One pass: the requests of one mode at one rate.
#[derive(Debug)]
pub struct Pass {
    pub rate: Rate,
    pub mode: Mode,
    /// 1-based.
    pub repeat: usize,
    /// Seconds from the first arrival to the last completion.
    pub duration: f64,
    /// By prompt index (into the selected questions).
    pub done: Vec<(usize, Completion)>,
    pub failures: Vec<String>,
    /// Outputs differing from the prompt's first output without speculation.
    pub mismatches: usize,
}

impl Pass {
    pub fn completed(&self) -> impl Iterator<Item = &Completion> {
        self.done.iter().map(|(_, c)| c)
    }
}

pub fn run(args: Args) -> Result<()> {
    let connection = |url: &String| Connection {
        url: url.clone(),
        api_key: args.api_key.clone(),
        tls_ca: args.tls_ca.clone(),
        tls_name: args.tls_name.clone(),
    };
    if args.agentic.enabled() {
        ensure!(
            !args.conversation.enabled(),
            "`--agentic` and `--conversations` are two workloads: run one at a time"
        );
        let rt = tokio::runtime::Runtime::new()?;
        return rt.block_on(crate::agentic::run(crate::agentic::Setup {
            model: &args.model,
            up: args.up.then_some(&args.mesh),
            http: args.http.as_ref().map(connection),
            peer: &args.peer,
            args: &args.agentic,
            max_new: args.max_new_tokens,
            json: args.json.as_deref(),
        }));
    }
    if args.conversation.enabled() {
        let rt = tokio::runtime::Runtime::new()?;
        return rt.block_on(crate::conversation::command::run(Setup {
            model: &args.model,
            up: args.up.then_some(&args.mesh),
            draft_model: args.mesh.draft_model.as_deref(),
            grpc: args.gateway.as_ref().map(connection),
            http: args.http.as_ref().map(connection),
            peer: &args.peer,
            args: &args.conversation,
            max_new: args.max_new_tokens,
            repeats: args.repeats,
            json: args.json.as_deref(),
        }));
    }
    ensure!(
        !args.peer.peer,
        "`--peer` runs with `--conversations N` or `--agentic N`; the open-loop passes run against specmesh only"
    );
    let questions = args.select.load()?;
    let n = args.num_prompts.unwrap_or(questions.len());
    ensure!(n >= 1, "`--num-prompts` must be >= 1");
    ensure!(args.repeats >= 1, "`--repeats` must be >= 1");
    ensure!(args.max_new_tokens >= 1, "`--max-new-tokens` must be >= 1");
    ensure!(
        args.max_concurrency != Some(0),
        "`--max-concurrency` must be >= 1"
    );
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let transport = if args.http.is_some() {
            Transport::Http
        } else {
            args.transport
        };
        let mesh = if args.up {
            let front = Front {
                http: (transport == Transport::Http).then(|| ([127, 0, 0, 1], 0).into()),
                ..Front::loopback()
            };
            let layout = Layout::new(&args.model, &args.mesh, front)?;
            Some(Mesh::start(layout).await?)
        } else {
            None
        };
        let url = match (&args.gateway, &args.http, &mesh, transport) {
            (Some(u), _, _, _) | (_, Some(u), _, _) => u.clone(),
            (_, _, Some(m), Transport::Grpc) => m.gateway.url(),
            (_, _, Some(m), Transport::Http) => m
                .gateway
                .http
                .clone()
                .context("the gateway did not say where its HTTP front listens")?,
            (None, None, None, _) => bail!("pass --gateway URL, --http URL or --up"),
        };
        let connection = Connection {
            url,
            api_key: args.api_key.clone(),
            tls_ca: args.tls_ca.clone(),
            tls_name: args.tls_name.clone(),
        };
        let result = bench(&args, &questions, n, transport, connection).await;
        if let Some(m) = mesh {
            m.stop().await?;
        }
        result
    })
}

async fn bench(
    args: &Args,
    questions: &[Question],
    n: usize,
    transport: Transport,
    connection: Connection,
) -> Result<()> {
    let keyed = connection.api_key.is_some();
    let client = Client::connect(transport, connection).await?;
    // A tenant per pass: no pass drafts from another's answers to the same
    // prompts. A key fixes its tenant, so with one they share it.
    let run_id = format!(
        "serve-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );
    if keyed {
        eprintln!(
            "warning: with --api-key every pass runs as the key's tenant: later passes may draft from earlier passes' answers"
        );
    }
    let tenant = |what: &str| {
        if keyed {
            String::new()
        } else {
            format!("{run_id}-{what}")
        }
    };
    // Warm-up: connections, caches, page faults at the pass's
    // concurrency (16 for an open loop without a cap), and in auto the
    // planner's first lessons. Not counted.
    let width = args.max_concurrency.unwrap_or(WARM_UP_WIDTH).min(n).max(1);
    let warming = std::time::Instant::now();
    for mode in [Mode::Off, Mode::Auto] {
        let sends = questions.iter().take(width).enumerate().map(|(i, q)| {
            let (client, tenant) = (client.clone(), tenant(&format!("warm-up-{i}")));
            let prompt = q.prompt().to_owned();
            let max_new = args.max_new_tokens;
            tokio::spawn(async move { client.send(&prompt, mode, max_new, &tenant).await })
        });
        let sends: Vec<_> = sends.collect();
        for s in sends {
            s.await
                .context("the warm-up task")?
                .context("a warm-up request")?;
        }
    }
    eprintln!(
        "warm-up: {width} requests in each mode in {:.1} s (not counted)",
        warming.elapsed().as_secs_f64()
    );

    let setup = report::Setup {
        burstiness: args.burstiness,
        max_concurrency: args.max_concurrency,
        slo: args.goodput,
    };
    let mut passes = Vec::new();
    let mut reference: BTreeMap<usize, Output> = BTreeMap::new();
    let mut mismatches = Vec::new();
    for (r, &rate) in args.request_rate.iter().enumerate() {
        for repeat in 1..=args.repeats {
            // The same arrival times for off and auto.
            let seed = args.seed.wrapping_add(((r as u64) << 32) + repeat as u64);
            let schedule = arrivals::schedule(rate, args.burstiness, seed, n);
            for mode in arrivals::pass_order(repeat) {
                let plan = Plan {
                    rate,
                    mode,
                    repeat,
                    schedule: &schedule,
                    tenant: tenant(&format!("r{r}-{}-{repeat}", mode.name())),
                };
                let mut p = pass(&client, questions, &plan, args).await;
                for (q, c) in &p.done {
                    if mode == Mode::Off {
                        reference.entry(*q).or_insert_with(|| c.output.clone());
                    }
                    if reference.get(q).is_some_and(|first| *first != c.output) {
                        p.mismatches += 1;
                        mismatches.push(format!(
                            "{} ({}): {} at rate {}, repeat {repeat}, differs from the first output without speculation",
                            questions[*q].id(),
                            questions[*q].category,
                            mode.name(),
                            rate.label()
                        ));
                    }
                }
                eprintln!(
                    "rate {} repeat {repeat}/{} {}: {} completed, {} failed in {:.1} s",
                    rate.label(),
                    args.repeats,
                    mode.name(),
                    p.done.len(),
                    p.failures.len(),
                    p.duration,
                );
                if let Some(e) = p.failures.first() {
                    if p.done.is_empty() {
                        bail!("every request of the pass failed; the first: {e}");
                    }
                    eprintln!("  first failure: {e}");
                }
                passes.push(p);
            }
        }
    }

    for &rate in &args.request_rate {
        let at: Vec<&Pass> = passes.iter().filter(|p| p.rate == rate).collect();
        println!(
            "\nrequest rate {} req/s, burstiness {}, max concurrency {}, {n} prompts x {} repeats, {} transport",
            rate.label(),
            args.burstiness,
            args.max_concurrency
                .map_or("unlimited".to_owned(), |c| c.to_string()),
            args.repeats,
            match transport {
                Transport::Grpc => "gRPC",
                Transport::Http => "HTTP",
            },
        );
        print!("{}", report::table(&at, &setup).text());
        if let Some(line) = report::repeat_ratios(&at, setup.slo.as_ref()) {
            println!("{line}");
        }
    }
    println!(
        "\ngreedy mismatches: {} (every output against the first output without speculation of its prompt)",
        mismatches.len()
    );
    if let Some(path) = &args.json {
        let out = json!({
            "transport": match transport { Transport::Grpc => "grpc", Transport::Http => "http" },
            "num_prompts": n,
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "repeats": args.repeats,
            "goodput": args.goodput.map(|s| json!({"ttft_ms": s.ttft_ms, "tpot_ms": s.tpot_ms, "e2el_ms": s.e2el_ms})),
            "mismatches": mismatches.len(),
            "results": passes.iter().map(|p| report::record(p, &setup)).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        report::plot(path, &args.request_rate, &passes, &setup)?;
        eprintln!("plot written to {}", path.display());
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

/// Requests sent at once in each mode before the first pass when
/// `--max-concurrency` does not say how many run at once.
const WARM_UP_WIDTH: usize = 16;

/// What one pass sends, and when.
struct Plan<'a> {
    rate: Rate,
    mode: Mode,
    repeat: usize,
    /// Each request's arrival, from the start of the pass.
    schedule: &'a [Duration],
    /// The pass's tenant (empty: the caller's own).
    tenant: String,
}

/// Sends the requests of `plan` at their arrival times, the questions in
/// order and cycled, and waits for all of them.
async fn pass(client: &Client, questions: &[Question], plan: &Plan<'_>, args: &Args) -> Pass {
    let slots = args.max_concurrency.map(|c| Arc::new(Semaphore::new(c)));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(plan.schedule.len());
    for (i, &at) in plan.schedule.iter().enumerate() {
        tokio::time::sleep_until(start + at).await;
        let q = i % questions.len();
        let (client, slots) = (client.clone(), slots.clone());
        let prompt = questions[q].prompt().to_owned();
        // A prompt's second use in the pass must not draft from its first.
        let tenant = match i / questions.len() {
            _ if plan.tenant.is_empty() => String::new(),
            0 => plan.tenant.clone(),
            cycle => format!("{}-c{cycle}", plan.tenant),
        };
        let (mode, max_new) = (plan.mode, args.max_new_tokens);
        tasks.push(tokio::spawn(async move {
            let _slot = match slots {
                Some(s) => Some(
                    s.acquire_owned()
                        .await
                        .expect("the semaphore is never closed"),
                ),
                None => None,
            };
            (q, client.send(&prompt, mode, max_new, &tenant).await)
        }));
    }
    let (mut done, mut failures) = (Vec::new(), Vec::new());
    for t in tasks {
        match t.await {
            Ok((q, Ok(c))) => done.push((q, c)),
            Ok((_, Err(e))) => failures.push(format!("{e:#}")),
            Err(e) => failures.push(format!("the request task failed: {e}")),
        }
    }
    Pass {
        rate: plan.rate,
        mode: plan.mode,
        repeat: plan.repeat,
        duration: start.elapsed().as_secs_f64(),
        done,
        failures,
        mismatches: 0,
    }
}
