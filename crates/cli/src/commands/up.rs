//! `specmesh up`: the whole system on loopback, each service its own
//! process talking real gRPC, until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::launch::{Service, wait_healthy};
use crate::local::ModelArgs;

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

/// The started system.
#[derive(Debug)]
pub struct Mesh {
    pub verifiers: Vec<Service>,
    pub drafters: Vec<Service>,
    pub gateway: Service,
}

impl Mesh {
    pub async fn start(
        model: PathBuf,
        threads: Option<usize>,
        listen: SocketAddr,
        verifiers: usize,
        drafters: usize,
        timeout: Duration,
    ) -> Result<Mesh> {
        anyhow::ensure!(verifiers >= 1, "`--verifiers` must be >= 1");
        let model_arg = model.display().to_string();
        let mut vs = Vec::new();
        for _ in 0..verifiers {
            let mut args = vec![
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--model".into(),
                model_arg.clone(),
            ];
            if let Some(t) = threads {
                args.extend(["--threads".into(), t.to_string()]);
            }
            vs.push(Service::start("specmesh-verifier", &args, timeout).await?);
        }
        let mut ds = Vec::new();
        for _ in 0..drafters {
            ds.push(
                Service::start(
                    "specmesh-drafter",
                    &["--listen".into(), "127.0.0.1:0".into()],
                    timeout,
                )
                .await?,
            );
        }
        let mut args = vec![
            "--listen".into(),
            listen.to_string(),
            "--model".into(),
            model_arg,
            "--verifiers".into(),
            vs.iter().map(Service::url).collect::<Vec<_>>().join(","),
        ];
        if !ds.is_empty() {
            args.extend([
                "--drafters".into(),
                ds.iter().map(Service::url).collect::<Vec<_>>().join(","),
            ]);
        }
        let gateway = Service::start("specmesh-gateway", &args, timeout).await?;
        for s in vs.iter().chain(&ds).chain([&gateway]) {
            wait_healthy(&s.url(), timeout).await?;
        }
        Ok(Mesh {
            verifiers: vs,
            drafters: ds,
            gateway,
        })
    }

    /// Gateway first (no new requests), then the rest.
    pub async fn stop(self) -> Result<()> {
        let grace = Duration::from_secs(10);
        self.gateway.stop(grace).await?;
        for s in self.drafters.into_iter().chain(self.verifiers) {
            s.stop(grace).await?;
        }
        Ok(())
    }
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
