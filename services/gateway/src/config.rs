//! The gateway's flags, with `SPECMESH_GATEWAY_*` environment fallbacks
//! (the service kit's rule: `--verifiers` reads `SPECMESH_GATEWAY_VERIFIERS`),
//! and the validated [`Config`] the rest of the crate runs on.
//!
//! `Args` is what an operator types; `Config` is what the code may rely on:
//! at least one verifier, every entry a plain `http://host:port` URI or a
//! `dns:///name:port` name ([`crate::resolve`]), no duplicates, every limit
//! at least 1. Conversion is the only place that
//! reads the environment (for the default model path).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use specmesh_server::cli::Service;
use specmesh_server::discovery::{MemberSource, SourceError, parse_sources};
use specmesh_server::{Endpoints, ServerArgs};

use crate::quota::QuotaLimits;

/// The gateway as its command line knows it. In a pod it listens on
/// `0.0.0.0:50051`; port 0 picks a free port, printed on stdout as
/// `specmesh-gateway listening on ADDR`.
pub const SERVICE: Service = Service {
    name: "gateway",
    default_listen: "127.0.0.1:50051",
    default_grace_secs: 30,
};

/// Upper bound of the time flags (a day): beyond it a deadline is a typo.
const MAX_SECS: u64 = 86_400;

/// `max_new_tokens` when a request leaves it at 0 (see gateway.proto).
pub const DEFAULT_MAX_NEW_TOKENS: u32 = 256;

/// Command-line flags of `specmesh-gateway`. Every flag can also be set
/// through the environment variable named in its help (see [`SERVICE`]).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "specmesh-gateway",
    version,
    about = "The specmesh gateway: the public Generation API in front of the verifiers and drafters"
)]
pub struct Args {
    #[command(flatten)]
    pub server: ServerArgs,

    /// Verifiers, comma-separated: `http://host:port` (one member each) or
    /// `dns:///name:port` (every A/AAAA record of the name, re-resolved
    /// every --resolve-interval-ms; in Kubernetes the verifiers' headless
    /// Service).
    #[arg(long, value_delimiter = ',', required = true)]
    pub verifiers: Vec<String>,

    /// Drafters, comma-separated, in the same forms as --verifiers. None:
    /// every request runs plain decoding.
    #[arg(long, value_delimiter = ',')]
    pub drafters: Vec<String>,

    /// The other gateways, in the same forms as --verifiers (this gateway
    /// may be among them: it notices and skips itself): tenants' limits
    /// then hold across all of them, each gateway counting the tokens and
    /// running requests a tenant has on the others. In Kubernetes the
    /// gateways' headless Service. None: each gateway's limits are its own.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,

    /// How often each gateway asks its peers for their tenants' use (ms).
    #[arg(long, default_value_t = 500)]
    pub peer_sync_ms: u64,

    /// Over TLS: the name peer gateways' certificates carry (e.g.
    /// `specmesh-gateway`); default: the host of each endpoint.
    #[arg(long)]
    pub peer_tls_name: Option<String>,

    /// Over TLS: identities (certificate SANs) allowed to ask this gateway
    /// for its tenants' use, comma-separated. Unset: any client with a
    /// certificate from the mesh CA. Without TLS anyone may ask.
    #[arg(long, value_delimiter = ',')]
    pub peer_allow_san: Vec<String>,

    /// Where to serve the OpenAI-compatible HTTP API (`/v1/chat/completions`,
    /// `/v1/completions`, `/v1/models`, `/health`); default: nowhere. Over
    /// TLS when the gateway has `--tls-cert`.
    #[arg(long)]
    pub http_listen: Option<SocketAddr>,

    /// How often `dns:///` entries are resolved again, in milliseconds: a
    /// pod that joins or leaves the Service is seen within this time.
    #[arg(long, default_value_t = 5000)]
    pub resolve_interval_ms: u64,

    /// The model the verifiers serve: a catalog name (`specmesh model
    /// list`), a GGUF file or a Hugging Face directory; only its tokenizer
    /// and context length are read. Default: smollm2-135m, fetched by
    /// `specmesh model fetch`.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The model file's SHA-256 (64 hex digits, as `sha256sum` prints
    /// them): the gateway refuses to start when the file's differs, so a
    /// volume or image holding another file is caught before it serves.
    #[arg(long)]
    pub model_sha256: Option<specmesh_catalog::Sha256>,

    /// Lower the context the gateway admits (prompt + max_new_tokens) below
    /// the model's own, e.g. to match the verifiers' KV budget.
    #[arg(long)]
    pub max_context: Option<u32>,

    /// Largest `max_new_tokens` a request may ask for.
    #[arg(long, default_value_t = 4096)]
    pub max_new_tokens: u32,

    /// Largest `speculation.max_draft_tokens` a request may ask for, and the
    /// value used when it asks for 0.
    #[arg(long, default_value_t = 64)]
    pub max_draft_tokens: u32,

    /// Requests served at once; more are refused with RESOURCE_EXHAUSTED
    /// (there is no queue).
    #[arg(long, default_value_t = 64)]
    pub max_concurrent_requests: usize,

    /// Deadline of a request that carries no `grpc-timeout` (a shorter client
    /// deadline wins), in seconds.
    #[arg(long, default_value_t = 300)]
    pub request_timeout_secs: u64,

    /// Largest gRPC message accepted or sent, in bytes; also the largest
    /// request body of the HTTP front.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_message_bytes: usize,

    /// Milliseconds the HTTP front waits for a request's whole body before
    /// it answers 408 (a client that stops sending holds a connection no
    /// longer).
    #[arg(long, default_value_t = 30_000)]
    pub http_body_timeout_ms: u64,

    /// How many times one request may move to another verifier after losing
    /// its verifier mid-generation.
    #[arg(long, default_value_t = 2)]
    pub max_replacements: u32,

    /// Time allowed to open a connection to a verifier, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub connect_timeout_ms: u64,

    /// File of API keys (hashed) and their tenants; callers must then send
    /// `authorization: Bearer KEY` and run as the key's tenant. Unset:
    /// callers are not authenticated (local development).
    #[arg(long)]
    pub api_keys: Option<PathBuf>,

    /// Requests one tenant may run at once (0: no limit beyond
    /// `--max-concurrent-requests`); over it: RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 0)]
    pub tenant_max_concurrent: usize,

    /// Tokens (prompt + generated) one tenant may use per minute (0: no
    /// limit); over it: RESOURCE_EXHAUSTED with `retry-after`.
    #[arg(long, default_value_t = 0)]
    pub tenant_tokens_per_minute: u64,

    /// How often the API key file is read again, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub api_keys_reload_ms: u64,

    /// When the API key file stops loading (unreadable, a line that does
    /// not parse), keep the keys it last loaded. Default: refuse every key
    /// until the file loads again, so a revocation cannot fail open.
    #[arg(long)]
    pub api_keys_keep_on_error: bool,

    /// Over TLS: the name verifiers' certificates carry (e.g. the headless
    /// Service `specmesh-verifier`); default: the host of each endpoint.
    #[arg(long)]
    pub verifier_tls_name: Option<String>,

    /// Over TLS: the name drafters' certificates carry; default: the host
    /// of each endpoint.
    #[arg(long)]
    pub drafter_tls_name: Option<String>,

    /// How long a request waits for a verifier to come back when none can
    /// take it (all down or restarting), in milliseconds, within its
    /// deadline; then UNAVAILABLE. 0: fail at once.
    #[arg(long, default_value_t = 10_000)]
    pub placement_wait_ms: u64,
}

/// A configuration the gateway can run with; build it with
/// `Config::try_from(args)`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where and how it serves: the kit's shared flags.
    pub endpoints: Endpoints,
    /// Where to serve the OpenAI-compatible HTTP API; `None`: nowhere.
    pub http_listen: Option<SocketAddr>,
    /// Per-tenant limits.
    pub quotas: QuotaLimits,
    /// The API key file; `None`: callers are not authenticated.
    pub api_keys: Option<PathBuf>,
    pub api_keys_reload: Duration,
    /// Keep the last keys when the file stops loading (else refuse all).
    pub api_keys_keep_on_error: bool,
    pub verifier_tls_name: Option<String>,
    pub drafter_tls_name: Option<String>,
    /// Verifier entries, at least one, as given (trimmed).
    pub verifiers: Vec<MemberSource>,
    /// Drafter entries, possibly none.
    pub drafters: Vec<MemberSource>,
    /// How often `dns:///` entries are resolved again.
    pub resolve_interval: Duration,
    /// Other gateways sharing tenants' limits (none: this gateway's own).
    pub peers: Vec<MemberSource>,
    pub peer_sync: Duration,
    pub peer_tls_name: Option<String>,
    pub peer_allow_san: Vec<String>,
    pub model: PathBuf,
    /// The model file's SHA-256, checked before it loads.
    pub model_sha256: Option<specmesh_catalog::Sha256>,
    pub max_context: Option<u32>,
    pub max_new_tokens: u32,
    pub max_draft_tokens: u32,
    pub max_concurrent_requests: usize,
    pub request_timeout: Duration,
    pub max_message_bytes: usize,
    /// The HTTP front's wait for a request body.
    pub http_body_timeout: Duration,
    pub max_replacements: u32,
    pub connect_timeout: Duration,
    pub placement_wait: Duration,
}

/// A flag value the gateway cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("`--verifiers` must list at least one endpoint")]
    NoVerifiers,
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("`--{flag}` must be at least {min}, got {got}")]
    TooSmall {
        flag: &'static str,
        min: u64,
        got: u64,
    },
    #[error("`--{flag}` must be at most {max}, got {got}")]
    TooLarge {
        flag: &'static str,
        max: u64,
        got: u64,
    },
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(args: Args) -> Result<Self, ConfigError> {
        let verifiers = parse_sources("verifiers", &args.verifiers)?;
        if verifiers.is_empty() {
            return Err(ConfigError::NoVerifiers);
        }
        let drafters = parse_sources("drafters", &args.drafters)?;
        let peers = parse_sources("peers", &args.peers)?;
        at_least("peer-sync-ms", args.peer_sync_ms, 50)?;
        at_most("peer-sync-ms", args.peer_sync_ms, 60_000)?;
        at_least("max-new-tokens", args.max_new_tokens.into(), 1)?;
        at_least("max-draft-tokens", args.max_draft_tokens.into(), 1)?;
        at_least(
            "max-concurrent-requests",
            args.max_concurrent_requests as u64,
            1,
        )?;
        // tokio's semaphore refuses more permits than this.
        at_most(
            "max-concurrent-requests",
            args.max_concurrent_requests as u64,
            tokio::sync::Semaphore::MAX_PERMITS as u64,
        )?;
        at_least("request-timeout-secs", args.request_timeout_secs, 1)?;
        at_most("request-timeout-secs", args.request_timeout_secs, MAX_SECS)?;
        at_most(
            "shutdown-grace-secs",
            args.server.shutdown_grace_secs,
            MAX_SECS,
        )?;
        at_most(
            "connect-timeout-ms",
            args.connect_timeout_ms,
            MAX_SECS * 1000,
        )?;
        at_least("max-message-bytes", args.max_message_bytes as u64, 1024)?;
        at_least("http-body-timeout-ms", args.http_body_timeout_ms, 1)?;
        at_least("connect-timeout-ms", args.connect_timeout_ms, 1)?;
        at_least("resolve-interval-ms", args.resolve_interval_ms, 100)?;
        at_most(
            "resolve-interval-ms",
            args.resolve_interval_ms,
            MAX_SECS * 1000,
        )?;
        if let Some(ctx) = args.max_context {
            at_least("max-context", ctx.into(), 2)?;
        }
        let model = args
            .model
            .unwrap_or_else(|| PathBuf::from(specmesh_catalog::DEFAULT_MODEL));
        Ok(Config {
            endpoints: args.server.endpoints(),
            http_listen: args.http_listen,
            quotas: QuotaLimits {
                max_concurrent: (args.tenant_max_concurrent > 0)
                    .then_some(args.tenant_max_concurrent),
                tokens_per_minute: (args.tenant_tokens_per_minute > 0)
                    .then_some(args.tenant_tokens_per_minute),
            },
            api_keys: args.api_keys,
            api_keys_reload: Duration::from_millis(args.api_keys_reload_ms),
            api_keys_keep_on_error: args.api_keys_keep_on_error,
            model_sha256: args.model_sha256,
            verifier_tls_name: args.verifier_tls_name,
            drafter_tls_name: args.drafter_tls_name,
            verifiers,
            drafters,
            peers,
            peer_sync: Duration::from_millis(args.peer_sync_ms),
            peer_tls_name: args.peer_tls_name,
            peer_allow_san: args.peer_allow_san,
            resolve_interval: Duration::from_millis(args.resolve_interval_ms),
            model,
            max_context: args.max_context,
            max_new_tokens: args.max_new_tokens,
            max_draft_tokens: args.max_draft_tokens,
            max_concurrent_requests: args.max_concurrent_requests,
            request_timeout: Duration::from_secs(args.request_timeout_secs),
            max_message_bytes: args.max_message_bytes,
            http_body_timeout: Duration::from_millis(args.http_body_timeout_ms),
            max_replacements: args.max_replacements,
            connect_timeout: Duration::from_millis(args.connect_timeout_ms),
            placement_wait: Duration::from_millis(args.placement_wait_ms),
        })
    }
}

impl Config {
    /// A configuration with the flag defaults, for embedding and tests.
    pub fn new(verifiers: Vec<String>, model: PathBuf) -> Self {
        Config {
            endpoints: Endpoints::plaintext(
                SocketAddr::from(([127, 0, 0, 1], 0)),
                Duration::from_secs(30),
            ),
            http_listen: None,
            quotas: QuotaLimits::default(),
            api_keys: None,
            api_keys_reload: Duration::from_secs(10),
            api_keys_keep_on_error: false,
            verifier_tls_name: None,
            drafter_tls_name: None,
            verifiers: verifiers.into_iter().map(MemberSource::Static).collect(),
            drafters: Vec::new(),
            peers: Vec::new(),
            peer_sync: Duration::from_millis(500),
            peer_tls_name: None,
            peer_allow_san: Vec::new(),
            resolve_interval: Duration::from_secs(5),
            model,
            model_sha256: None,
            max_context: None,
            max_new_tokens: 4096,
            max_draft_tokens: 64,
            max_concurrent_requests: 64,
            request_timeout: Duration::from_secs(300),
            max_message_bytes: 4 << 20,
            http_body_timeout: Duration::from_secs(30),
            max_replacements: 2,
            connect_timeout: Duration::from_secs(2),
            placement_wait: Duration::from_secs(10),
        }
    }
}

fn at_least(flag: &'static str, got: u64, min: u64) -> Result<(), ConfigError> {
    if got < min {
        return Err(ConfigError::TooSmall { flag, min, got });
    }
    Ok(())
}

fn at_most(flag: &'static str, got: u64, max: u64) -> Result<(), ConfigError> {
    if got > max {
        return Err(ConfigError::TooLarge { flag, max, got });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> Result<Args, clap::Error> {
        specmesh_server::cli::try_parse_from(&SERVICE, argv)
    }

    fn parse(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["specmesh-gateway", "--model", "/m.gguf"];
        argv.extend_from_slice(extra);
        Config::try_from(args(&argv).unwrap())
    }

    #[test]
    fn endpoint_lists_are_split_trimmed_and_checked() {
        let c = parse(&[
            "--verifiers",
            "http://v-0.v:50052, http://v-1.v:50052",
            "--drafters",
            "http://d-0.d:50061",
        ])
        .unwrap();
        let names = |l: &[MemberSource]| l.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            names(&c.verifiers),
            ["http://v-0.v:50052", "http://v-1.v:50052"]
        );
        assert_eq!(names(&c.drafters), ["http://d-0.d:50061"]);
        assert_eq!(c.resolve_interval, Duration::from_secs(5));
        assert_eq!(c.request_timeout, Duration::from_secs(300));
        assert_eq!(c.max_concurrent_requests, 64);
        assert_eq!(c.max_message_bytes, 4 << 20);
    }

    #[test]
    fn bad_endpoints_name_the_flag_and_the_entry() {
        let err = parse(&["--verifiers", "http://a:1,http://a:1"]).unwrap_err();
        assert_eq!(err.to_string(), "`--verifiers` lists `http://a:1` twice");
        let err = parse(&["--verifiers", "a:1"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`--verifiers` entry `a:1` must look like http://host:port or dns:///name:port"
        );
        let err = parse(&["--verifiers", "https://a:1"]).unwrap_err();
        assert!(err.to_string().contains("must look like http://"), "{err}");
        let err = parse(&["--verifiers", "http://a:1", "--drafters", "http://a b"]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("`--drafters` entry `http://a b` is not a valid URI"),
            "{err}"
        );
        let err = parse(&["--verifiers", " , "]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`--verifiers` must list at least one endpoint"
        );
    }

    #[test]
    fn dns_entries_name_a_host_and_port() {
        let c = parse(&[
            "--verifiers",
            "dns:///specmesh-verifier:50052,http://10.0.0.9:50052",
            "--drafters",
            "dns:///specmesh-drafter.ml.svc.cluster.local:50061",
            "--resolve-interval-ms",
            "1000",
        ])
        .unwrap();
        assert_eq!(
            c.verifiers[0],
            MemberSource::Dns {
                host: "specmesh-verifier".into(),
                port: 50052
            }
        );
        assert_eq!(
            c.verifiers[1],
            MemberSource::Static("http://10.0.0.9:50052".into())
        );
        assert_eq!(
            c.drafters[0].to_string(),
            "dns:///specmesh-drafter.ml.svc.cluster.local:50061"
        );
        assert_eq!(c.resolve_interval, Duration::from_secs(1));
        // Each malformed entry's message: the service kit's tests
        // (specmesh_server::discovery); here, that the flag is named.
        let err = parse(&["--verifiers", "dns:///v"]).unwrap_err().to_string();
        assert!(
            err.starts_with("`--verifiers` entry `dns:///v` is not a valid URI")
                && err.contains("the port is missing"),
            "{err}"
        );
        let err = parse(&["--verifiers", "dns:///v:1,dns:///v:1"]).unwrap_err();
        assert_eq!(err.to_string(), "`--verifiers` lists `dns:///v:1` twice");
        let err = parse(&["--verifiers", "dns:///v:1", "--resolve-interval-ms", "10"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`--resolve-interval-ms` must be at least 100, got 10"
        );
    }

    #[test]
    fn limits_must_be_positive() {
        let err = parse(&[
            "--verifiers",
            "http://a:1",
            "--max-concurrent-requests",
            "0",
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`--max-concurrent-requests` must be at least 1, got 0"
        );
        let err = parse(&["--verifiers", "http://a:1", "--request-timeout-secs", "0"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`--request-timeout-secs` must be at least 1, got 0"
        );
    }

    #[test]
    fn a_missing_verifier_flag_is_a_usage_error() {
        assert!(args(&["specmesh-gateway"]).is_err());
    }

    #[test]
    fn the_flag_reference_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags/gateway.md");
        specmesh_server::cli::check_flags_file::<Args>(&SERVICE, &path);
    }
}
