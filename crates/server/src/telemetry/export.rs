//! The OTLP span exporter, configured by the OpenTelemetry specification's
//! own environment variables (what the OpenTelemetry Operator and every
//! collector guide set), so a platform team's settings work unchanged:
//!
//! - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`:
//!   where to (set: exporting is on); `https://` means TLS;
//! - `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`:
//!   `grpc` (the default) or `http/protobuf`;
//! - `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` / `OTEL_EXPORTER_OTLP_CERTIFICATE`:
//!   the CA (PEM) that signed the collector's certificate (default: the
//!   public web roots);
//! - `OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE` / `..._CLIENT_KEY` (and
//!   the generic ones): a client certificate for a collector that asks for
//!   one (mutual TLS).
//!
//! `opentelemetry-otlp` reads the endpoint, protocol, headers, timeout and
//! compression itself; it does not read the certificate variables, so the
//! TLS settings are built here: tonic's for gRPC, a rustls client (ring,
//! the provider every other connection of ours uses) for HTTP. Over HTTP
//! the exporter uses reqwest's blocking client: the SDK's batch processor
//! exports from a thread of its own, outside the Tokio runtime.

use std::path::PathBuf;
use std::sync::Arc;

use opentelemetry_otlp::{SpanExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_otlp::{WithTonicConfig as _, tonic_types::transport::ClientTlsConfig};

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    pub(super) fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "OTLP/gRPC",
            Protocol::HttpProtobuf => "OTLP/HTTP (protobuf)",
        }
    }
}

/// Why spans cannot be exported as configured; the service logs it and
/// runs without exporting.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExportError {
    #[error(
        "`{var}={value}` is not a protocol this build exports with: use `grpc` or `http/protobuf`"
    )]
    Protocol { var: &'static str, value: String },
    #[error("`{var}` ({path}): {reason}")]
    File {
        var: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("`{var}` is set without `{missing}`: a client certificate needs its key and back")]
    HalfIdentity {
        var: &'static str,
        missing: &'static str,
    },
    #[error("building the exporter: {0}")]
    Build(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("building the HTTP client: {0}")]
    Http(String),
}

/// The first variable of `vars` that is set and not blank, with its name.
fn env(vars: [&'static str; 2]) -> Option<(&'static str, String)> {
    vars.into_iter().find_map(|var| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (var, v.trim().to_string()))
    })
}

/// The protocol the environment asks for (gRPC when it asks for none).
pub(super) fn protocol() -> Result<Protocol, ExportError> {
    match env([
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]) {
        None => Ok(Protocol::Grpc),
        Some((_, v)) if v == "grpc" => Ok(Protocol::Grpc),
        Some((_, v)) if v == "http/protobuf" => Ok(Protocol::HttpProtobuf),
        Some((var, value)) => Err(ExportError::Protocol { var, value }),
    }
}

/// A PEM file named by an environment variable, read.
struct Pem {
    var: &'static str,
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Pem {
    fn from_env(vars: [&'static str; 2]) -> Result<Option<Pem>, ExportError> {
        let Some((var, path)) = env(vars) else {
            return Ok(None);
        };
        let path = PathBuf::from(path);
        let bytes = std::fs::read(&path).map_err(|e| ExportError::File {
            var,
            path: path.clone(),
            reason: format!("cannot read it: {e}"),
        })?;
        Ok(Some(Pem { var, path, bytes }))
    }

    fn bad(&self, reason: impl std::fmt::Display) -> ExportError {
        ExportError::File {
            var: self.var,
            path: self.path.clone(),
            reason: reason.to_string(),
        }
    }
}

/// The TLS files the environment names.
struct TlsEnv {
    ca: Option<Pem>,
    /// The client's certificate and its key.
    identity: Option<(Pem, Pem)>,
}

impl TlsEnv {
    fn read() -> Result<TlsEnv, ExportError> {
        let ca = Pem::from_env([
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ])?;
        let cert = Pem::from_env([
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        ])?;
        let key = Pem::from_env([
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ])?;
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(c), None) => {
                return Err(ExportError::HalfIdentity {
                    var: c.var,
                    missing: "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                });
            }
            (None, Some(k)) => {
                return Err(ExportError::HalfIdentity {
                    var: k.var,
                    missing: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                });
            }
        };
        Ok(TlsEnv { ca, identity })
    }

    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }
}

/// The exporter for `endpoint` over `protocol`.
pub(super) fn exporter(endpoint: &str, protocol: Protocol) -> Result<SpanExporter, ExportError> {
    let tls = TlsEnv::read()?;
    let https = endpoint.starts_with("https://");
    match protocol {
        Protocol::Grpc => {
            let builder = SpanExporter::builder().with_tonic();
            let builder = if https || !tls.is_empty() {
                builder.with_tls_config(tonic_tls(&tls))
            } else {
                builder
            };
            Ok(builder.build()?)
        }
        Protocol::HttpProtobuf => {
            let client = reqwest::blocking::Client::builder()
                .use_preconfigured_tls(rustls_client(&tls)?)
                .build()
                .map_err(|e| ExportError::Http(e.to_string()))?;
            Ok(SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(client)
                .build()?)
        }
    }
}

fn tonic_tls(tls: &TlsEnv) -> ClientTlsConfig {
    use opentelemetry_otlp::tonic_types::transport::{Certificate, Identity};
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(&ca.bytes)),
        None => config.with_webpki_roots(),
    };
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(&cert.bytes, &key.bytes));
    }
    config
}

/// A rustls client config trusting the CA given (or the public web roots)
/// and presenting the client certificate given, if any.
fn rustls_client(tls: &TlsEnv) -> Result<rustls::ClientConfig, ExportError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&ca.bytes)
                .collect::<Result<_, _>>()
                .map_err(|e| ca.bad(format!("not PEM certificates: {e}")))?;
            if certs.is_empty() {
                return Err(ca.bad("holds no certificate"));
            }
            for c in certs {
                roots.add(c).map_err(|e| ca.bad(e))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ExportError::Http(e.to_string()))?
        .with_root_certificates(roots);
    match &tls.identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert.bytes)
                .collect::<Result<_, _>>()
                .map_err(|e| cert.bad(format!("not PEM certificates: {e}")))?;
            let der = PrivateKeyDer::from_pem_slice(&key.bytes)
                .map_err(|e| key.bad(format!("not a PEM private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, der)
                .map_err(|e| key.bad(format!("does not match the client certificate: {e}")))
        }
    }
}
