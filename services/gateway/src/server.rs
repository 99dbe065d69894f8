//! The gateway as the service kit runs it ([`Gateway`]): `build` loads the
//! model's metadata (tokenizer, template, context) and the API keys, and
//! makes the Generation service and, with `--http-listen`, its OpenAI
//! front; the kit binds, serves (health, reflection, keepalive) and drains.
//!
//! Shutdown: health flips to NOT_SERVING (so load balancers stop sending),
//! the listener stops accepting, and running requests get up to the grace
//! period to finish; whatever still runs then is cut.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context;
use specmesh_proto::v1::gateway_peers_server::GatewayPeersServer;
use specmesh_proto::v1::generation_server::{GenerationServer, SERVICE_NAME};
use specmesh_server::{AbortOnDrop, Built, ClientAuth, Drain, Endpoints, Security, ServerArgs};
use tonic::service::interceptor::InterceptedService;
use tracing::{info, warn};

use crate::auth::Callers;
use crate::config::{Args, Config, SERVICE};
use crate::model::ModelMeta;
use crate::service::GenerationService;

/// HTTP/2 keepalive towards clients: a vanished client's streams (and the
/// verifier calls behind them) are cancelled within interval + timeout.
const CLIENT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const CLIENT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The gateway service: `specmesh_server::main::<Gateway>()` is its whole
/// process.
#[derive(Debug, Clone, Copy)]
pub struct Gateway;

impl specmesh_server::Service for Gateway {
    type Args = Args;
    type Config = Config;
    type Handle = ();

    const CLI: specmesh_server::cli::Service = SERVICE;
    // Callers may come without a certificate (API keys authenticate
    // them); the gateway's own calls to verifiers and drafters are mutual.
    const CLIENT_AUTH: ClientAuth = ClientAuth::Optional;

    fn server_args(args: &Args) -> &ServerArgs {
        &args.server
    }

    fn endpoints(config: &Config) -> &Endpoints {
        &config.endpoints
    }

    async fn build(config: Config, security: &Security) -> anyhow::Result<Built> {
        build(config, security).await
    }
}

/// Loads the model's metadata and the API keys, and builds the service,
/// its HTTP front (bound here, so a bad `--http-listen` fails the start)
/// and the routes.
async fn build(config: Config, security: &Security) -> anyhow::Result<Built> {
    // A catalog name becomes its cached file here: parsing flags touches no file.
    let path = specmesh_catalog::resolve(Some(&config.model)).context("`--model`")?;
    specmesh_server::model_file::check(&path, config.model_sha256)
        .await
        .context("`--model-sha256`")?;
    let model = tokio::task::spawn_blocking(move || ModelMeta::load(&path))
        .await
        .context("the model loader task failed")??;
    for warning in model.tokenizer.warnings() {
        warn!(warning = %warning, "tokenizer");
    }
    let callers = Callers::from_file(
        config.api_keys.as_deref(),
        config.api_keys_reload,
        config.api_keys_keep_on_error,
    )?;
    let service = GenerationService::new(&config, model, security.clone(), callers)?;
    info!(
        max_context = service.limits().max_context,
        verifiers = config.verifiers.len(),
        drafters = config.drafters.len(),
        "model metadata loaded"
    );
    let generation = GenerationServer::new(service.clone())
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    // Callers are authenticated before their message is decoded.
    let generation = InterceptedService::new(generation, service.authenticator());
    // The HTTP front serves while the gRPC API does and drains with it:
    // it refuses new requests once shutdown begins and stops when the
    // grace period's running requests have answered.
    let http = match config.http_listen {
        Some(addr) => {
            let limits = crate::http::Limits {
                max_body_bytes: config.max_message_bytes,
                // The gateway answers its own deadline first (504 with the
                // request's detail); this catches anything that does not.
                backstop: config.request_timeout + Duration::from_secs(5),
                body_timeout: config.http_body_timeout,
            };
            let router = crate::http::router(
                service.clone(),
                &crate::http::model_id(&config.model),
                limits,
            );
            let stop = service.state().closed();
            Some(AbortOnDrop(
                crate::http::serve(addr, router, security, stop).await?,
            ))
        }
        None => None,
    };
    // Tenants' use, for the other gateways (`--peers`), and the task that
    // asks them for theirs.
    let instance: u64 = rand::random();
    let quotas = std::sync::Arc::clone(service.state().quotas());
    let peer_api = InterceptedService::new(
        GatewayPeersServer::new(crate::peers::PeerService::new(quotas.clone(), instance)),
        security.authorize_names(&config.peer_allow_san),
    );
    let peers_synced = prometheus::IntGauge::new(
        "specmesh_gateway_peers_synced",
        "Peer gateways (--peers) whose tenants' use this gateway counted at the last sync.",
    )
    .expect("a valid gauge");
    let sync = (!config.peers.is_empty()).then(|| {
        info!(
            peers = config.peers.len(),
            every_ms = config.peer_sync.as_millis() as u64,
            "tenants' limits are shared with the peer gateways"
        );
        AbortOnDrop(tokio::spawn(crate::peers::run(
            quotas,
            crate::peers::Sync {
                peers: config.peers.clone(),
                interval: config.peer_sync,
                dialer: specmesh_server::client::Dialer {
                    security: security.clone(),
                    connect_timeout: config.connect_timeout,
                },
                tls_name: config.peer_tls_name.clone(),
                instance,
            },
            peers_synced.clone(),
        )))
    });
    let requests = Requests {
        service: service.clone(),
        http: tokio::sync::Mutex::new(http),
    };
    let mut built = Built::new(
        tonic::service::Routes::new(generation).add_service(peer_api),
        SERVICE_NAME,
        Box::new(requests),
    );
    built.tasks.extend(sync);
    // Time for the requests ended at the grace period's end to send their
    // last answer (an error event, a status).
    built.close_timeout = CLOSE_TIMEOUT;
    built.metrics_label = config.model.display().to_string();
    built.metrics = Box::new(move |registry| {
        service.register_metrics(registry);
        registry.register(Box::new(peers_synced))?;
        Ok(())
    });
    built.keepalive = Some((CLIENT_KEEPALIVE_INTERVAL, CLIENT_KEEPALIVE_TIMEOUT));
    Ok(built)
}

/// How long, after the grace period, the requests it ended get to send
/// their last answer (an error event or status, sent at once) before
/// serving returns anyway; short, because streams that never end by
/// themselves (a client's health watch) hold the gRPC server that long.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The running requests of both fronts, as the drain sees them.
struct Requests {
    service: GenerationService,
    /// The HTTP front's server task, when there is one.
    http: tokio::sync::Mutex<Option<AbortOnDrop>>,
}

impl Drain for Requests {
    fn in_flight(&self) -> usize {
        self.service.in_flight()
    }

    fn begin(&self) {
        self.service.state().drain();
    }

    fn close(&self) {
        self.service.state().close();
    }

    fn closed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Some(http) = self.http.lock().await.as_mut() {
                let _ = (&mut http.0).await;
            }
        })
    }
}
