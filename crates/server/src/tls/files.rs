//! The certificate, key and CA files, read into rustls configurations.
//! [`Loaded`] is one reading; [`MeshTls`](super::MeshTls) keeps the
//! current one and reads again when the files change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::{ClientAuth, TlsError, identity};

/// The three files a service's TLS comes from (what cert-manager or a
/// SPIFFE agent writes: `tls.crt`, `tls.key`, `ca.crt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This service's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The mesh CA (PEM, one or more certificates): peers' certificates
    /// must chain to it.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The files' bytes, to load and to tell a change.
    pub(super) fn read(&self) -> Result<Contents, TlsError> {
        Ok(Contents {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            ca: read(&self.ca)?,
        })
    }
}

/// The files' bytes, as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
}

/// One reading of the files: the configurations new connections use.
#[derive(Debug)]
pub(super) struct Loaded {
    pub contents: Contents,
    pub server: Arc<ServerConfig>,
    pub client: Arc<ClientConfig>,
    /// The names this service's own certificate carries, for the logs.
    pub names: Vec<String>,
    /// When this service's certificate expires (Unix seconds).
    pub not_after: i64,
}

/// HTTP/2 is all gRPC speaks; ALPN says so in the handshake.
const ALPN_H2: &[u8] = b"h2";

impl Loaded {
    pub fn from_contents(
        files: &TlsFiles,
        contents: Contents,
        client_auth: ClientAuth,
    ) -> Result<Loaded, TlsError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&contents.cert)
            .collect::<Result<_, _>>()
            .map_err(|e| {
                TlsError::file(&files.cert, format!("not a PEM certificate chain: {e}"))
            })?;
        let Some(leaf) = chain.first() else {
            return Err(TlsError::file(&files.cert, "holds no certificate"));
        };
        let names =
            identity::subject_alt_names(leaf).map_err(|e| TlsError::file(&files.cert, e))?;
        let not_after = identity::not_after(leaf).map_err(|e| TlsError::file(&files.cert, e))?;
        let key = PrivateKeyDer::from_pem_slice(&contents.key)
            .map_err(|e| TlsError::file(&files.key, format!("not a PEM private key: {e}")))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&contents.ca) {
            let ca =
                ca.map_err(|e| TlsError::file(&files.ca, format!("not a PEM certificate: {e}")))?;
            roots.add(ca).map_err(|e| {
                TlsError::file(&files.ca, format!("not a usable CA certificate: {e}"))
            })?;
        }
        if roots.is_empty() {
            return Err(TlsError::file(&files.ca, "holds no certificate"));
        }
        let roots = Arc::new(roots);
        let provider = provider();

        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
        let verifier = match client_auth {
            ClientAuth::Required => verifier.build(),
            ClientAuth::Optional => verifier.allow_unauthenticated().build(),
        }
        .map_err(|e| TlsError::file(&files.ca, format!("cannot verify clients with it: {e}")))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| {
                TlsError::file(&files.key, format!("does not match the certificate: {e}"))
            })?;
        server.alpn_protocols = vec![ALPN_H2.to_vec()];

        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| {
                TlsError::file(&files.key, format!("does not match the certificate: {e}"))
            })?;
        client.alpn_protocols = vec![ALPN_H2.to_vec()];

        Ok(Loaded {
            contents,
            server: Arc::new(server),
            client: Arc::new(client),
            names,
            not_after,
        })
    }
}

/// ring: pure Rust and assembly, no C toolchain or cmake in the build.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::file(path, format!("cannot read it: {e}")))
}
