//! Serving: loads the model's metadata, then serves Generation through the
//! service kit (`specmesh_server::serve`: health, reflection, keepalive,
//! graceful drain).
//!
//! Shutdown: when the `shutdown` future resolves, health flips to
//! NOT_SERVING (so load balancers stop sending), the listener stops
//! accepting, and running requests get up to the grace period to finish;
//! whatever still runs then is cut. Either way the gateway returns `Ok`.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use specmesh_proto::v1::generation_server::{GenerationServer, SERVICE_NAME};
use specmesh_server::{AbortOnDrop, ClientAuth, Drain, Security, ServeConfig};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::auth::Callers;
use crate::config::Config;
use crate::model::ModelMeta;
use crate::service::GenerationService;

/// HTTP/2 keepalive towards clients: a vanished client's streams (and the
/// verifier calls behind them) are cancelled within interval + timeout.
const CLIENT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const CLIENT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `config.listen` and serves until `shutdown` resolves (then drains).
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
    let listener = specmesh_server::bind(config.listen).await?;
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
    info!(?config, "effective config");
    // Callers may come without a certificate (API keys authenticate
    // them); the gateway's own calls to verifiers and drafters are mutual.
    let security = Security::from_args(&config.tls, ClientAuth::Optional)?;
    // A catalog name becomes its cached file here: parsing flags touches no file.
    let path = specmesh_catalog::resolve(Some(&config.model)).context("`--model`")?;
    let model = tokio::task::spawn_blocking(move || ModelMeta::load(&path))
        .await
        .context("the model loader task failed")??;
    for warning in model.tokenizer.warnings() {
        warn!(warning = %warning, "tokenizer");
    }
    let callers = Callers::from_file(config.api_keys.as_deref(), config.api_keys_reload)?;
    let service = GenerationService::new(&config, model, security.clone(), callers)?;
    if let Some(addr) = config.metrics_listen {
        let registry = specmesh_server::metrics::registry(&config.model.display().to_string());
        service.register_metrics(&registry);
        specmesh_server::metrics::serve("specmesh-gateway", addr, registry).await?;
    }
    info!(
        max_context = service.limits().max_context,
        verifiers = config.verifiers.len(),
        drafters = config.drafters.len(),
        "model metadata loaded"
    );
    // The HTTP front serves while the gRPC API does, and stops with it.
    let _http = match config.http_listen {
        Some(addr) => {
            let router =
                crate::http::router(service.clone(), &crate::http::model_id(&config.model));
            Some(AbortOnDrop(
                crate::http::serve(addr, router, &security).await?,
            ))
        }
        None => None,
    };
    let generation = GenerationServer::new(service.clone())
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let mut serve = ServeConfig::new(
        "specmesh-gateway",
        SERVICE_NAME,
        config.shutdown_grace,
        security,
    );
    serve.health_listen = config.health_listen;
    serve.keepalive_interval = CLIENT_KEEPALIVE_INTERVAL;
    serve.keepalive_timeout = CLIENT_KEEPALIVE_TIMEOUT;
    // Requests still running after the grace period are cut when `serve`
    // returns; there is nothing to close first.
    serve.close_timeout = Duration::ZERO;
    let routes = tonic::service::Routes::new(generation);
    specmesh_server::serve(listener, routes, serve, &Requests(service), shutdown).await
}

/// The running requests, as the drain sees them.
struct Requests(GenerationService);

impl Drain for Requests {
    fn in_flight(&self) -> usize {
        self.0.in_flight()
    }
}
