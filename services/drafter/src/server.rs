//! The drafter as the service kit runs it ([`Drafter`]): `build` loads the
//! draft model (if any) and makes the state every draft stream shares; the
//! kit binds, serves (health, reflection, keepalive) and drains.
//!
//! On shutdown open draft streams get the grace period to end by
//! themselves (their verifiers' sessions finishing); then the remaining
//! streams end with UNAVAILABLE (their verifiers go on without
//! speculation), and serving returns after at most [`CLOSE_TIMEOUT`] more.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use specmesh_kvevents::KvEventsService;
use specmesh_proto::v1::drafter_server::{DrafterServer, SERVICE_NAME};
use specmesh_proto::v1::kv_events_server::KvEventsServer;
use specmesh_server::{Built, ClientAuth, Drain, Endpoints, Security, ServerArgs};
use tokio::sync::{Semaphore, watch};
use tonic::service::interceptor::InterceptedService;

use crate::config::{Args, Config, SERVICE};
use crate::drafters::DrafterSet;
use crate::learned::Learning;
use crate::model::DraftModel;
use crate::prefix::DraftKv;
use crate::service::DraftService;
use crate::state::State;
use crate::stats::Stats;

/// How long, after the grace period, closing streams may take before
/// serving returns anyway.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest `DraftRequest` beyond its context tokens: a cost curve and an
/// outcome's top-k rows are far below it.
const MESSAGE_OVERHEAD: usize = 1 << 20;

/// The drafter service: `specmesh_server::main::<Drafter>()` is its whole
/// process; embedders `specmesh_server::start::<Drafter>(config)` and hold
/// its [`Stats`] (the handle) while it serves.
#[derive(Debug, Clone, Copy)]
pub struct Drafter;

impl specmesh_server::Service for Drafter {
    type Args = Args;
    type Config = Config;
    type Handle = Arc<Stats>;

    const CLI: specmesh_server::cli::Service = SERVICE;
    // Only the identities of --tls-allow-san (the verifiers') may open
    // draft streams.
    const CLIENT_AUTH: ClientAuth = ClientAuth::Required;

    fn server_args(args: &Args) -> &ServerArgs {
        &args.server
    }

    fn endpoints(config: &Config) -> &Endpoints {
        &config.endpoints
    }

    async fn build(config: Config, security: &Security) -> anyhow::Result<Built<Arc<Stats>>> {
        build(config, security).await
    }
}

/// Loads the draft model (if any) and builds the state and the routes.
/// Fails on a draft model that cannot serve (unreadable, foreign
/// vocabulary without a bridge, no chat template for one).
async fn build(config: Config, security: &Security) -> anyhow::Result<Built<Arc<Stats>>> {
    let model = match config.draft_model.clone() {
        Some(cfg) => Some(
            tokio::task::spawn_blocking(move || DraftModel::load(&cfg))
                .await
                .context("loading the draft model")??,
        ),
        None => None,
    };
    let stats = Arc::new(Stats::default());
    let (stop, stop_rx) = watch::channel(false);
    let state = Arc::new(State {
        drafters: DrafterSet::new(config.global_index_bytes, model),
        stats: Arc::clone(&stats),
        slots: Arc::new(Semaphore::new(config.max_sessions)),
        max_sessions: config.max_sessions,
        max_context: config.max_context_tokens,
        pipeline: config.pipeline,
        learning: config.learn_across_sessions.then(Learning::default),
        draft_ahead: config.draft_model.as_ref().is_some_and(|m| m.draft_ahead),
        start_timeout: config.start_timeout,
        stop: stop_rx,
    });
    // A start carries the context and, at most as long, a prediction.
    let limit = specmesh_server::message_bytes(
        config.max_context_tokens.saturating_mul(2),
        MESSAGE_OVERHEAD,
    );
    let service = DrafterServer::new(DraftService::new(Arc::clone(&state)))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(MESSAGE_OVERHEAD);
    let service = InterceptedService::new(service, security.authorize());
    // The draft model's cache by prefix, for the gateways' drafter
    // placement; an empty one without it (nothing to find, no warning).
    let kv = state
        .drafters
        .draft_kv()
        .cloned()
        .unwrap_or_else(|| DraftKv::new(0, 0));
    let open = Arc::clone(&stats);
    // The gateways subscribe as well as the verifiers: their identities
    // join the allowlist (none: any client of the mesh CA, as for drafts).
    let allowed = &config.endpoints.tls.tls_allow_san;
    let events_auth = if allowed.is_empty() {
        security.authorize()
    } else {
        let names: Vec<String> = allowed
            .iter()
            .chain(&config.kv_events_allow_san)
            .cloned()
            .collect();
        security.authorize_names(&names)
    };
    let kv_events = InterceptedService::new(
        KvEventsServer::new(KvEventsService::new(
            kv.shared().clone(),
            Arc::new(move || open.snapshot().sessions_open as u32),
        )),
        events_auth,
    );
    let drain = Streams {
        stats: Arc::clone(&stats),
        stop,
    };
    let mut built = Built::new(
        tonic::service::Routes::new(service).add_service(kv_events),
        SERVICE_NAME,
        Box::new(drain),
    );
    // It reads outcomes whose committed tokens run past the path by what a
    // grammar forced (`StepOutcome.forced`).
    built.capabilities = vec![specmesh_server::capability::STRUCTURED];
    // Labelled with what this drafter drafts with.
    built.metrics_label = config.draft_model.as_ref().map_or_else(
        || "model-free".to_string(),
        |m| m.path.display().to_string(),
    );
    let counters = Arc::clone(&stats);
    let cache = state.drafters.draft_kv().map(|kv| kv.shared().clone());
    built.metrics = Box::new(move |registry| {
        registry
            .register(Box::new(crate::metrics::StatsMetrics::new(counters)))
            .context("registering the drafter's metrics")?;
        if let Some(cache) = cache {
            registry
                .register(Box::new(crate::metrics::PrefixMetrics::new(cache)))
                .context("registering the draft prefix cache's metrics")?;
        }
        Ok(())
    });
    built.close_timeout = CLOSE_TIMEOUT;
    Ok(built.with_handle(stats))
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
