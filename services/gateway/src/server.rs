//! Serving: loads the model's metadata, binds, serves Generation with health
//! and reflection, and shuts down gracefully.
//!
//! Shutdown: when the `shutdown` future resolves, health flips to
//! NOT_SERVING (so load balancers stop sending), the listener stops
//! accepting, and running requests get up to the grace period to finish;
//! whatever still runs then is cut. Either way the gateway returns `Ok`.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use specmesh_proto::v1::generation_server::GenerationServer;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tracing::{info, warn};

use crate::config::Config;
use crate::model::ModelMeta;
use crate::service::GenerationService;

/// HTTP/2 keepalive towards clients: a vanished client's streams (and the
/// verifier calls behind them) are cancelled within interval + timeout.
const CLIENT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const CLIENT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `config.listen` and serves until `shutdown` resolves (then drains).
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    serve(listener, config, shutdown).await
}

/// Serves on an already bound listener (`config.listen` is ignored), e.g.
/// one bound to port 0 whose address the caller needs first.
///
/// Once ready, prints `specmesh-gateway listening on ADDR` on stdout for
/// launchers to read.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let addr = listener.local_addr().context("reading the bound address")?;
    info!(?config, "effective config");
    // A catalog name becomes its cached file here: parsing flags touches no file.
    let path = specmesh_catalog::resolve(Some(&config.model)).context("`--model`")?;
    let model = tokio::task::spawn_blocking(move || ModelMeta::load(&path))
        .await
        .context("the model loader task failed")??;
    for warning in model.tokenizer.warnings() {
        warn!(warning = %warning, "tokenizer");
    }
    let service = GenerationService::new(&config, model)?;
    info!(
        max_context = service.limits().max_context,
        verifiers = config.verifiers.len(),
        drafters = config.drafters.len(),
        "model metadata loaded"
    );
    let (reporter, health) = specmesh_server::health::<GenerationServer<GenerationService>>().await;
    let (reflection_v1, reflection_v1alpha) = specmesh_server::reflection()?;
    let generation = GenerationServer::new(service.clone())
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(CLIENT_KEEPALIVE_INTERVAL));

    // Resolves with the shutdown signal; flips health first.
    let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        reporter
            .set_not_serving::<GenerationServer<GenerationService>>()
            .await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        info!("shutting down: no new connections, draining running requests");
        let _ = draining_tx.send(());
    };
    let server = Server::builder()
        .http2_keepalive_interval(Some(CLIENT_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(CLIENT_KEEPALIVE_TIMEOUT))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(generation)
        .serve_with_incoming_shutdown(incoming, signal);

    announce(addr);
    let grace = config.shutdown_grace;
    let grace_over = async move {
        if draining_rx.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = server => result.context("serving gRPC")?,
        () = grace_over => warn!(
            still_running = service.in_flight(),
            grace_seconds = grace.as_secs_f64(),
            "grace period over; cutting the requests still running"
        ),
    }
    info!("stopped");
    Ok(())
}

/// Tells a launcher where the gateway listens (stdout) and the logs too.
fn announce(addr: SocketAddr) {
    use std::io::Write;
    info!(%addr, "listening");
    let mut out = std::io::stdout().lock();
    // A closed stdout must not stop the server.
    let _ = writeln!(out, "specmesh-gateway listening on {addr}");
    let _ = out.flush();
}
