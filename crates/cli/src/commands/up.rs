//! `specmesh up`: the whole system on loopback, each service its own
//! process talking real gRPC, until Ctrl-C.

use std::net::SocketAddr;

use anyhow::Result;
use specmesh_harness::launch::Mesh;
use specmesh_harness::layout::{Front, Layout, MeshArgs};
use specmesh_harness::model::ModelArgs;

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
    #[command(flatten)]
    mesh: MeshArgs,
}

pub fn run(args: Args) -> Result<()> {
    let front = Front {
        listen: args.listen,
        http: args.http_listen,
        metrics: true,
    };
    let layout = Layout::new(&args.model, &args.mesh, front)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mesh = Mesh::start(layout).await?;
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
