//! `specmesh up`: the whole system on loopback, each service its own
//! process talking real gRPC, until Ctrl-C.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use specmesh_bench::launch::Mesh;
use specmesh_bench::local::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The gateway's address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Verifier processes.
    #[arg(long, default_value_t = 1)]
    verifiers: usize,
    /// Drafter processes (0: no speculation).
    #[arg(long, default_value_t = 1)]
    drafters: usize,
    /// Seconds to wait for each service to start (loading the model and
    /// measuring its cost curve take a few).
    #[arg(long, default_value_t = 120)]
    start_timeout_secs: u64,
}

pub fn run(args: Args) -> Result<()> {
    let model = args.model.path()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mesh = Mesh::start(
            model,
            args.model.threads,
            args.listen,
            args.verifiers,
            args.drafters,
            Duration::from_secs(args.start_timeout_secs),
        )
        .await?;
        for s in mesh.verifiers.iter().chain(&mesh.drafters) {
            println!("{} at {} (pid {})", s.name, s.url(), s.pid().unwrap_or(0));
        }
        println!("specmesh up: gateway listening on {}", mesh.gateway.addr);
        println!("stop with Ctrl-C");
        specmesh_server::shutdown::signal().await;
        mesh.stop().await
    })
}
