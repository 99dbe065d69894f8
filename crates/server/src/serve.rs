//! One way to serve a specmesh service: bind, TLS (or plaintext), health,
//! reflection, HTTP/2 keepalive, the "listening on" line, and a graceful
//! drain.
//!
//! Health is also served, alone and in plaintext, on `--health-listen`
//! when given: kubelet's gRPC probes cannot speak TLS, and the health
//! status tells nothing a probe may not know.
//!
//! Shutdown, when the `shutdown` future resolves:
//!
//! 1. health turns NOT_SERVING (the service and the whole server, ""), so
//!    load balancers and Kubernetes stop sending, and [`Drain::begin`]
//!    tells the service's other fronts (the gateway's HTTP API) to refuse
//!    new work;
//! 2. the listener closes and connections get an HTTP/2 GOAWAY: no new
//!    call starts, open ones (and whatever [`Drain::in_flight`] counts) go
//!    on for up to [`ServeConfig::grace`];
//! 3. then [`Drain::close`] tells the service to end what still runs, and
//!    `serve` returns `Ok` once the gRPC server and [`Drain::closed`] are
//!    done, or after [`ServeConfig::close_timeout`] more.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::AbortOnDrop;
use crate::tls::Security;

/// What a service does while the server drains.
pub trait Drain: Send + Sync {
    /// Calls (sessions, streams, requests) still running: the grace
    /// period lasts until none is, at most.
    fn in_flight(&self) -> usize;
    /// Shutdown began: take no new work on fronts the kit does not serve.
    fn begin(&self) {}
    /// The grace period is over (or nothing runs any more): end what still
    /// runs, and stop the service's own fronts.
    fn close(&self) {}
    /// Resolves when what `close` ended is done (its last answers sent).
    fn closed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
}

/// A service with nothing to end early: its calls are cut when `serve`
/// returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDrain;

impl Drain for NoDrain {
    fn in_flight(&self) -> usize {
        0
    }
}

/// How one service is served.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The binary, for the "listening on" line: `specmesh-verifier`.
    pub binary: String,
    /// The gRPC service name health reports (`NamedService::NAME`).
    pub service: &'static str,
    /// How long open calls get to finish after the shutdown signal.
    pub grace: Duration,
    /// How long, after [`Drain::close`], closing may take before `serve`
    /// returns anyway.
    pub close_timeout: Duration,
    /// HTTP/2 pings on idle connections: a peer that vanished without
    /// closing (node failure, partition) frees what it held within
    /// interval + timeout instead of holding it forever.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// TLS on the listener, or plaintext.
    pub security: Security,
    /// A plaintext listener serving health alone, for probes.
    pub health_listen: Option<SocketAddr>,
    /// Capabilities, reported as health services ([`crate::capability`]).
    pub capabilities: Vec<&'static str>,
}

impl ServeConfig {
    /// The defaults every service starts from.
    pub fn new(
        binary: String,
        service: &'static str,
        grace: Duration,
        security: Security,
    ) -> ServeConfig {
        ServeConfig {
            binary,
            service,
            grace,
            close_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(20),
            keepalive_timeout: Duration::from_secs(10),
            security,
            health_listen: None,
            capabilities: Vec::new(),
        }
    }
}

type Served = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// Binds `addr`; the error names the address.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
}

/// Serves `routes` (plus health and reflection) on `listener` until
/// `shutdown` resolves, then drains as the module docs say. Prints
/// `BINARY listening on ADDR` on stdout once serving: launchers wait for it.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    config: ServeConfig,
    drain: &dyn Drain,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let addr = listener.local_addr().context("reading the bound address")?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(config.service, tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    for capability in &config.capabilities {
        reporter
            .set_service_status(*capability, tonic_health::ServingStatus::Serving)
            .await;
    }
    let (reflection_v1, reflection_v1alpha) =
        crate::reflection(config.service).context("building the reflection service")?;
    // Served until `serve` returns, so probes see the drain.
    let _health_only = match config.health_listen {
        Some(addr) => Some(serve_health(addr, health.clone()).await?),
        None => None,
    };
    let routes = routes
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    let (begin_shutdown, shutdown_begun) = tokio::sync::oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(config.keepalive_interval));
    let router = Server::builder()
        .http2_keepalive_interval(Some(config.keepalive_interval))
        .http2_keepalive_timeout(Some(config.keepalive_timeout))
        .add_routes(routes);
    let stop = async {
        let _ = shutdown_begun.await;
    };
    let mut server: Served = match &config.security {
        Security::Plaintext => Box::pin(router.serve_with_incoming_shutdown(incoming, stop)),
        Security::Tls(tls) => Box::pin(
            router.serve_with_incoming_shutdown(crate::tls::incoming(incoming, tls.clone()), stop),
        ),
    };
    announce(&config.binary, addr, &config.security);
    tokio::select! {
        served = &mut server => return served.context("serving gRPC"),
        () = shutdown => {}
    }

    tracing::info!(
        in_flight = drain.in_flight(),
        grace = ?config.grace,
        "shutting down: no new calls, running ones get the grace period"
    );
    for service in [config.service, ""] {
        reporter
            .set_service_status(service, tonic_health::ServingStatus::NotServing)
            .await;
    }
    drain.begin();
    let _ = begin_shutdown.send(());
    // The gRPC server ends when its last call does; the drain counts what
    // other fronts still run.
    let mut served: Option<Result<(), tonic::transport::Error>> = None;
    let ended = tokio::time::timeout(config.grace, async {
        served = Some((&mut server).await);
        while drain.in_flight() > 0 {
            tokio::time::sleep(IDLE_POLL).await;
        }
    })
    .await;
    match ended {
        Ok(()) => tracing::info!("every call ended"),
        Err(_) => tracing::warn!(
            in_flight = drain.in_flight(),
            "grace period over: ending the calls still running"
        ),
    }
    drain.close();
    let closed = tokio::time::timeout(config.close_timeout, async {
        if served.is_none() {
            served = Some((&mut server).await);
        }
        drain.closed().await;
    })
    .await;
    if closed.is_err() {
        tracing::warn!("connections still open after closing: stopping anyway");
        return Ok(());
    }
    tracing::info!("stopped");
    served.unwrap_or(Ok(())).context("serving gRPC")
}

/// How often the grace period looks whether the drain's calls ended.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// Serves `health` alone, in plaintext, on `addr` until dropped.
async fn serve_health(
    addr: SocketAddr,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> anyhow::Result<AbortOnDrop> {
    let listener = bind(addr).await.context("`--health-listen`")?;
    let addr = listener.local_addr().context("reading the bound address")?;
    tracing::info!(%addr, "serving health for probes (plaintext)");
    let server = Server::builder()
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)));
    Ok(AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::warn!(error = %e, "the health listener stopped");
        }
    })))
}

/// Tells a launcher where the service listens (stdout), and the logs.
fn announce(binary: &str, addr: SocketAddr, security: &Security) {
    tracing::info!(%addr, tls = security.is_tls(), "listening");
    crate::tell_launcher(binary, crate::Ready::Listening, &addr.to_string());
}
