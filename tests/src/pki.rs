//! Certificates for the TLS tests, made on the spot with rcgen: a mesh CA,
//! certificates it signs (valid or expired), written as cert-manager
//! writes a Secret (`tls.crt`, `tls.key`, `ca.crt`), and tonic clients that
//! present them.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A certificate authority.
#[allow(missing_debug_implementations)] // rcgen's issuer has no Debug
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate naming `names` (DNS names or IP addresses), for
    /// serving and for calling, valid now.
    pub fn issue(&self, names: &[&str]) -> Leaf {
        self.leaf(names, false)
    }

    /// The same, but expired in 2021.
    pub fn issue_expired(&self, names: &[&str]) -> Leaf {
        self.leaf(names, true)
    }

    fn leaf(&self, names: &[&str], expired: bool) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| (*n).to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A service's TLS files in their own directory.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    /// Writes `leaf` and `ca_pem` into `dir` (created).
    pub fn write(dir: &Path, leaf: &Leaf, ca_pem: &str) -> TlsFiles {
        std::fs::create_dir_all(dir).unwrap();
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        };
        files.replace(leaf, ca_pem);
        files
    }

    /// Replaces the files, each atomically (write, then rename), as a
    /// rotation does.
    pub fn replace(&self, leaf: &Leaf, ca_pem: &str) {
        for (path, text) in [
            (&self.key, &leaf.key),
            (&self.cert, &leaf.cert),
            (&self.ca, &ca_pem.to_string()),
        ] {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, path).unwrap();
        }
    }

    /// `--tls-cert … --tls-key … --tls-ca …`.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
            "--tls-ca".into(),
            self.ca.display().to_string(),
        ]
    }
}

/// A TLS channel to `url` (`http://ADDR` as services print it) trusting
/// `ca_pem`, expecting the server to be `name`, presenting `identity` if
/// given; connected now, so a refused handshake is the error.
pub async fn tls_channel(
    url: &str,
    ca_pem: &str,
    name: &str,
    identity: Option<&Leaf>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(name);
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert, &leaf.key));
    }
    Channel::from_shared(url.replacen("http://", "https://", 1))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}
