//! The specmesh verifier: holds the target model and the KV caches of its
//! sessions. The gateway runs sessions on it (`Verifier.Run`); for each, the
//! verifier pulls draft trees straight from the drafter the gateway placed,
//! verifies the trees of concurrent sessions in batched forwards, and
//! streams committed tokens back.
//!
//! ```text
//!   gateway ──Run──▶ verifier ──Draft (bidi)──▶ drafter
//!          ◀─commits─         ◀──── trees ─────
//! ```

#![forbid(unsafe_code)]

mod batch_metrics;
mod batcher;
pub mod calibrate;
pub mod config;
mod draft_link;
mod drafters;
mod error;
mod goodput;
mod memory;
mod metrics;
mod reattach;
mod report;
mod service;
mod session;
mod state;
mod step;
mod validate;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use specmesh_model::{LoadOptions, Model};
use specmesh_proto::v1::verifier_server::{SERVICE_NAME, VerifierServer};
use specmesh_server::{AbortOnDrop, ClientAuth, Drain, Security, ServeConfig};
use specmesh_tokenizer::Tokenizer;
use tokio::sync::Semaphore;
use tonic::service::interceptor::InterceptedService;

pub use config::{Args, Config, ConfigError, SERVICE};
pub use error::VerifierError;

use crate::batcher::{Batcher, BatcherConfig};
use crate::draft_link::DrafterChannels;
use crate::drafters::Drafters;
use crate::memory::KvMemory;
use crate::service::VerifierService;
use crate::state::{State, Target};

/// Largest `RunRequest` beyond its context tokens (ids, sampling, plan).
const MESSAGE_OVERHEAD: usize = 64 << 10;

/// Loads the model, measures its cost curve, binds `config.listen` and
/// serves until `shutdown` resolves (then lets running sessions finish for
/// up to the grace period).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tracing::info!(?config, "starting the verifier");
    // Before the model loads: a TLS mistake should fail in a second, not
    // after a minute of loading.
    let security = Security::from_args(&config.tls, ClientAuth::Required)?;
    // A catalog name becomes its cached file here: parsing flags touches no file.
    let model_name = config.model.display().to_string();
    let model_path = specmesh_catalog::resolve(Some(&config.model)).context("`--model`")?;
    let config = Config {
        model: model_path.clone(),
        ..config
    };
    let threads = config.threads;
    let (model, eos, vocab_fingerprint) =
        tokio::task::spawn_blocking(move || load(&model_path, threads)).await??;
    let memory = specmesh_model::process::memory_line(model.weight_bytes());
    println!(
        "specmesh-verifier: model {} loaded: {memory}",
        config.model.display()
    );
    tracing::info!(model = %config.model.display(), %memory, "model loaded");
    let model = Arc::new(model);
    // The curve's own k = 1 measurement is the plain step; a given curve
    // still needs the step timed (a few one-token forwards).
    let m = Arc::clone(&model);
    let (cost_curve, step_seconds) = match config.cost_curve.clone() {
        Some(curve) => {
            let step = tokio::task::spawn_blocking(move || calibrate::step_seconds(&m, 256, 3));
            (curve, step.await??)
        }
        None => {
            let c = tokio::task::spawn_blocking(move || calibrate::measure(&m, 256, 3)).await??;
            tracing::info!(curve = ?c.curve, "measured the verify cost curve");
            (c.curve, c.step_seconds)
        }
    };
    tracing::info!(step_seconds, "measured the plain step");
    // The planner's step-time model starts from the measured curve and
    // learns from every forward after.
    let step_model = specmesh_planner::StepModel::from_curve(step_seconds, &cost_curve)
        .context("the verify cost curve as the goodput planner's prior")?;
    if config.goodput_planner {
        tracing::info!(
            max_forward_tokens = config.max_forward_tokens,
            "goodput planner on: each batched forward verifies the drafted nodes that pay"
        );
    }
    let batcher = Batcher::start(
        Arc::clone(&model),
        BatcherConfig {
            max_batch: config.max_batch,
            window: config.batch_window,
            prefill_chunk: config.prefill_chunk_tokens,
        },
        goodput::Goodput::new(
            config.goodput_planner,
            config.max_forward_tokens,
            step_model,
        ),
    );
    let max_context = model.config().max_context;
    let drafters = Arc::new(Drafters::new(config.drafters.clone()));
    let _resolve = drafters.is_dynamic().then(|| {
        AbortOnDrop(tokio::spawn(drafters::resolve_every(
            Arc::clone(&drafters),
            config.resolve_interval,
        )))
    });
    let state = Arc::new(State {
        vocab: model.config().vocab_size as u32,
        target: Target {
            name: model_name,
            vocab_fingerprint,
            step_seconds,
        },
        memory: KvMemory::new(config.kv_budget_bytes, config.max_cached_sessions),
        channels: DrafterChannels::new(security.clone(), config.drafter_tls_name.clone()),
        drafters: Arc::clone(&drafters),
        eos,
        cost_curve,
        slots: Arc::new(Semaphore::new(config.max_sessions)),
        decoding: Arc::clone(&batcher.counters().decoding),
        batcher,
        model,
        config: config.clone(),
    });
    if let Some(addr) = config.metrics_listen {
        let registry = specmesh_server::metrics::registry(&state.target.name);
        state.batcher.counters().metrics.register(&registry);
        registry
            .register(Box::new(metrics::StateMetrics::new(Arc::clone(&state))))
            .context("registering the verifier's metrics")?;
        specmesh_server::metrics::serve("specmesh-verifier", addr, registry).await?;
    }
    let listener = specmesh_server::bind(config.listen).await?;
    let limit = specmesh_server::message_bytes(max_context, MESSAGE_OVERHEAD);
    let service = VerifierServer::new(VerifierService::new(Arc::clone(&state)))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    // Only the identities of --tls-allow-san (the gateway's) may run
    // sessions; health stays open to the mesh.
    let service = InterceptedService::new(service, security.authorize());
    let mut serve = ServeConfig::new(
        "specmesh-verifier",
        SERVICE_NAME,
        config.shutdown_grace,
        security,
    );
    serve.health_listen = config.health_listen;
    // Sessions still running after the grace period are cut when `serve`
    // returns; there is nothing to close first.
    serve.close_timeout = Duration::ZERO;
    let routes = tonic::service::Routes::new(service);
    let drain = Sessions(Arc::clone(&state));
    specmesh_server::serve(listener, routes, serve, &drain, shutdown).await
}

/// The running sessions, as the drain sees them.
struct Sessions(Arc<State>);

impl Drain for Sessions {
    fn in_flight(&self) -> usize {
        self.0.running()
    }
}

/// The model, its end-of-sequence ids and its vocabulary's fingerprint.
fn load(path: &Path, threads: Option<usize>) -> anyhow::Result<(Model, Vec<u32>, u64)> {
    let opts = LoadOptions {
        threads,
        ..LoadOptions::default()
    };
    let model = Model::load(path, &opts)
        .with_context(|| format!("loading the model {}", path.display()))?;
    let tokenizer = Tokenizer::from_model_path(path)
        .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
    Ok((
        model,
        tokenizer.eos_token_ids().to_vec(),
        tokenizer.vocab_fingerprint(),
    ))
}
