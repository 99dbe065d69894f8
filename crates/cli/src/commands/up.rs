//! `specmesh up`: the whole system on loopback, each service its own
//! process talking real gRPC, until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use specmesh_bench::launch::{Layout, Mesh};
use specmesh_bench::link::LinkArgs;
use specmesh_bench::local::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The gateway's address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// The gateway's OpenAI-compatible HTTP front (`/v1/chat/completions`,
    /// `/v1/completions`, `/v1/models`), e.g. 127.0.0.1:8080; unset: none.
    #[arg(long)]
    http_listen: Option<SocketAddr>,
    /// Verifier processes.
    #[arg(long, default_value_t = 1)]
    verifiers: usize,
    /// Drafter processes (0: no speculation).
    #[arg(long, default_value_t = 1)]
    drafters: usize,
    /// The drafters' draft model: a catalog name (`specmesh model list`) or
    /// a GGUF file; of the target's vocabulary, or of another that drafts
    /// through text (e.g. smollm2-135m for qwen2.5-coder-1.5b; checked at
    /// start); unset: model-free drafting only.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// Seconds to wait for each service to start (loading the model and
    /// measuring its cost curve take a few).
    #[arg(long, default_value_t = 120)]
    start_timeout_secs: u64,
    /// The verifiers' CPU cores (`--cpus`), e.g. `0`.
    #[arg(long)]
    verifier_cpus: Option<String>,
    /// The drafters' CPU cores (`--cpus`), e.g. `1`.
    #[arg(long)]
    drafter_cpus: Option<String>,
    /// The draft model's compute threads (default: every core the drafter
    /// may use).
    #[arg(long, requires = "draft_model")]
    drafter_threads: Option<usize>,
    /// The drafters draft the draft model's next tree while the verifier
    /// verifies the last (`specmesh-drafter --draft-ahead`); pays when the
    /// drafters have cores of their own (`--drafter-cpus`).
    #[arg(long, requires = "draft_model")]
    draft_ahead: bool,
    /// The draft model scores only its N most frequent tokens
    /// (`specmesh-drafter --draft-head-tokens`; 0: all).
    #[arg(long, requires = "draft_model")]
    draft_head_tokens: Option<usize>,
    /// The drafters as a separate host: another network namespace, an
    /// added round trip (`tools/bench/netns.sh` makes the namespace).
    #[command(flatten)]
    link: LinkArgs,
}

pub fn run(args: Args) -> Result<()> {
    let model = args.model.path()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mesh = Mesh::start(Layout {
            model,
            threads: args.model.threads,
            isa: args.model.isa,
            listen: args.listen,
            verifiers: args.verifiers,
            drafters: args.drafters,
            draft_model: args.draft_model,
            verifier_cpus: args.verifier_cpus,
            drafter_cpus: args.drafter_cpus,
            drafter_threads: args.drafter_threads,
            draft_ahead: args.draft_ahead,
            draft_head_tokens: args.draft_head_tokens,
            link: args.link,
            metrics: true,
            http: args.http_listen,
            timeout: Duration::from_secs(args.start_timeout_secs),
        })
        .await?;
        let verifiers = mesh.verifiers.iter().map(|s| (s, s.url()));
        let urls = verifiers.chain(mesh.drafters.iter().zip(mesh.dialed.iter().cloned()));
        for (s, url) in urls {
            println!(
                "{} at {} (pid {}) metrics {}",
                s.name,
                url,
                s.pid().unwrap_or(0),
                s.metrics.as_deref().unwrap_or("-")
            );
        }
        println!(
            "specmesh-gateway at {} (pid {}) metrics {}",
            mesh.gateway.url(),
            mesh.gateway.pid().unwrap_or(0),
            mesh.gateway.metrics.as_deref().unwrap_or("-")
        );
        if let Some(http) = &mesh.gateway.http {
            println!("specmesh-gateway http at {http} (OpenAI-compatible)");
        }
        println!("specmesh up: gateway listening on {}", mesh.gateway.addr);
        println!("stop with Ctrl-C");
        specmesh_server::shutdown::signal().await;
        mesh.stop().await
    })
}
