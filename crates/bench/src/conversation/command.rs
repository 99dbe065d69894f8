//! The conversation workload as a command runs it: the mesh started (with
//! `--up`, its OpenAI front too) or reached, a target per API, llama.cpp's
//! configurations with `--peer`, the run, its JSON, and a failure when an
//! answer changed. `bench` and `bench-serve` both come here.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use specmesh_harness::grpc::Connection;
use specmesh_harness::launch::Mesh;
use specmesh_harness::layout::{Front, Layout, MeshArgs};
use specmesh_harness::model::ModelArgs;

use super::{Api, ConversationArgs, PeerLaunch, Target};
use crate::client::{Client, Transport};
use crate::llama_cpp::PeerArgs;

/// What the command was given.
#[derive(Debug)]
pub struct Setup<'a> {
    pub model: &'a ModelArgs,
    /// `Some`: start this mesh for the run (`--up`).
    pub up: Option<&'a MeshArgs>,
    /// Our draft model (`--draft-model`), llama.cpp's by default.
    pub draft_model: Option<&'a Path>,
    /// Without `--up`: the gateway's gRPC API and OpenAI front, where given.
    pub grpc: Option<Connection>,
    pub http: Option<Connection>,
    pub peer: &'a PeerArgs,
    pub args: &'a ConversationArgs,
    pub max_new: u32,
    pub repeats: usize,
    pub json: Option<&'a Path>,
}

/// Runs the conversation workload per `setup`.
pub async fn run(setup: Setup<'_>) -> Result<()> {
    let args = setup.args;
    args.check()?;
    if setup.up.is_none() && setup.grpc.is_none() && setup.http.is_none() {
        bail!("pass --up, or the gateway's address (--gateway URL, --http URL)");
    }
    // The peer's flags first: a missing build should fail before minutes
    // of start-up.
    let peers = if setup.peer.peer {
        let bin_dir = setup.peer.bin_dir();
        if !bin_dir.join("llama-server").exists() {
            bail!(
                "no llama-server in {}: run tools/bench/setup.sh or pass --peer-bin",
                bin_dir.display()
            );
        }
        let draft = setup.draft_model;
        let threads = setup.model.threads_or_all();
        let model = setup.model.path()?;
        setup
            .peer
            .specs(draft)?
            .into_iter()
            .map(|spec| {
                Target::LlamaServer(Arc::new(PeerLaunch {
                    bin_dir: bin_dir.clone(),
                    model: model.clone(),
                    threads,
                    spec,
                }))
            })
            .collect()
    } else {
        Vec::new()
    };
    let mesh = match setup.up {
        Some(mesh_args) => {
            let wants_http = args.apis.is_empty() || args.apis.contains(&Api::Http);
            let front = Front {
                http: wants_http.then(|| ([127, 0, 0, 1], 0).into()),
                ..Front::loopback()
            };
            let layout = Layout::new(setup.model, mesh_args, front)?;
            Some(Mesh::start(layout).await?)
        }
        None => None,
    };
    let (grpc, http) = match &mesh {
        Some(m) => (
            Some(Connection::plain(m.gateway.url())),
            m.gateway.http.clone().map(Connection::plain),
        ),
        None => (setup.grpc.clone(), setup.http.clone()),
    };
    let result = async {
        let mut targets = Vec::new();
        for api in args.apis(grpc.is_some(), http.is_some())? {
            let (transport, connection) = match api {
                Api::Grpc | Api::GrpcSession => (Transport::Grpc, grpc.clone()),
                Api::Http => (Transport::Http, http.clone()),
            };
            let connection = connection.context("the API's address")?;
            let client = Client::connect(transport, connection).await?;
            targets.push(Target::Ours { client, api });
        }
        targets.extend(peers);
        let run_id = format!(
            "conv-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        );
        // The oracle renders prompts as the gateway does.
        let tokenizer = setup
            .model
            .path()
            .ok()
            .and_then(|p| specmesh_tokenizer::Tokenizer::from_model_path(&p).ok());
        let outcome = super::run(
            args,
            &targets,
            tokenizer.as_ref(),
            setup.max_new,
            setup.repeats,
            &run_id,
        )
        .await?;
        if let Some(path) = setup.json {
            std::fs::write(path, serde_json::to_string_pretty(&outcome.json)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if !outcome.failures.is_empty() {
            for f in &outcome.failures {
                eprintln!("FAILED {f}");
            }
            bail!(
                "{} of our conversations failed (the first: {})",
                outcome.failures.len(),
                outcome.failures[0]
            );
        }
        if !outcome.mismatches.is_empty() {
            for m in &outcome.mismatches {
                eprintln!("MISMATCH {m}");
            }
            bail!(
                "{} answers differ between our APIs, sessions or concurrencies: a cache, a session or batching changed the answer",
                outcome.mismatches.len()
            );
        }
        Ok(())
    }
    .await;
    if let Some(m) = mesh {
        m.stop().await?;
    }
    result
}
