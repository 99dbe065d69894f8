//! Flags, with `SPECMESH_VERIFIER_*` environment fallbacks (the service
//! kit's rule: `--max-sessions` reads `SPECMESH_VERIFIER_MAX_SESSIONS`), and
//! the validated config.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use specmesh_server::cli::Service;
use specmesh_server::cli::{FlagError, in_range};
use specmesh_server::discovery::{MemberSource, SourceError, parse_sources};
use specmesh_server::{Endpoints, ServerArgs};

/// The verifier as its command line knows it.
pub const SERVICE: Service = Service {
    name: "verifier",
    default_listen: "127.0.0.1:50052",
    default_grace_secs: 30,
};

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "specmesh-verifier",
    version,
    about = "specmesh verifier: the target model and its sessions' KV caches"
)]
pub struct Args {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The target model: a catalog name (`specmesh model list`), a GGUF
    /// file or a Hugging Face model directory.
    #[arg(long)]
    pub model: PathBuf,
    /// The model file's SHA-256 (64 hex digits, as `sha256sum` prints
    /// them): the service refuses to start when the file's differs, so a
    /// volume or image holding another file is caught before it serves.
    #[arg(long)]
    pub model_sha256: Option<specmesh_catalog::Sha256>,
    /// Compute threads for the model (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The kernels' instruction set: scalar, avx2, avx-vnni, avx512-vnni or
    /// amx-int8 (default: the fastest this CPU has; with amx-int8, tiles
    /// take the calls measured faster on them at load). One the CPU lacks
    /// is refused at start. Outputs are the same on every one;
    /// pin it to compare machines or to rule a kernel out.
    #[arg(long)]
    pub isa: Option<specmesh_model::Isa>,
    /// What the KV cache stores K and V as: f16 (half the memory of f32,
    /// so `--kv-budget-mib` holds twice the tokens, and half the attention
    /// reads per step) or f32. Outputs are exact either way in that
    /// speculation never changes them; the two types round differently.
    #[arg(long, default_value_t = specmesh_model::KvDtype::default())]
    pub kv_dtype: specmesh_model::KvDtype,
    /// Memory for KV caches (MiB): running sessions' reservations and the
    /// prefix cache together; the prefix cache's least recently used
    /// blocks make room.
    #[arg(long, default_value_t = 2048)]
    pub kv_budget_mib: u64,
    /// Reuse cached KV by prefix within a tenant (and `cache_salt`): a
    /// call whose context starts with blocks of 16 tokens some earlier or
    /// running call of its tenant computed copies their KV instead of
    /// prefilling them (`false`: only a `session_id`'s own earlier turns).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub prefix_cache: bool,
    /// Sessions verified in one batched forward, at most.
    #[arg(long, default_value_t = 16)]
    pub max_batch: usize,
    /// How long a batch waits for the trees of other running sessions, at
    /// least (µs); up to a tenth of the last forward when that is longer.
    #[arg(long, default_value_t = 1000)]
    pub batch_window_us: u64,
    /// Context tokens a prefill computes per forward, in the same forward
    /// as the other sessions' steps: they wait at most one chunk's compute
    /// for their next token, however long a new prompt (0: each prompt in
    /// one piece). Rounded up to a multiple of 16, the prefix cache's
    /// block.
    #[arg(long, default_value_t = 32)]
    pub prefill_chunk_tokens: usize,
    /// Drafted nodes per tree, at most (the root not counted).
    #[arg(long, default_value_t = 64)]
    pub max_draft_tokens: usize,
    /// Tree depth, at most.
    #[arg(long, default_value_t = 16)]
    pub max_tree_depth: usize,
    /// How long a step waits for its tree before verifying the root alone (ms).
    #[arg(long, default_value_t = 200)]
    pub draft_timeout_ms: u64,
    /// The drafters this verifier may dial, comma-separated:
    /// `http://host:port` or `dns:///name:port` (every A/AAAA record of the
    /// name; in Kubernetes the drafters' headless Service), as the
    /// gateway's `--drafters` name them. A run whose draft plan names
    /// anything else is refused. None: runs verify without drafting.
    #[arg(long, value_delimiter = ',')]
    pub drafters: Vec<String>,
    /// How often `dns:///` entries of --drafters are resolved again (ms).
    #[arg(long, default_value_t = 5000)]
    pub resolve_interval_ms: u64,
    /// How long to wait for a drafter to connect (ms).
    #[arg(long, default_value_t = 1000)]
    pub drafter_connect_timeout_ms: u64,
    /// Over TLS: the name drafters' certificates carry (e.g. the headless
    /// Service `specmesh-drafter`); default: the host of the endpoint.
    #[arg(long)]
    pub drafter_tls_name: Option<String>,
    /// The cost curve as `k:relative,...` (e.g. `1:1,4:1.85,16:5.02`);
    /// default: measured at startup on this machine.
    #[arg(long)]
    pub cost_curve: Option<String>,
    /// Target top-k sent to drafters per accepted node (token recycling).
    #[arg(long, default_value_t = 8)]
    pub recycle_top_k: usize,
    /// Plan each batched forward for goodput: verify, across the batch's
    /// sessions, the drafted nodes whose expected acceptance pays for
    /// their share of the forward, and tell each drafter the budget it can
    /// expect (`false`: verify every tree whole, and drafters price their
    /// trees for the batch by themselves).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub goodput_planner: bool,
    /// Tokens in one batched verify forward, at most (roots always fit):
    /// the planner's cap on granted nodes.
    #[arg(long, default_value_t = 512)]
    pub max_forward_tokens: usize,
    /// Deprecated and ignored: KV is kept by prefix, in blocks, bounded by
    /// `--kv-budget-mib`.
    #[arg(long, hide = true)]
    pub max_cached_sessions: Option<usize>,
    /// Sessions running at once, at most (over it: RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 256)]
    pub max_sessions: usize,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Where and how it serves: the kit's shared flags.
    pub endpoints: Endpoints,
    pub drafter_tls_name: Option<String>,
    /// Drafter entries, possibly none.
    pub drafters: Vec<MemberSource>,
    pub resolve_interval: Duration,
    pub model: PathBuf,
    /// The model file's SHA-256, checked before it loads.
    pub model_sha256: Option<specmesh_catalog::Sha256>,
    pub threads: Option<usize>,
    pub isa: Option<specmesh_model::Isa>,
    pub kv_dtype: specmesh_model::KvDtype,
    pub kv_budget_bytes: u64,
    pub max_batch: usize,
    pub batch_window: Duration,
    pub prefill_chunk_tokens: usize,
    pub max_draft_tokens: usize,
    pub max_tree_depth: usize,
    pub draft_timeout: Duration,
    pub drafter_connect_timeout: Duration,
    pub cost_curve: Option<Vec<(usize, f64)>>,
    pub recycle_top_k: usize,
    pub goodput_planner: bool,
    pub max_forward_tokens: usize,
    pub prefix_cache: bool,
    pub max_sessions: usize,
}

/// A flag combination that cannot run; messages name the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Range(#[from] FlagError),
    #[error(transparent)]
    Drafters(#[from] SourceError),
    #[error("`--cost-curve`: {0}")]
    CostCurve(String),
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(a: Args) -> Result<Config, ConfigError> {
        in_range("kv-budget-mib", a.kv_budget_mib as usize, 1, usize::MAX)?;
        if a.max_cached_sessions.is_some() {
            tracing::warn!(
                "--max-cached-sessions is deprecated and ignored: KV is kept by prefix, in blocks, \
                 bounded by --kv-budget-mib (docs/operations.md)"
            );
        }
        in_range("max-batch", a.max_batch, 1, usize::MAX)?;
        in_range("max-draft-tokens", a.max_draft_tokens, 0, 1024)?;
        in_range(
            "max-sessions",
            a.max_sessions,
            1,
            tokio::sync::Semaphore::MAX_PERMITS,
        )?;
        in_range("recycle-top-k", a.recycle_top_k, 0, 64)?;
        in_range("max-forward-tokens", a.max_forward_tokens, 1, 1 << 16)?;
        in_range(
            "resolve-interval-ms",
            a.resolve_interval_ms as usize,
            100,
            3_600_000,
        )?;
        let drafters = parse_sources("drafters", &a.drafters)?;
        let cost_curve = a
            .cost_curve
            .as_deref()
            .map(parse_curve)
            .transpose()
            .map_err(|e| ConfigError::CostCurve(format!("{e:#}")))?;
        Ok(Config {
            endpoints: a.server.endpoints(),
            drafter_tls_name: a.drafter_tls_name,
            drafters,
            resolve_interval: Duration::from_millis(a.resolve_interval_ms),
            model: a.model,
            model_sha256: a.model_sha256,
            threads: a.threads,
            isa: a.isa,
            kv_dtype: a.kv_dtype,
            kv_budget_bytes: a.kv_budget_mib << 20,
            max_batch: a.max_batch,
            batch_window: Duration::from_micros(a.batch_window_us),
            prefill_chunk_tokens: a.prefill_chunk_tokens,
            max_draft_tokens: a.max_draft_tokens,
            max_tree_depth: a.max_tree_depth,
            draft_timeout: Duration::from_millis(a.draft_timeout_ms),
            drafter_connect_timeout: Duration::from_millis(a.drafter_connect_timeout_ms),
            cost_curve,
            recycle_top_k: a.recycle_top_k,
            goodput_planner: a.goodput_planner,
            max_forward_tokens: a.max_forward_tokens,
            prefix_cache: a.prefix_cache,
            max_sessions: a.max_sessions,
        })
    }
}

/// Parses `k:cost,k:cost,...`, starting at `1:1`, k increasing, cost not
/// decreasing.
pub fn parse_curve(s: &str) -> anyhow::Result<Vec<(usize, f64)>> {
    let mut points = Vec::new();
    for part in s.split(',') {
        let (k, c) = part
            .split_once(':')
            .with_context(|| format!("`{part}` is not `k:relative_cost`"))?;
        let k: usize = k
            .trim()
            .parse()
            .with_context(|| format!("`{k}` is not a token count"))?;
        let c: f64 = c
            .trim()
            .parse()
            .with_context(|| format!("`{c}` is not a number"))?;
        if !c.is_finite() || c <= 0.0 {
            bail!("cost {c} at k = {k} must be a positive number");
        }
        if let Some(&(pk, pc)) = points.last()
            && (k <= pk || c < pc)
        {
            bail!("points must have increasing k and non-decreasing cost ({pk}:{pc} then {k}:{c})");
        }
        points.push((k, c));
    }
    if points.first() != Some(&(1, 1.0)) {
        bail!("the curve must start with `1:1`");
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Config, ConfigError> {
        let argv = ["specmesh-verifier", "--model", "m.gguf"]
            .into_iter()
            .chain(extra.iter().copied());
        Config::try_from(
            specmesh_server::cli::try_parse_from::<Args, _, _>(&SERVICE, argv).unwrap(),
        )
    }

    #[test]
    fn flags_read_the_verifiers_variables_and_bad_values_name_the_flag() {
        let cmd = specmesh_server::cli::command::<Args>(&SERVICE);
        let env = |id: &str| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_env().unwrap().to_string_lossy().into_owned()
        };
        assert_eq!(env("max_sessions"), "SPECMESH_VERIFIER_MAX_SESSIONS");
        assert_eq!(env("recycle_top_k"), "SPECMESH_VERIFIER_RECYCLE_TOP_K");
        assert_eq!(env("listen"), "SPECMESH_VERIFIER_LISTEN");
        let c = parse(&[]).unwrap();
        assert_eq!(c.endpoints.listen.to_string(), SERVICE.default_listen);
        assert_eq!((c.max_sessions, c.recycle_top_k), (256, 8));
        let err = |extra: &[&str]| parse(extra).unwrap_err().to_string();
        assert_eq!(
            err(&["--max-sessions", "0"]),
            "`--max-sessions` must be >= 1, got 0"
        );
        assert_eq!(
            err(&["--recycle-top-k", "65"]),
            "`--recycle-top-k` must be <= 64, got 65"
        );
        assert!(err(&["--cost-curve", "2:1"]).starts_with("`--cost-curve`: the curve must start"));
        assert_eq!(
            err(&["--drafters", "10.0.0.1:50061"]),
            "`--drafters` entry `10.0.0.1:50061` must look like http://host:port or dns:///name:port"
        );
        let c = parse(&["--drafters", "dns:///specmesh-drafter:50061,http://d:1"]).unwrap();
        assert_eq!(c.drafters.len(), 2);
        assert_eq!(c.resolve_interval, Duration::from_secs(5));
    }

    #[test]
    fn curves_parse_and_bad_ones_say_why() {
        assert_eq!(parse_curve("1:1,4:1.8").unwrap(), vec![(1, 1.0), (4, 1.8)]);
        assert!(
            parse_curve("2:1")
                .unwrap_err()
                .to_string()
                .contains("start with `1:1`")
        );
        assert!(
            parse_curve("1:1,4:0.5")
                .unwrap_err()
                .to_string()
                .contains("non-decreasing")
        );
        assert!(parse_curve("1:1,x:2").is_err());
    }

    #[test]
    fn the_flag_reference_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags/verifier.md");
        specmesh_server::cli::check_flags_file::<Args>(&SERVICE, &path);
    }
}
