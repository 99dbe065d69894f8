//! Transport security: TLS on every listener and every connection between
//! the services, mutual inside the mesh (rustls, ring provider).
//!
//! A service is given its certificate, key and the mesh CA as files
//! (`--tls-cert`, `--tls-key`, `--tls-ca`: what cert-manager or a SPIFFE
//! agent writes). It presents that certificate both as a server and as a
//! client, and accepts a peer only if the peer's certificate chains to the
//! CA. On top of that a service may admit only some client identities to
//! its API (`--tls-allow-san`: the verifier only the gateway's, the drafter
//! only the verifiers'), checked per call by [`Authorize`] so that health
//! stays open to every mesh member.
//!
//! The files are read again every `--tls-reload-ms` and, when their bytes
//! changed and load, new connections use them: rotation needs no restart,
//! and connections already open (running streams) keep the keys they
//! agreed on. Files that fail to load keep the previous ones in use, with a
//! warning.
//!
//! Without the files a service refuses to start unless told `--plaintext`
//! (local development), and then warns that it is.

mod connector;
mod files;
pub mod identity;
mod incoming;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::{ClientConfig, ServerConfig};
use tonic::{Request, Status};
use tracing::{info, warn};

pub use connector::Connector;
pub use files::TlsFiles;
pub use identity::Allowlist;
pub use incoming::incoming;

/// The TLS flags every service has; flattened into [`crate::ServerArgs`].
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct TlsArgs {
    /// PEM certificate chain this service presents to its clients and to
    /// the services it calls (e.g. cert-manager's `tls.crt`).
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert` (`tls.key`).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificates of the mesh CA (`ca.crt`): every peer's certificate
    /// must chain to one of them.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Client identities allowed to call this service's API: names from
    /// the certificate's subject alternative names (DNS name, URI such as
    /// a SPIFFE ID, or IP address), comma-separated. Unset: any client
    /// with a certificate from the mesh CA.
    #[arg(long, value_delimiter = ',', requires = "tls_cert")]
    pub tls_allow_san: Vec<String>,
    /// How often the certificate files are read again for rotation, in ms.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub tls_reload_ms: u64,
    /// Serve and call other services without TLS and without peer
    /// authentication: for local development only.
    #[arg(long, conflicts_with = "tls_cert")]
    pub plaintext: bool,
}

impl TlsArgs {
    /// `--plaintext`: what in-process tests and local tools use.
    pub fn plaintext() -> TlsArgs {
        TlsArgs {
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            tls_allow_san: Vec::new(),
            tls_reload_ms: 10_000,
            plaintext: true,
        }
    }
}

/// Whether a server demands a client certificate during the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Only mesh members call it (verifier, drafter).
    Required,
    /// Callers may come without one and authenticate otherwise (the
    /// gateway's API keys); a certificate they do present must verify.
    Optional,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "no TLS configured: give --tls-cert, --tls-key and --tls-ca (the mesh certificate, its key \
         and the mesh CA), or --plaintext to run without TLS for local development"
    )]
    NotConfigured,
    #[error("`{path}` {reason}")]
    File { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(rustls::Error),
}

impl TlsError {
    fn file(path: &Path, reason: impl Into<String>) -> TlsError {
        TlsError::File {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// How a service talks: plaintext (development) or TLS from its files.
/// Cheap to clone; every clone sees the same rotation.
#[derive(Debug, Clone)]
pub enum Security {
    Plaintext,
    Tls(Arc<MeshTls>),
}

impl Security {
    /// The security `args` ask for, loaded (TLS) or announced
    /// (plaintext, with a warning). Call inside the runtime: TLS starts
    /// watching its files for rotation.
    pub fn from_args(args: &TlsArgs, client_auth: ClientAuth) -> Result<Security, TlsError> {
        if args.plaintext {
            warn!("serving and calling without TLS (--plaintext): for local development only");
            return Ok(Security::Plaintext);
        }
        let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca)
        else {
            return Err(TlsError::NotConfigured);
        };
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        };
        let allow = Allowlist::new(args.tls_allow_san.iter().cloned());
        let tls = MeshTls::load(files, client_auth, allow)?;
        crate::reload::every(
            &tls,
            Duration::from_millis(args.tls_reload_ms),
            "TLS files changed but do not load: keeping the previous ones",
            MeshTls::reload,
        );
        Ok(Security::Tls(tls))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Security::Tls(_))
    }

    /// The per-call check of the client's identity against `names`
    /// (empty: any certificate of the mesh CA), for an API of its own
    /// (without TLS: none).
    pub fn authorize_names(&self, names: &[String]) -> Authorize {
        Authorize(match self {
            Security::Plaintext => None,
            Security::Tls(_) => Some(Arc::new(Allowlist::new(names.iter().cloned()))),
        })
    }

    /// The per-call check of the client's identity against
    /// `--tls-allow-san`, for the service's own API.
    pub fn authorize(&self) -> Authorize {
        Authorize(match self {
            Security::Plaintext => None,
            Security::Tls(tls) => Some(tls.allow.clone()),
        })
    }
}

/// A service's TLS: its files, the configuration in use, and rotation.
#[derive(Debug)]
pub struct MeshTls {
    files: TlsFiles,
    client_auth: ClientAuth,
    allow: Arc<Allowlist>,
    current: RwLock<files::Loaded>,
}

impl MeshTls {
    /// Reads and checks the files.
    pub fn load(
        files: TlsFiles,
        client_auth: ClientAuth,
        allow: Allowlist,
    ) -> Result<Arc<MeshTls>, TlsError> {
        let loaded = files::Loaded::from_contents(&files, files.read()?, client_auth)?;
        announce(&loaded, &allow, "TLS on");
        Ok(Arc::new(MeshTls {
            files,
            client_auth,
            allow: Arc::new(allow),
            current: RwLock::new(loaded),
        }))
    }

    /// The server configuration new connections get.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .server
            .clone()
    }

    /// The client configuration new connections get.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .client
            .clone()
    }

    /// Reads the files again; if they changed and load, new connections
    /// use them. `Ok(true)`: rotated.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let contents = self.files.read()?;
        if self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contents
            == contents
        {
            return Ok(false);
        }
        let loaded = files::Loaded::from_contents(&self.files, contents, self.client_auth)?;
        announce(&loaded, &self.allow, "TLS certificates rotated");
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = loaded;
        Ok(true)
    }
}

fn announce(loaded: &files::Loaded, allow: &Allowlist, what: &str) {
    let expires_in_s = loaded.not_after - unix_now();
    if expires_in_s <= 0 {
        warn!(names = ?loaded.names, "this service's certificate has expired: peers will refuse it");
    }
    info!(
        names = ?loaded.names,
        expires_in_s,
        allowed_clients = %if allow.is_empty() { "any the mesh CA signed".to_string() } else { allow.to_string() },
        "{what}"
    );
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A tonic interceptor admitting only clients whose certificate names an
/// identity on the allowlist (all, when it is empty). Wrap a service's
/// own API with it, not health: probes and the gateway's health watch come
/// from other identities.
#[derive(Debug, Clone)]
pub struct Authorize(Option<Arc<Allowlist>>);

impl tonic::service::Interceptor for Authorize {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(allow) = &self.0 else {
            return Ok(request);
        };
        let Some(certs) = request.peer_certs() else {
            return Err(Status::unauthenticated(
                "this API needs a client certificate signed by the mesh CA",
            ));
        };
        if allow.is_empty() {
            return Ok(request);
        }
        let names = certs
            .first()
            .map(|leaf| identity::subject_alt_names(leaf).unwrap_or_default())
            .unwrap_or_default();
        if allow.admits(&names) {
            Ok(request)
        } else {
            Err(Status::permission_denied(format!(
                "client identity {names:?} may not call this API (allowed: {allow})"
            )))
        }
    }
}
