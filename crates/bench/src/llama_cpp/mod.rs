//! llama.cpp, the peer the benchmarks measure against: where
//! `tools/bench/setup.sh` builds it (natively, for this CPU) and what it
//! recorded of the build, its speculative configurations ([`spec`]) and
//! its server as a process ([`server`]).

pub mod server;
pub mod spec;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use spec::PeerSpec;

/// The peer's flags, the same in `bench` and `bench-serve`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PeerArgs {
    /// Also run llama.cpp's own llama-server (plain, and each
    /// `--peer-spec`) on the same prompts, model and threads, interleaved
    /// with ours, and report its best configuration per workload. Build it
    /// with tools/bench/setup.sh.
    #[arg(long)]
    pub peer: bool,
    /// One llama.cpp speculative configuration to run with --peer (repeat
    /// the flag for more): llama.cpp's `--spec-type` names, several
    /// separated by commas mixing in one server (`ngram-simple,draft-simple`),
    /// `draft-simple` optionally with `:N_MAX[:P_MIN[:N_MIN]]`; `none`:
    /// plain decoding only. Default: ngram-simple, ngram-mod and, with a
    /// draft model, draft-simple and ngram-simple,draft-simple.
    #[arg(long, requires = "peer")]
    pub peer_spec: Vec<String>,
    /// The draft model of llama.cpp's draft-model configurations (default:
    /// `--draft-model`); of the target's vocabulary.
    #[arg(long, requires = "peer")]
    pub peer_draft_model: Option<PathBuf>,
    /// Directory with llama.cpp's `llama-server` and `llama-bench`
    /// (default: where tools/bench/setup.sh puts them).
    #[arg(long, env = "SPECMESH_PEER_BIN")]
    pub peer_bin: Option<PathBuf>,
}

impl PeerArgs {
    /// Where the binaries are.
    pub fn bin_dir(&self) -> PathBuf {
        self.peer_bin.clone().unwrap_or_else(default_bin_dir)
    }

    /// The configurations `--peer` runs: plain decoding first, then each
    /// `--peer-spec` (or the defaults). `draft_model`: ours, the fallback
    /// of `--peer-draft-model`.
    pub fn specs(&self, draft_model: Option<&Path>) -> Result<Vec<PeerSpec>> {
        let draft = self
            .peer_draft_model
            .as_deref()
            .or(draft_model)
            .map(|d| specmesh_catalog::resolve(Some(d)))
            .transpose()
            .context("the peer's draft model")?;
        let mut specs = vec![PeerSpec::plain()];
        if self.peer_spec.is_empty() {
            specs.extend(spec::defaults(draft.as_deref()));
        }
        for s in &self.peer_spec {
            let s = PeerSpec::parse(s, draft.as_deref())?;
            if !specs.contains(&s) {
                specs.push(s);
            }
        }
        Ok(specs)
    }
}

/// Where `tools/bench/setup.sh` puts the binaries.
pub fn default_bin_dir() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/specmesh/peer/bin")
}

/// The build's own description (version, compiler, flags), as
/// `tools/bench/setup.sh` recorded it.
pub fn build_info(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("BUILD_INFO")).ok()?;
    Some(text.lines().collect::<Vec<_>>().join("; "))
}
