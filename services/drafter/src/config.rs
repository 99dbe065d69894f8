//! Flags, with `SPECMESH_DRAFTER_*` environment fallbacks (the service
//! kit's rule: `--max-sessions` reads `SPECMESH_DRAFTER_MAX_SESSIONS`), and
//! the validated [`Config`] the rest of the crate runs on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use specmesh_server::cli::Service;
use specmesh_server::cli::{FlagError, in_range};
use specmesh_server::{Endpoints, ServerArgs};

/// The drafter as its command line knows it.
pub const SERVICE: Service = Service {
    name: "drafter",
    default_listen: DEFAULT_LISTEN,
    default_grace_secs: 20,
};

/// The default gRPC address: loopback, the drafter's well-known port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50061";

/// Largest global index accepted, in MiB (1 TiB: anything above is a typo).
const MAX_GLOBAL_INDEX_MIB: usize = 1 << 20;

/// Command-line flags of `specmesh-drafter`.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "specmesh-drafter",
    version,
    about = "The specmesh drafter: proposes token trees for the verifiers' sessions"
)]
pub struct Args {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Memory for the cross-session suffix index over all tenants (MiB; 0
    /// turns cross-session drafting off).
    #[arg(long, default_value_t = 256)]
    pub global_index_mib: usize,
    /// Draft streams open at once, at most (over it: RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 1024)]
    pub max_sessions: usize,
    /// Context tokens (prompt + output) of one session, at most; a longer
    /// session is refused with INVALID_ARGUMENT. Bounds per-session memory.
    #[arg(long, default_value_t = 262_144)]
    pub max_context_tokens: usize,
    /// Send "nothing drafted" for the next step ahead of its outcome when
    /// the policy has already decided not to speculate, so the verifier
    /// never waits a round trip for an empty tree.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub pipeline: bool,
    /// Start each session's policy from what the earlier sessions of its
    /// workload (tenant, target, greedy or sampled) measured: acceptance
    /// per tree depth and the overhead of a speculative step, per way of
    /// drafting. Off: every session starts from the same guess.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub learn_across_sessions: bool,
    /// Seconds a new draft stream may take to send its `start`; a silent
    /// stream would hold a session slot (DEADLINE_EXCEEDED).
    #[arg(long, default_value_t = 30)]
    pub start_timeout_secs: u64,
    /// Certificate identities (SANs), besides `--tls-allow-san`'s, that may
    /// subscribe to the draft model's KV events (`KvEvents.Subscribe`, for
    /// the gateways' drafter placement), e.g. `specmesh-gateway`. Without
    /// `--tls-allow-san` any client of the mesh CA may.
    #[arg(long, value_delimiter = ',')]
    pub kv_events_allow_san: Vec<String>,
    /// A draft model: a catalog name (`specmesh model list`) or a GGUF
    /// file, of the target's vocabulary or (with `--target-tokenizer`) of
    /// another, drafting through text; unset: model-free drafting only.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// The draft model file's SHA-256 (64 hex digits, as `sha256sum`
    /// prints them): the drafter refuses to start when the file's differs,
    /// so a volume or image holding another file is caught before it
    /// drafts. (`--model-sha256` is the same flag.)
    #[arg(long, alias = "model-sha256")]
    pub draft_model_sha256: Option<specmesh_catalog::Sha256>,
    /// Self-draft: `--draft-model` is the target itself and only its first
    /// N layers draft.
    #[arg(long)]
    pub self_draft_layers: Option<usize>,
    /// The target's tokenizer (a catalog name, a GGUF file or a Hugging Face
    /// model directory): a draft model of another vocabulary drafts through
    /// text for it (refused at start when its tokenizer cannot); without
    /// it, the draft model must have the target's vocabulary.
    #[arg(long)]
    pub target_tokenizer: Option<PathBuf>,
    /// Compute threads of the draft model (default: all cores).
    #[arg(long)]
    pub draft_model_threads: Option<usize>,
    /// The draft model kernels' instruction set: scalar, avx2, avx-vnni,
    /// avx512-vnni or amx-int8 (default: the fastest this CPU has; with
    /// amx-int8, tiles take the calls measured faster on them at load); one
    /// the CPU lacks is refused at start.
    #[arg(long)]
    pub draft_model_isa: Option<specmesh_model::Isa>,
    /// What the draft model's KV cache stores K and V as: f16 (half the
    /// memory per token) or f32 (default).
    #[arg(long)]
    pub draft_model_kv_dtype: Option<specmesh_model::KvDtype>,
    /// Sessions that draft with the model at once, at most; later ones
    /// draft model-free (each holds a KV cache of its context).
    #[arg(long, default_value_t = 64)]
    pub draft_model_sessions: usize,
    /// Memory for the draft model's KV kept by prefix (default 512): a
    /// session finds the longest cached prefix of its context (within its
    /// tenant and `cache_salt`) and the draft model computes only the
    /// rest, so a conversation's later turns do not prefill the whole
    /// history in the draft model either. Least recently used blocks go
    /// first; 0 keeps nothing. Draft models of the target's vocabulary
    /// only (one drafting through text keeps no cache).
    #[arg(long, value_name = "MIB")]
    pub draft_kv_budget_mib: Option<u64>,
    /// While the verifier verifies a draft model's tree, draft the next one
    /// on the guess that the tree's best path is accepted (the guessed
    /// next tokens are that path's children), so a right guess is answered
    /// at once. Pays when the drafter has cores of its own (`--cpus`); on
    /// cores shared with the verifier it slows the verification it hides
    /// behind.
    #[arg(long)]
    pub draft_ahead: bool,
    /// Score only the draft model's N most frequent tokens (FR-Spec): its
    /// lm_head shrinks to N rows, trees and a sampled node's q are over
    /// those tokens, and rejection sampling stays exact. 0 scores the whole
    /// vocabulary.
    #[arg(long, default_value_t = 0)]
    pub draft_head_tokens: usize,
    /// The frequency ranking behind `--draft-head-tokens`, written by
    /// `specmesh token-ranking` with the draft model's tokenizer (default:
    /// the one shipped for that tokenizer, if any).
    #[arg(long)]
    pub token_ranking: Option<PathBuf>,
}

/// A flag combination that cannot run; messages name the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Range(#[from] FlagError),
    #[error("`--{flag}` needs `--draft-model`")]
    NeedsDraftModel { flag: &'static str },
}

/// The validated configuration of one drafter process.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where and how it serves: the kit's shared flags.
    pub endpoints: Endpoints,
    /// Budget of the global suffix index, in bytes (0: no index).
    pub global_index_bytes: usize,
    pub max_sessions: usize,
    pub max_context_tokens: usize,
    /// Pipelined "nothing drafted" trees (see `Args::pipeline`).
    pub pipeline: bool,
    /// See `Args::learn_across_sessions`.
    pub learn_across_sessions: bool,
    pub start_timeout: Duration,
    /// Identities besides `tls.tls_allow_san` admitted to `KvEvents`.
    pub kv_events_allow_san: Vec<String>,
    /// The optional model drafter.
    pub draft_model: Option<DraftModelConfig>,
}

/// Where the model drafter comes from and how much it may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftModelConfig {
    /// The GGUF file.
    pub path: PathBuf,
    /// Its SHA-256, checked before it loads.
    pub sha256: Option<specmesh_catalog::Sha256>,
    /// Draft with only the first this many layers (self-draft).
    pub self_draft_layers: Option<usize>,
    /// The target's tokenizer: a draft model of another vocabulary drafts
    /// through text for it.
    pub target_tokenizer: Option<PathBuf>,
    pub threads: Option<usize>,
    /// The kernels' instruction set (`None`: the fastest this CPU has).
    pub isa: Option<specmesh_model::Isa>,
    /// What the KV cache stores K and V as.
    pub kv_dtype: specmesh_model::KvDtype,
    /// Sessions drafting with the model at once.
    pub max_sessions: usize,
    /// Bytes of the draft model's KV kept by prefix (0: none).
    pub kv_budget_bytes: u64,
    /// Draft the next tree during the verification of the last (see
    /// `Args::draft_ahead`).
    pub draft_ahead: bool,
    /// Score only this many of the draft model's most frequent tokens
    /// (`None`: all).
    pub head_tokens: Option<usize>,
    /// Their ranking (`None`: the one shipped for the tokenizer).
    pub token_ranking: Option<PathBuf>,
}

impl Default for Config {
    /// The flags' defaults.
    fn default() -> Config {
        Config {
            endpoints: Endpoints::plaintext(
                SocketAddr::from(([127, 0, 0, 1], 50061)),
                Duration::from_secs(20),
            ),
            global_index_bytes: 256 << 20,
            max_sessions: 1024,
            max_context_tokens: 262_144,
            pipeline: true,
            learn_across_sessions: true,
            start_timeout: Duration::from_secs(30),
            kv_events_allow_san: Vec::new(),
            draft_model: None,
        }
    }
}

/// `--draft-kv-budget-mib` when not given.
pub const DEFAULT_DRAFT_KV_BUDGET_MIB: u64 = 512;
/// 1 TiB: past any drafter's memory, short of overflowing bytes.
const MAX_DRAFT_KV_BUDGET_MIB: usize = 1 << 20;

fn at_least(flag: &'static str, value: usize, min: usize) -> Result<usize, FlagError> {
    in_range(flag, value, min, usize::MAX)
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(a: Args) -> Result<Config, ConfigError> {
        in_range(
            "global-index-mib",
            a.global_index_mib,
            0,
            MAX_GLOBAL_INDEX_MIB,
        )?;
        at_least("start-timeout-secs", a.start_timeout_secs as usize, 1)?;
        let draft_model = match a.draft_model {
            Some(path) => Some(DraftModelConfig {
                path,
                sha256: a.draft_model_sha256,
                self_draft_layers: a
                    .self_draft_layers
                    .map(|n| at_least("self-draft-layers", n, 1))
                    .transpose()?,
                target_tokenizer: a.target_tokenizer,
                threads: a
                    .draft_model_threads
                    .map(|n| at_least("draft-model-threads", n, 1))
                    .transpose()?,
                isa: a.draft_model_isa,
                kv_dtype: a.draft_model_kv_dtype.unwrap_or_default(),
                max_sessions: at_least("draft-model-sessions", a.draft_model_sessions, 1)?,
                kv_budget_bytes: (in_range(
                    "draft-kv-budget-mib",
                    a.draft_kv_budget_mib.unwrap_or(DEFAULT_DRAFT_KV_BUDGET_MIB) as usize,
                    0,
                    MAX_DRAFT_KV_BUDGET_MIB,
                )? as u64)
                    << 20,
                draft_ahead: a.draft_ahead,
                head_tokens: (a.draft_head_tokens > 0).then_some(a.draft_head_tokens),
                token_ranking: a.token_ranking,
            }),
            None => {
                let orphan = [
                    ("self-draft-layers", a.self_draft_layers.is_some()),
                    ("target-tokenizer", a.target_tokenizer.is_some()),
                    ("draft-model-threads", a.draft_model_threads.is_some()),
                    ("draft-model-isa", a.draft_model_isa.is_some()),
                    ("draft-model-kv-dtype", a.draft_model_kv_dtype.is_some()),
                    ("draft-ahead", a.draft_ahead),
                    ("draft-head-tokens", a.draft_head_tokens > 0),
                    ("draft-model-sha256", a.draft_model_sha256.is_some()),
                    ("draft-kv-budget-mib", a.draft_kv_budget_mib.is_some()),
                    ("token-ranking", a.token_ranking.is_some()),
                ];
                if let Some((flag, _)) = orphan.iter().find(|(_, set)| *set) {
                    return Err(ConfigError::NeedsDraftModel { flag });
                }
                None
            }
        };
        Ok(Config {
            endpoints: a.server.endpoints(),
            global_index_bytes: a.global_index_mib << 20,
            max_sessions: at_least("max-sessions", a.max_sessions, 1)?,
            max_context_tokens: at_least("max-context-tokens", a.max_context_tokens, 1)?,
            pipeline: a.pipeline,
            learn_across_sessions: a.learn_across_sessions,
            start_timeout: Duration::from_secs(a.start_timeout_secs),
            kv_events_allow_san: a.kv_events_allow_san,
            draft_model,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let argv = std::iter::once("specmesh-drafter").chain(args.iter().copied());
        Config::try_from(
            specmesh_server::cli::try_parse_from::<Args, _, _>(&SERVICE, argv).unwrap(),
        )
    }

    #[test]
    fn the_flag_defaults_are_the_config_defaults() {
        // `Config::default()` is for in-process use: plaintext.
        assert_eq!(parse(&["--plaintext"]).unwrap(), Config::default());
        assert!(
            !parse(&[]).unwrap().endpoints.tls.plaintext,
            "TLS unless asked"
        );
        assert_eq!(
            Config::default().endpoints.listen.to_string(),
            DEFAULT_LISTEN
        );
    }

    #[test]
    fn port_zero_and_model_flags_parse() {
        let c = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--draft-model",
            "/m.gguf",
            "--self-draft-layers",
            "4",
            "--global-index-mib",
            "0",
        ])
        .unwrap();
        assert_eq!(c.endpoints.listen.port(), 0);
        assert_eq!(c.global_index_bytes, 0);
        let m = c.draft_model.unwrap();
        assert_eq!(m.self_draft_layers, Some(4));
        assert_eq!(m.max_sessions, 64);
        assert_eq!(m.kv_budget_bytes, DEFAULT_DRAFT_KV_BUDGET_MIB << 20);
        let m = parse(&["--draft-model", "m", "--draft-kv-budget-mib", "0"]).unwrap();
        assert_eq!(m.draft_model.unwrap().kv_budget_bytes, 0, "0: no cache");
        let e = parse(&["--draft-kv-budget-mib", "64"])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "`--draft-kv-budget-mib` needs `--draft-model`");
    }

    #[test]
    fn bad_values_name_their_flag() {
        let e = parse(&["--max-sessions", "0"]).unwrap_err().to_string();
        assert_eq!(e, "`--max-sessions` must be >= 1, got 0");
        let e = parse(&["--self-draft-layers", "2"])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "`--self-draft-layers` needs `--draft-model`");
        let e = parse(&["--draft-ahead"]).unwrap_err().to_string();
        assert_eq!(e, "`--draft-ahead` needs `--draft-model`");
        let m = parse(&["--draft-model", "m", "--draft-ahead"]).unwrap();
        assert!(m.draft_model.unwrap().draft_ahead);
        let e = parse(&["--draft-head-tokens", "4096"])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "`--draft-head-tokens` needs `--draft-model`");
        let m = parse(&["--draft-model", "m", "--draft-head-tokens", "4096"]).unwrap();
        assert_eq!(m.draft_model.unwrap().head_tokens, Some(4096));
        let m = parse(&["--draft-model", "m", "--draft-head-tokens", "0"]).unwrap();
        assert_eq!(
            m.draft_model.unwrap().head_tokens,
            None,
            "0: the whole vocabulary"
        );
        let e = parse(&["--draft-model", "m", "--self-draft-layers", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`--self-draft-layers` must be >= 1"), "{e}");
        let e = parse(&["--global-index-mib", "99999999"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`--global-index-mib` must be <= 1048576"), "{e}");
    }

    #[test]
    fn the_flag_reference_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags/drafter.md");
        specmesh_server::cli::check_flags_file::<Args>(&SERVICE, &path);
    }
}
