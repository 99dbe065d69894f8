//! The process around the service: load the draft model, bind, and serve
//! through the service kit (`specmesh_server::serve`: health, reflection,
//! keepalive, graceful drain).
//!
//! Binding is separate from serving ([`bind`] then [`Listening::serve`]) so
//! that whoever starts the server learns its address (port 0) and can hold
//! its [`Stats`] before the first stream arrives; [`run`] does both.
//!
//! On shutdown open draft streams get [`Config::shutdown_grace`] to end by
//! themselves (their verifiers' sessions finishing); then the remaining
//! streams end with UNAVAILABLE (their verifiers go on without
//! speculation), and `serve` returns `Ok` after at most [`CLOSE_TIMEOUT`]
//! more.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use specmesh_proto::v1::drafter_server::{DrafterServer, SERVICE_NAME};
use specmesh_server::{ClientAuth, Drain, Security, ServeConfig};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tonic::service::interceptor::InterceptedService;

use crate::config::Config;
use crate::drafters::DrafterSet;
use crate::model::DraftModel;
use crate::service::DraftService;
use crate::state::Shared;
use crate::stats::Stats;

/// How long, after the grace period, closing streams may take before
/// `serve` returns anyway.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest `DraftRequest` beyond its context tokens: a cost curve and an
/// outcome's top-k rows are far below it.
const MESSAGE_OVERHEAD: usize = 1 << 20;

/// A bound, not yet serving, drafter; see the module docs.
#[derive(Debug)]
pub struct Listening {
    listener: TcpListener,
    security: Security,
    health_listen: Option<SocketAddr>,
    local_addr: SocketAddr,
    shutdown_grace: Duration,
    max_context: usize,
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
    let security = Security::from_args(&config.tls, ClientAuth::Required)?;
    let model = match config.draft_model.clone() {
        Some(cfg) => Some(
            tokio::task::spawn_blocking(move || DraftModel::load(&cfg))
                .await
                .context("loading the draft model")??,
        ),
        None => None,
    };
    let stats = Arc::new(Stats::default());
    if let Some(addr) = config.metrics_listen {
        // Labelled with what this drafter drafts with.
        let name = config.draft_model.as_ref().map_or_else(
            || "model-free".to_string(),
            |m| m.path.display().to_string(),
        );
        let registry = specmesh_server::metrics::registry(&name);
        registry
            .register(Box::new(crate::metrics::StatsMetrics::new(Arc::clone(
                &stats,
            ))))
            .context("registering the drafter's metrics")?;
        specmesh_server::metrics::serve("specmesh-drafter", addr, registry).await?;
    }
    let listener = specmesh_server::bind(config.listen).await?;
    let local_addr = listener.local_addr().context("reading the bound address")?;
    let (stop, stop_rx) = watch::channel(false);
    let shared = Shared {
        drafters: DrafterSet::new(config.global_index_bytes, model),
        stats,
        slots: Arc::new(Semaphore::new(config.max_sessions)),
        max_sessions: config.max_sessions,
        max_context: config.max_context_tokens,
        pipeline: config.pipeline,
        draft_ahead: config.draft_model.as_ref().is_some_and(|m| m.draft_ahead),
        start_timeout: config.start_timeout,
        stop: stop_rx,
    };
    Ok(Listening {
        listener,
        security,
        health_listen: config.health_listen,
        local_addr,
        shutdown_grace: config.shutdown_grace,
        max_context: config.max_context_tokens,
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
        // A start carries the context and, at most as long, a prediction.
        let limit =
            specmesh_server::message_bytes(self.max_context.saturating_mul(2), MESSAGE_OVERHEAD);
        let service = DrafterServer::new(DraftService::new(Arc::clone(&self.shared)))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(MESSAGE_OVERHEAD);
        // Only the identities of --tls-allow-san (the verifiers') may open
        // draft streams; health stays open to the mesh.
        let service = InterceptedService::new(service, self.security.authorize());
        let mut config = ServeConfig::new(
            "specmesh-drafter",
            SERVICE_NAME,
            self.shutdown_grace,
            self.security,
        );
        config.close_timeout = CLOSE_TIMEOUT;
        config.health_listen = self.health_listen;
        let drain = Streams {
            stats: Arc::clone(&self.shared.stats),
            stop: self.stop,
        };
        let routes = tonic::service::Routes::new(service);
        specmesh_server::serve(self.listener, routes, config, &drain, shutdown).await
    }
}

/// The open draft streams, as the drain sees them.
struct Streams {
    stats: Arc<Stats>,
    stop: watch::Sender<bool>,
}

impl Drain for Streams {
    fn in_flight(&self) -> usize {
        self.stats.snapshot().sessions_open as usize
    }

    fn close(&self) {
        let _ = self.stop.send(true);
    }
}
