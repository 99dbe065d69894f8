//! Flags (with `SPECMESH_*` environment fallbacks) and the validated config.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "specmesh-verifier",
    version,
    about = "specmesh verifier: the target model and its sessions' KV caches"
)]
pub struct Args {
    /// Address to serve gRPC on (port 0: any free port).
    #[arg(
        long,
        env = "SPECMESH_VERIFIER_LISTEN",
        default_value = "127.0.0.1:50052"
    )]
    pub listen: SocketAddr,
    /// The target model: a catalog name (`specmesh model list`), a GGUF
    /// file or a Hugging Face model directory.
    #[arg(long, env = "SPECMESH_MODEL")]
    pub model: PathBuf,
    /// Compute threads for the model (default: all cores).
    #[arg(long, env = "SPECMESH_THREADS")]
    pub threads: Option<usize>,
    /// Memory for KV caches, running and kept sessions together (MiB).
    #[arg(long, env = "SPECMESH_KV_BUDGET_MIB", default_value_t = 2048)]
    pub kv_budget_mib: u64,
    /// Sessions verified in one batched forward, at most.
    #[arg(long, env = "SPECMESH_MAX_BATCH", default_value_t = 16)]
    pub max_batch: usize,
    /// How long a batch waits for the trees of other running sessions (µs).
    #[arg(long, env = "SPECMESH_BATCH_WINDOW_US", default_value_t = 1000)]
    pub batch_window_us: u64,
    /// Drafted nodes per tree, at most (the root not counted).
    #[arg(long, env = "SPECMESH_MAX_DRAFT_TOKENS", default_value_t = 64)]
    pub max_draft_tokens: usize,
    /// Tree depth, at most.
    #[arg(long, env = "SPECMESH_MAX_TREE_DEPTH", default_value_t = 16)]
    pub max_tree_depth: usize,
    /// How long a step waits for its tree before verifying the root alone (ms).
    #[arg(long, env = "SPECMESH_DRAFT_TIMEOUT_MS", default_value_t = 200)]
    pub draft_timeout_ms: u64,
    /// How long to wait for a drafter to connect (ms).
    #[arg(
        long,
        env = "SPECMESH_DRAFTER_CONNECT_TIMEOUT_MS",
        default_value_t = 1000
    )]
    pub drafter_connect_timeout_ms: u64,
    /// The cost curve as `k:relative,...` (e.g. `1:1,4:1.85,16:5.02`);
    /// default: measured at startup on this machine.
    #[arg(long, env = "SPECMESH_COST_CURVE")]
    pub cost_curve: Option<String>,
    /// Target top-k sent to drafters per accepted node (token recycling).
    #[arg(long, env = "SPECMESH_RECYCLE_TOP_K", default_value_t = 8)]
    pub top_k: usize,
    /// Sessions whose KV is kept for a next turn, at most.
    #[arg(long, env = "SPECMESH_MAX_CACHED_SESSIONS", default_value_t = 256)]
    pub max_cached_sessions: usize,
    /// Sessions running at once, at most (over it: RESOURCE_EXHAUSTED).
    #[arg(long, env = "SPECMESH_MAX_SESSIONS", default_value_t = 256)]
    pub max_sessions: usize,
    /// Seconds in-flight sessions get to finish on shutdown.
    #[arg(long, env = "SPECMESH_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub model: PathBuf,
    pub threads: Option<usize>,
    pub kv_budget_bytes: u64,
    pub max_batch: usize,
    pub batch_window: Duration,
    pub max_draft_tokens: usize,
    pub max_tree_depth: usize,
    pub draft_timeout: Duration,
    pub drafter_connect_timeout: Duration,
    pub cost_curve: Option<Vec<(usize, f64)>>,
    pub top_k: usize,
    pub max_cached_sessions: usize,
    pub max_sessions: usize,
    pub shutdown_grace: Duration,
}

impl TryFrom<Args> for Config {
    type Error = anyhow::Error;

    fn try_from(a: Args) -> anyhow::Result<Config> {
        if a.kv_budget_mib == 0 {
            bail!("`--kv-budget-mib` must be >= 1");
        }
        if a.max_batch == 0 {
            bail!("`--max-batch` must be >= 1");
        }
        if a.max_draft_tokens > 1024 {
            bail!(
                "`--max-draft-tokens` must be <= 1024, got {}",
                a.max_draft_tokens
            );
        }
        if a.max_sessions == 0 {
            bail!("`--max-sessions` must be >= 1");
        }
        if a.top_k > 64 {
            bail!("`--recycle-top-k` must be <= 64, got {}", a.top_k);
        }
        let cost_curve = a
            .cost_curve
            .as_deref()
            .map(parse_curve)
            .transpose()
            .context("`--cost-curve`")?;
        Ok(Config {
            listen: a.listen,
            model: a.model,
            threads: a.threads,
            kv_budget_bytes: a.kv_budget_mib << 20,
            max_batch: a.max_batch,
            batch_window: Duration::from_micros(a.batch_window_us),
            max_draft_tokens: a.max_draft_tokens,
            max_tree_depth: a.max_tree_depth,
            draft_timeout: Duration::from_millis(a.draft_timeout_ms),
            drafter_connect_timeout: Duration::from_millis(a.drafter_connect_timeout_ms),
            cost_curve,
            top_k: a.top_k,
            max_cached_sessions: a.max_cached_sessions,
            max_sessions: a.max_sessions,
            shutdown_grace: Duration::from_secs(a.shutdown_grace_secs),
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
}
