//! The verifier as the service kit runs it ([`Verifier`]): `build` loads
//! the target model, measures (or takes) its verify cost curve, starts the
//! batcher and makes the state its sessions share; the kit binds, serves
//! (health, reflection, keepalive) and drains. Sessions still running
//! after the grace period are cut when serving returns.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use specmesh_grammar::{GrammarLimits, Grammars};
use specmesh_model::{LoadOptions, Model};
use specmesh_proto::v1;
use specmesh_proto::v1::verifier_server::{SERVICE_NAME, VerifierServer};
use specmesh_server::{AbortOnDrop, Built, ClientAuth, Drain, Endpoints, Security, ServerArgs};
use specmesh_tokenizer::Tokenizer;
use tokio::sync::Semaphore;
use tonic::service::interceptor::InterceptedService;

use crate::allowed_drafters::{self, Drafters};
use crate::batcher::{Batcher, BatcherConfig};
use crate::calibrate;
use crate::config::{Args, Config, SERVICE};
use crate::draft_link::DrafterChannels;
use crate::goodput;
use crate::memory::KvMemory;
use crate::metrics;
use crate::service::VerifierService;
use crate::state::{State, Target};
use specmesh_kvevents::KvEventsService;

/// Largest `RunRequest` beyond its context tokens (ids, sampling, plan).
const MESSAGE_OVERHEAD: usize = 64 << 10;

/// The verifier service: `specmesh_server::main::<Verifier>()` is its
/// whole process.
#[derive(Debug, Clone, Copy)]
pub struct Verifier;

impl specmesh_server::Service for Verifier {
    type Args = Args;
    type Config = Config;
    type Handle = ();

    const CLI: specmesh_server::cli::Service = SERVICE;
    // Only the identities of --tls-allow-san (the gateway's) may run
    // sessions.
    const CLIENT_AUTH: ClientAuth = ClientAuth::Required;

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

/// Loads the model, measures its cost curve (unless given), starts the
/// batcher and builds the state and the routes.
async fn build(config: Config, security: &Security) -> anyhow::Result<Built> {
    // A catalog name becomes its cached file here: parsing flags touches no file.
    let model_name = config.model.display().to_string();
    let model_path = specmesh_catalog::resolve(Some(&config.model)).context("`--model`")?;
    specmesh_server::model_file::check(&model_path, config.model_sha256)
        .await
        .context("`--model-sha256`")?;
    let config = Config {
        model: model_path.clone(),
        ..config
    };
    let opts = (config.threads, config.isa, config.kv_dtype);
    let (model, eos, vocab_fingerprint, grammars) =
        tokio::task::spawn_blocking(move || load(&model_path, opts)).await??;
    let memory = specmesh_model::process::memory_line(model.weight_bytes());
    // For the person who started it; a JSON log has the line below.
    if specmesh_server::telemetry::log_format() == specmesh_server::LogFormat::Text {
        println!(
            "specmesh-verifier: model {} loaded ({} kernels, {} KV): {memory}",
            config.model.display(),
            model.kernels(),
            model.kv_dtype()
        );
    }
    tracing::info!(model = %config.model.display(), %memory, kernels = %model.kernels(), "model loaded");
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
    let memory = KvMemory::new(
        config.kv_budget_bytes,
        model.kv_bytes_per_token() as u64,
        config.prefix_cache,
    );
    let batcher = Batcher::start(
        Arc::clone(&model),
        BatcherConfig {
            max_batch: config.max_batch,
            window: config.batch_window,
            // Whole prefix cache blocks per chunk: a prefill stays on a
            // block boundary, where it can take blocks others published.
            prefill_chunk: config
                .prefill_chunk_tokens
                .next_multiple_of(specmesh_kvcache::BLOCK_TOKENS),
        },
        goodput::Goodput::new(
            config.goodput_planner,
            config.max_forward_tokens,
            step_model,
        ),
        memory.clone(),
    );
    let max_context = model.config().max_context;
    let drafters = Arc::new(Drafters::new(config.drafters.clone()));
    let resolve = drafters.is_dynamic().then(|| {
        AbortOnDrop(tokio::spawn(allowed_drafters::resolve_every(
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
        memory: memory.clone(),
        channels: DrafterChannels::new(security.clone(), config.drafter_tls_name.clone()),
        drafters: Arc::clone(&drafters),
        eos,
        grammars: Arc::new(grammars),
        cost_curve,
        slots: Arc::new(Semaphore::new(config.max_sessions)),
        decoding: Arc::clone(&batcher.counters().decoding),
        batcher,
        model,
        config: config.clone(),
    });
    let limit = specmesh_server::message_bytes(max_context, MESSAGE_OVERHEAD);
    let service = VerifierServer::new(VerifierService::new(Arc::clone(&state)))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let service = InterceptedService::new(service, security.authorize());
    let running = Arc::clone(&state);
    let kv_events = InterceptedService::new(
        v1::kv_events_server::KvEventsServer::new(KvEventsService::new(
            memory.shared().clone(),
            Arc::new(move || running.running() as u32),
        )),
        security.authorize(),
    );
    let mut built = Built::new(
        tonic::service::Routes::new(service).add_service(kv_events),
        SERVICE_NAME,
        Box::new(Sessions(Arc::clone(&state))),
    );
    built.metrics_label = state.target.name.clone();
    built.capabilities = vec![specmesh_server::capability::STRUCTURED];
    built.metrics = Box::new(move |registry| {
        state.batcher.counters().metrics.register(registry);
        registry
            .register(Box::new(metrics::StateMetrics::new(state)))
            .context("registering the verifier's metrics")
    });
    built.tasks.extend(resolve);
    Ok(built)
}

/// The running sessions, as the drain sees them.
struct Sessions(Arc<State>);

impl Drain for Sessions {
    fn in_flight(&self) -> usize {
        self.0.running()
    }
}

/// The model, its end-of-sequence ids, its vocabulary's fingerprint and
/// its grammar compiler.
fn load(
    path: &Path,
    (threads, isa, kv_dtype): (
        Option<usize>,
        Option<specmesh_model::Isa>,
        specmesh_model::KvDtype,
    ),
) -> anyhow::Result<(Model, Vec<u32>, u64, Grammars)> {
    let opts = LoadOptions {
        threads,
        isa,
        kv_dtype,
        ..LoadOptions::default()
    };
    let model = Model::load(path, &opts)
        .with_context(|| format!("loading the model {}", path.display()))?;
    let tokenizer = Tokenizer::from_model_path(path)
        .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
    let grammars = Grammars::new(
        &tokenizer,
        model.config().vocab_size,
        GrammarLimits::default(),
    )
    .context("building the grammar engine's token trie")?;
    Ok((
        model,
        tokenizer.eos_token_ids().to_vec(),
        tokenizer.vocab_fingerprint(),
        grammars,
    ))
}
