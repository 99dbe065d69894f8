//! Who a peer is: the subject alternative names of its certificate, and
//! whether an allowlist admits them. Pure: no I/O, unit-tested.

use std::fmt;
use std::net::IpAddr;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The identities a certificate names: its DNS names, URIs (SPIFFE IDs
/// such as `spiffe://cluster.local/ns/specmesh/sa/gateway`) and IP
/// addresses, as text.
pub fn subject_alt_names(der: &[u8]) -> Result<Vec<String>, String> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| format!("unreadable certificate: {e}"))?;
    let Some(san) = cert
        .subject_alternative_name()
        .map_err(|e| format!("unreadable subject alternative names: {e}"))?
    else {
        return Ok(Vec::new());
    };
    Ok(san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(s) | GeneralName::URI(s) => Some((*s).to_string()),
            GeneralName::IPAddress(bytes) => ip(bytes).map(|ip| ip.to_string()),
            _ => None,
        })
        .collect())
}

/// Seconds since the Unix epoch when the certificate stops being valid.
pub fn not_after(der: &[u8]) -> Result<i64, String> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| format!("unreadable certificate: {e}"))?;
    Ok(cert.validity().not_after.timestamp())
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// The client identities allowed to call a service; empty admits every
/// certificate the mesh CA signed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist(Vec<String>);

impl Allowlist {
    pub fn new(names: impl IntoIterator<Item = String>) -> Allowlist {
        Allowlist(
            names
                .into_iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether one of `names` is on the list (exact match; DNS names
    /// without regard to case, as DNS compares them).
    pub fn admits(&self, names: &[String]) -> bool {
        self.0.is_empty()
            || names.iter().any(|name| {
                // URIs and IPv6 addresses (those with a colon) match exactly.
                let dns = !name.contains(':');
                self.0
                    .iter()
                    .any(|allowed| allowed == name || (dns && allowed.eq_ignore_ascii_case(name)))
            })
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(names: &[&str]) -> Vec<u8> {
        let names: Vec<String> = names.iter().map(|s| (*s).to_string()).collect();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(names).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn names_come_out_of_the_certificate() {
        let der = cert(&["gateway.specmesh.svc", "127.0.0.1", "::1"]);
        assert_eq!(
            subject_alt_names(&der).unwrap(),
            ["gateway.specmesh.svc", "127.0.0.1", "::1"]
        );
        assert!(not_after(&der).unwrap() > 0);
        assert!(subject_alt_names(b"not a certificate").is_err());
    }

    #[test]
    fn the_allowlist_admits_exact_names_only() {
        let list = Allowlist::new(["Gateway.specmesh.svc".to_string(), " ".to_string()]);
        assert!(list.admits(&["gateway.specmesh.svc".into()]));
        assert!(!list.admits(&["verifier.specmesh.svc".into()]));
        assert!(!list.admits(&[]));
        let spiffe = Allowlist::new(["spiffe://td/ns/specmesh/sa/gateway".to_string()]);
        assert!(spiffe.admits(&["spiffe://td/ns/specmesh/sa/gateway".into()]));
        assert!(!spiffe.admits(&["spiffe://td/ns/specmesh/sa/Gateway".into()]));
        assert!(
            Allowlist::default().admits(&[]),
            "empty: any signed certificate"
        );
    }
}
