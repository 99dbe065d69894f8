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

pub mod calibrate;
pub mod config;
mod draft_link;
mod engine;
mod memory;
mod report;
mod service;
mod session;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use specmesh_model::{LoadOptions, Model, ModelFormat};
use specmesh_proto::v1::verifier_server::VerifierServer;
use specmesh_tokenizer::Tokenizer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

pub use config::{Args, Config};

use crate::draft_link::DrafterChannels;
use crate::engine::{Engine, EngineConfig};
use crate::memory::KvMemory;
use crate::service::{Inner, VerifierService};

/// Loads the model, measures its cost curve, binds `config.listen` and
/// serves until `shutdown` resolves (then lets running sessions finish for
/// up to the grace period).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tracing::info!(?config, "starting the verifier");
    // A catalog name becomes its cached file here: parsing flags touches no file.
    let model_path = specmesh_catalog::resolve(Some(&config.model)).context("`--model`")?;
    let config = Config {
        model: model_path.clone(),
        ..config
    };
    let threads = config.threads;
    let (model, eos) = tokio::task::spawn_blocking(move || load(&model_path, threads)).await??;
    let memory = specmesh_model::process::memory_line(model.weight_bytes());
    println!(
        "specmesh-verifier: model {} loaded: {memory}",
        config.model.display()
    );
    tracing::info!(model = %config.model.display(), %memory, "model loaded");
    let model = Arc::new(model);
    let cost_curve = match &config.cost_curve {
        Some(c) => c.clone(),
        None => {
            let m = Arc::clone(&model);
            let curve =
                tokio::task::spawn_blocking(move || calibrate::measure(&m, 256, 3)).await??;
            tracing::info!(?curve, "measured the verify cost curve");
            curve
        }
    };
    let engine = Engine::start(
        Arc::clone(&model),
        EngineConfig {
            max_batch: config.max_batch,
            window: config.batch_window,
        },
    );
    let inner = Arc::new(Inner {
        vocab: model.config().vocab_size as u32,
        memory: KvMemory::new(config.kv_budget_bytes, config.max_cached_sessions),
        channels: DrafterChannels::default(),
        eos,
        cost_curve,
        running: Default::default(),
        decoding: Arc::clone(&engine.counters().decoding),
        engine,
        model,
        config: config.clone(),
    });
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;
    serve(inner, listener, addr, shutdown).await
}

async fn serve(
    inner: Arc<Inner>,
    listener: TcpListener,
    addr: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let grace = inner.config.shutdown_grace;
    let (health_reporter, health) =
        specmesh_server::health::<VerifierServer<VerifierService>>().await;
    let (reflection_v1, reflection_v1alpha) = specmesh_server::reflection()?;
    let service = VerifierServer::new(VerifierService::new(inner))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
            shutdown.await;
            health_reporter
                .set_not_serving::<VerifierServer<VerifierService>>()
                .await;
            let _ = stop_tx.send(());
        });
    println!("specmesh-verifier listening on {addr}");
    tracing::info!(%addr, "serving");
    let grace_over = async move {
        if stop_rx.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = server => r?,
        () = grace_over => tracing::warn!(?grace, "shutdown grace period over: ending the remaining sessions"),
    }
    tracing::info!("stopped");
    Ok(())
}

fn load(path: &Path, threads: Option<usize>) -> anyhow::Result<(Model, Vec<u32>)> {
    let opts = LoadOptions {
        threads,
        ..LoadOptions::default()
    };
    let model = Model::load(path, &opts)
        .with_context(|| format!("loading the model {}", path.display()))?;
    let tokenizer = match ModelFormat::detect(path)? {
        ModelFormat::Gguf => Tokenizer::from_gguf_path(path),
        ModelFormat::Safetensors => Tokenizer::from_hf_dir(path),
    }
    .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
    Ok((model, tokenizer.eos_token_ids().to_vec()))
}
