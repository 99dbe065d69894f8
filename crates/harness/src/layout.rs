//! What a launched mesh is made of: the mesh's flags, declared once for
//! `specmesh up`, `specmesh bench --up` and `specmesh bench-serve --up`
//! ([`MeshArgs`]), and the [`Layout`] they and the command's own choices
//! (where the gateway listens, whether it serves metrics and HTTP) build,
//! which [`Mesh::start`](crate::launch::Mesh::start) starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::link::LinkArgs;
use crate::model::ModelArgs;

/// The mesh's processes and where they run: the flags every command that
/// starts a mesh takes.
#[derive(clap::Args, Debug, Clone)]
pub struct MeshArgs {
    /// Verifier processes (each loads the target model).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub verifiers: u16,
    /// Drafter processes (0: no speculation).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub drafters: u16,
    /// The drafters' draft model: a catalog name (`specmesh model list`) or
    /// a GGUF file; of the target's vocabulary, or of another that drafts
    /// through text (e.g. smollm2-135m for qwen2.5-coder-1.5b; checked at
    /// start); unset: model-free drafting only. In `bench` it also adds the
    /// draft-model and combined configurations, and is llama.cpp's draft
    /// model (`--peer-draft-model`).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// The verifiers' CPU cores (`specmesh-verifier --cpus`), e.g. `0`.
    #[arg(long)]
    pub verifier_cpus: Option<String>,
    /// The drafters' CPU cores (`specmesh-drafter --cpus`), e.g. `1`.
    #[arg(long)]
    pub drafter_cpus: Option<String>,
    /// The draft model's compute threads (default: every core the drafter
    /// may use).
    #[arg(long, requires = "draft_model")]
    pub drafter_threads: Option<usize>,
    /// The drafters draft the draft model's next tree while the verifier
    /// verifies the last (`specmesh-drafter --draft-ahead`); pays when the
    /// drafters have cores of their own (`--drafter-cpus`).
    #[arg(long, requires = "draft_model")]
    pub draft_ahead: bool,
    /// The draft model scores only its N most frequent tokens
    /// (`specmesh-drafter --draft-head-tokens`; 0: all).
    #[arg(long, requires = "draft_model")]
    pub draft_head_tokens: Option<usize>,
    /// Memory for the draft model's KV kept by prefix, in MiB
    /// (`specmesh-drafter --draft-kv-budget-mib`; default: the drafter's;
    /// 0: none).
    #[arg(long, requires = "draft_model")]
    pub draft_kv_budget_mib: Option<u64>,
    /// The verifiers' prefix cache (`specmesh-verifier --prefix-cache`):
    /// `false` reuses KV only within a `session_id`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub prefix_cache: bool,
    /// Each verifier's KV budget in MiB (`specmesh-verifier
    /// --kv-budget-mib`; default: the verifier's).
    #[arg(long)]
    pub kv_budget_mib: Option<u64>,
    /// Seconds to wait for each service to start (loading the model and
    /// measuring its cost curve take seconds; a 1.5B model on a slow
    /// 2-core VM, minutes).
    #[arg(long, default_value_t = 300)]
    pub start_timeout_secs: u64,
    /// The drafters as a separate host: another network namespace, an
    /// added round trip (`tools/bench/netns.sh` makes the namespace).
    #[command(flatten)]
    pub link: LinkArgs,
}

impl Default for MeshArgs {
    /// One verifier and one drafter, model-free, on every core: what
    /// `specmesh up` starts without flags.
    fn default() -> MeshArgs {
        MeshArgs {
            verifiers: 1,
            drafters: 1,
            draft_model: None,
            verifier_cpus: None,
            drafter_cpus: None,
            drafter_threads: None,
            draft_ahead: false,
            draft_head_tokens: None,
            draft_kv_budget_mib: None,
            prefix_cache: true,
            kv_budget_mib: None,
            start_timeout_secs: 300,
            link: LinkArgs::default(),
        }
    }
}

/// What the command itself decides about the gateway it starts.
#[derive(Debug, Clone, Copy)]
pub struct Front {
    /// The gateway's gRPC address (port 0: a free one).
    pub listen: SocketAddr,
    /// The gateway's OpenAI-compatible HTTP front too (port 0: a free one).
    pub http: Option<SocketAddr>,
    /// Every service serves Prometheus metrics on a free loopback port.
    pub metrics: bool,
}

impl Front {
    /// A gateway on a free loopback port, without HTTP or metrics: what a
    /// benchmark starts.
    pub fn loopback() -> Front {
        Front {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            http: None,
            metrics: false,
        }
    }
}

/// What [`Mesh::start`](crate::launch::Mesh::start) starts.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The target model (a resolved path).
    pub model: PathBuf,
    /// The verifiers' compute threads (default: all cores).
    pub threads: Option<usize>,
    /// The kernels' instruction set of the verifiers and of the draft
    /// model (`--isa`, `--draft-model-isa`; default: the fastest there).
    pub isa: Option<specmesh_model::Isa>,
    /// What the verifiers' and the draft model's KV caches store.
    pub kv_dtype: specmesh_model::KvDtype,
    pub mesh: MeshArgs,
    pub front: Front,
}

impl Layout {
    /// The layout of `model` (its path resolved from the catalog), `mesh`
    /// and `front`.
    pub fn new(model: &ModelArgs, mesh: &MeshArgs, front: Front) -> Result<Layout> {
        // Checked before any process starts.
        mesh.link.proxy_rtt()?;
        Ok(Layout {
            model: model.path()?,
            threads: model.threads,
            isa: model.isa,
            kv_dtype: model.kv_dtype,
            mesh: mesh.clone(),
            front,
        })
    }

    /// How long each service may take to start.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.mesh.start_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mesh: MeshArgs,
    }

    #[test]
    fn no_flags_is_the_default_mesh() {
        let parsed = Cli::try_parse_from(["x"]).unwrap().mesh;
        let default = MeshArgs::default();
        assert_eq!(parsed.verifiers, default.verifiers);
        assert_eq!(parsed.drafters, default.drafters);
        assert_eq!(parsed.start_timeout_secs, default.start_timeout_secs);
        assert_eq!(parsed.link, default.link);
        assert!(parsed.draft_model.is_none() && !parsed.draft_ahead);
    }

    #[test]
    fn draft_model_settings_need_a_draft_model() {
        for flags in [
            &["x", "--draft-ahead"][..],
            &["x", "--drafter-threads", "1"],
            &["x", "--draft-head-tokens", "4096"],
        ] {
            let e = Cli::try_parse_from(flags).err().expect("refused");
            assert!(e.to_string().contains("--draft-model"), "{e}");
        }
        let ok = Cli::try_parse_from(["x", "--draft-model", "m.gguf", "--draft-ahead"]);
        assert!(ok.unwrap().mesh.draft_ahead);
    }

    #[test]
    fn counts_are_bounded() {
        assert!(Cli::try_parse_from(["x", "--verifiers", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--verifiers", "65"]).is_err());
        let none = Cli::try_parse_from(["x", "--drafters", "0"]).unwrap();
        assert_eq!(none.mesh.drafters, 0);
    }

    #[test]
    fn a_bad_round_trip_is_refused_before_anything_starts() {
        let mesh = Cli::try_parse_from(["x", "--drafter-rtt-ms", "20000"])
            .unwrap()
            .mesh;
        let model = ModelArgs {
            model: Some("/nonexistent.gguf".into()),
            threads: None,
            isa: None,
            kv_dtype: Default::default(),
        };
        let e = Layout::new(&model, &mesh, Front::loopback()).unwrap_err();
        assert!(e.to_string().contains("--drafter-rtt-ms"), "{e}");
    }
}
