//! The process around the service: bind, serve (Drafter, health,
//! reflection), and shut down gracefully.
//!
//! Binding is separate from serving ([`bind`] then [`Listening::serve`]) so
//! that whoever starts the server learns its address (port 0) and can hold
//! its [`Stats`] before the first stream arrives; [`run`] does both.
//!
//! Shutdown, when the `shutdown` future resolves:
//!
//! 1. health turns NOT_SERVING and the listener closes; connections get
//!    an HTTP/2 GOAWAY, so no new stream starts, but open ones go on;
//! 2. open draft streams get [`Config::shutdown_grace`] to end by
//!    themselves (their verifiers' sessions finishing);
//! 3. then the remaining streams end with UNAVAILABLE (their verifiers go
//!    on without speculation), and `serve` returns `Ok` after at most
//!    [`CLOSE_TIMEOUT`] more.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use specmesh_proto::v1::drafter_server::DrafterServer;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot, watch};
use tonic::transport::server::TcpIncoming;

use crate::config::Config;
use crate::drafters::DrafterSet;
use crate::model::DraftModel;
use crate::service::{DraftService, Shared};
use crate::stats::Stats;

/// HTTP/2 pings on idle connections: a verifier that vanished without
/// closing its connection (node failure, partition) frees its session
/// slots within interval + timeout instead of holding them forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long, after the grace period, closing streams may take before
/// `serve` returns anyway.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The generated server type, named for health reporting.
type Service = DrafterServer<DraftService>;

/// A bound, not yet serving, drafter; see the module docs.
#[derive(Debug)]
pub struct Listening {
    listener: TcpListener,
    local_addr: SocketAddr,
    shutdown_grace: Duration,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

/// Binds `config.listen` and serves until `shutdown` resolves, then shuts
/// down gracefully (see [`Listening::serve`]). Returns `Ok` after a clean
/// shutdown; fails when the draft model or the address is unusable.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    bind(config).await?.serve(shutdown).await
}

/// Logs the effective config, loads the draft model (if any) and binds the
/// listener. Fails on a bad draft model or an address that cannot be bound.
pub async fn bind(config: Config) -> anyhow::Result<Listening> {
    tracing::info!(?config, "effective config");
    let model = match config.draft_model.clone() {
        Some(cfg) => Some(
            tokio::task::spawn_blocking(move || DraftModel::load(&cfg))
                .await
                .context("loading the draft model")??,
        ),
        None => None,
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let local_addr = listener.local_addr().context("reading the bound address")?;
    let (stop, stop_rx) = watch::channel(false);
    let shared = Shared {
        drafters: DrafterSet::new(config.global_index_bytes, model),
        stats: Arc::new(Stats::default()),
        slots: Arc::new(Semaphore::new(config.max_sessions)),
        max_sessions: config.max_sessions,
        max_context: config.max_context_tokens,
        pipeline: config.pipeline,
        start_timeout: config.start_timeout,
        stop: stop_rx,
    };
    Ok(Listening {
        listener,
        local_addr,
        shutdown_grace: config.shutdown_grace,
        shared: Arc::new(shared),
        stop,
    })
}

impl Listening {
    /// The address actually bound (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The process's counters; they stay readable after `serve` returns.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.shared.stats)
    }

    /// Serves until `shutdown` resolves, then shuts down gracefully (see the
    /// module docs). Prints `specmesh-drafter listening on ADDR` to stdout
    /// once serving: launchers wait for that line.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let (reporter, health) = specmesh_server::health::<Service>().await;
        let (reflection_v1, reflection_v1alpha) =
            specmesh_server::reflection().context("building the reflection service")?;
        let (begin_shutdown, shutdown_begun) = oneshot::channel::<()>();
        let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
        let server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .add_service(health)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(DrafterServer::new(DraftService::new(Arc::clone(
                &self.shared,
            ))))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = shutdown_begun.await;
            });
        tokio::pin!(server);
        println!("specmesh-drafter listening on {}", self.local_addr);
        tokio::select! {
            served = &mut server => return served.context("serving gRPC"),
            () = shutdown => {}
        }

        let open = self.shared.stats.snapshot().sessions_open;
        tracing::info!(
            open,
            grace = ?self.shutdown_grace,
            "shutting down: no new streams, open ones get the grace period"
        );
        reporter.set_not_serving::<Service>().await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _ = begin_shutdown.send(());
        if let Ok(served) = tokio::time::timeout(self.shutdown_grace, &mut server).await {
            tracing::info!("every draft stream ended: stopped");
            return served.context("serving gRPC");
        }
        let open = self.shared.stats.snapshot().sessions_open;
        tracing::warn!(
            open,
            "grace period over: closing the remaining draft streams"
        );
        let _ = self.stop.send(true);
        match tokio::time::timeout(CLOSE_TIMEOUT, &mut server).await {
            Ok(served) => served.context("serving gRPC"),
            Err(_) => {
                tracing::warn!(
                    "connections still open after closing every stream: stopping anyway"
                );
                Ok(())
            }
        }
    }
}
