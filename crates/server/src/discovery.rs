//! Members of a peer role (verifiers, drafters) from the command line: a
//! list of `http://host:port` entries (static members, dialed by name as
//! given) and `dns:///NAME:PORT` entries, each standing for every A and
//! AAAA record of NAME (in Kubernetes, a headless Service: one record per
//! ready pod), each a member `http://ADDRESS:PORT`.
//!
//! The gateway resolves its `--verifiers` and `--drafters` this way to
//! place sessions; a verifier resolves its own `--drafters` the same way,
//! so the member identities (the endpoint strings) agree, and refuses a
//! draft plan naming anything outside its set.
//!
//! The syntax is gRPC's own target name (`dns:[//authority]/host:port`),
//! without the authority: names are resolved with the system's resolver
//! configuration (`/etc/resolv.conf`, with the pod's search domains and
//! `ndots`), through `hickory-resolver` rather than `getaddrinfo` because
//! membership must tell "the name has no records" (the Service has no ready
//! pod: no members) from "the DNS server did not answer" (keep the members
//! we have).

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;

use hickory_resolver::TokioResolver;
use tonic::codegen::http::Uri;
use tracing::{info, warn};

/// Where the members of one list entry come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberSource {
    /// `http://host:port`: one member, as given.
    Static(String),
    /// `dns:///host:port`: every address `host` resolves to.
    Dns { host: String, port: u16 },
}

impl fmt::Display for MemberSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemberSource::Static(endpoint) => f.write_str(endpoint),
            MemberSource::Dns { host, port } => write!(f, "dns:///{host}:{port}"),
        }
    }
}

/// A list entry that names no member; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("`--{flag}` entry `{endpoint}` is not a valid URI: {reason}")]
    BadEndpoint {
        flag: &'static str,
        endpoint: String,
        reason: String,
    },
    #[error("`--{flag}` entry `{endpoint}` must look like http://host:port or dns:///name:port")]
    EndpointShape {
        flag: &'static str,
        endpoint: String,
    },
    #[error("`--{flag}` lists `{endpoint}` twice")]
    DuplicateEndpoint {
        flag: &'static str,
        endpoint: String,
    },
}

/// Parses the entries of `--{flag}`: blanks dropped (an empty environment
/// variable means none), every entry `http://host[:port]` or
/// `dns:///name:port`, no duplicates.
pub fn parse_sources(flag: &'static str, raw: &[String]) -> Result<Vec<MemberSource>, SourceError> {
    let mut out: Vec<MemberSource> = Vec::with_capacity(raw.len());
    for entry in raw.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let source = if entry.starts_with("dns:") {
            dns_name(flag, entry)?
        } else {
            MemberSource::Static(http_endpoint(flag, entry)?)
        };
        if out.contains(&source) {
            return Err(SourceError::DuplicateEndpoint {
                flag,
                endpoint: entry.to_owned(),
            });
        }
        out.push(source);
    }
    Ok(out)
}

/// Whether any entry is a DNS name (else the list never changes).
pub fn is_dynamic(sources: &[MemberSource]) -> bool {
    sources
        .iter()
        .any(|s| matches!(s, MemberSource::Dns { .. }))
}

/// `dns:///name:port` (gRPC's target syntax; a DNS server in the authority
/// is not supported: names resolve through the system's configuration).
fn dns_name(flag: &'static str, entry: &str) -> Result<MemberSource, SourceError> {
    let bad = |reason: &str| SourceError::BadEndpoint {
        flag,
        endpoint: entry.to_owned(),
        reason: reason.to_owned(),
    };
    let Some(rest) = entry.strip_prefix("dns:///") else {
        return Err(bad(
            "DNS entries look like dns:///name:port (no DNS server in the entry: the system's resolver is used)",
        ));
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(bad("the port is missing (dns:///name:port)"));
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?;
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if !valid {
        return Err(bad(
            "the name must be a DNS name (letters, digits, '.', '-')",
        ));
    }
    Ok(MemberSource::Dns {
        host: host.to_owned(),
        port,
    })
}

/// A plain `http://host[:port]` URI with nothing after the authority.
fn http_endpoint(flag: &'static str, entry: &str) -> Result<String, SourceError> {
    let uri: Uri = entry
        .parse()
        .map_err(
            |e: tonic::codegen::http::uri::InvalidUri| SourceError::BadEndpoint {
                flag,
                endpoint: entry.to_owned(),
                reason: e.to_string(),
            },
        )?;
    // TLS is the service's setting (`--tls-*`) for every member, not an
    // entry's: `https://` would say something the flags may contradict.
    let plain_http = uri.scheme_str() == Some("http");
    let bare = uri.path_and_query().is_none_or(|p| p.as_str() == "/");
    if !plain_http || uri.host().is_none() || !bare {
        return Err(SourceError::EndpointShape {
            flag,
            endpoint: entry.to_owned(),
        });
    }
    Ok(entry.to_owned())
}

/// The DNS names of some lists and what each resolved to when it last
/// answered.
#[derive(Debug, Default)]
pub struct Resolver {
    /// Built on first use: the system configuration is read once (a pod's
    /// does not change), and a failure to read it is retried next time.
    resolver: Option<TokioResolver>,
    resolved: HashMap<(String, u16), Vec<String>>,
}

impl Resolver {
    /// The members of `sources`: static entries as given and each name's
    /// addresses (sorted, so the list is stable), without repeats. A name
    /// not resolved yet has none.
    pub fn members(&self, sources: &[MemberSource]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for source in sources {
            let endpoints = match source {
                MemberSource::Static(endpoint) => std::slice::from_ref(endpoint),
                MemberSource::Dns { host, port } => self
                    .resolved
                    .get(&(host.clone(), *port))
                    .map_or(&[][..], Vec::as_slice),
            };
            for endpoint in endpoints {
                if !out.contains(endpoint) {
                    out.push(endpoint.clone());
                }
            }
        }
        out
    }

    /// Resolves every DNS name of `sources` again; a name whose lookup
    /// fails other than with "no such records" keeps its last answer.
    /// False when no lookup could be made (the system's DNS configuration
    /// did not load; tried again next time).
    pub async fn refresh(&mut self, sources: &[MemberSource]) -> bool {
        if self.resolver.is_none() {
            match TokioResolver::builder_tokio().and_then(|b| b.build()) {
                Ok(r) => self.resolver = Some(r),
                Err(e) => {
                    warn!(error = %e, "cannot read the system's DNS configuration: retrying");
                    return false;
                }
            }
        }
        let Some(resolver) = self.resolver.as_ref() else {
            return false;
        };
        for source in sources {
            let MemberSource::Dns { host, port } = source else {
                continue;
            };
            let endpoints = match resolver.lookup_ip(host.as_str()).await {
                Ok(found) => {
                    let mut endpoints: Vec<String> = found
                        .iter()
                        .map(|ip| format!("http://{}", SocketAddr::new(ip, *port)))
                        .collect();
                    endpoints.sort();
                    endpoints.dedup();
                    endpoints
                }
                Err(e) if e.is_no_records_found() => Vec::new(),
                Err(e) => {
                    warn!(name = %host, error = %e, "DNS lookup failed: keeping the members it gave last");
                    continue;
                }
            };
            let before = self
                .resolved
                .insert((host.clone(), *port), endpoints.clone());
            if before.as_ref() != Some(&endpoints) {
                info!(name = %host, addresses = endpoints.len(), "DNS name resolved");
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flag: &'static str, raw: &str) -> Result<Vec<MemberSource>, SourceError> {
        parse_sources(flag, &raw.split(',').map(str::to_owned).collect::<Vec<_>>())
    }

    #[test]
    fn entries_are_trimmed_and_checked_and_errors_name_the_flag() {
        let names = |l: &[MemberSource]| l.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            names(&parse("drafters", "http://d-0.d:50061, dns:///d:50061,").unwrap()),
            ["http://d-0.d:50061", "dns:///d:50061"]
        );
        assert!(parse("drafters", " , ").unwrap().is_empty());
        let err = |raw| parse("drafters", raw).unwrap_err().to_string();
        assert_eq!(
            err("http://a:1,http://a:1"),
            "`--drafters` lists `http://a:1` twice"
        );
        assert_eq!(
            err("a:1"),
            "`--drafters` entry `a:1` must look like http://host:port or dns:///name:port"
        );
        assert!(err("https://a:1").contains("must look like http://"));
        assert!(err("http://a:1/x").contains("must look like http://"));
        assert!(
            err("http://a b").starts_with("`--drafters` entry `http://a b` is not a valid URI")
        );
        for (entry, why) in [
            ("dns:///v", "the port is missing"),
            ("dns:///v:0", "from 1 to 65535"),
            ("dns:///v:x", "from 1 to 65535"),
            ("dns://10.0.0.10/v:1", "no DNS server in the entry"),
            ("dns:///:1", "must be a DNS name"),
            ("dns:///a/b:1", "must be a DNS name"),
        ] {
            assert!(err(entry).contains(why), "{entry}: {}", err(entry));
        }
    }

    #[test]
    fn static_entries_come_first_and_names_add_their_addresses() {
        let sources = parse(
            "verifiers",
            "http://v-0:50052,dns:///verifier:50052,http://10.0.0.2:50052",
        )
        .unwrap();
        assert!(is_dynamic(&sources));
        assert!(!is_dynamic(&sources[..1]));
        let mut resolver = Resolver::default();
        assert_eq!(
            resolver.members(&sources),
            ["http://v-0:50052", "http://10.0.0.2:50052"],
            "a name not resolved yet has no members"
        );
        resolver.resolved.insert(
            ("verifier".into(), 50052),
            vec![
                "http://10.0.0.1:50052".into(),
                "http://10.0.0.2:50052".into(),
            ],
        );
        assert_eq!(
            resolver.members(&sources),
            [
                "http://v-0:50052",
                "http://10.0.0.1:50052",
                "http://10.0.0.2:50052"
            ]
        );
    }

    #[test]
    fn ipv6_addresses_are_bracketed() {
        let ip: std::net::IpAddr = "fd00::7".parse().unwrap();
        assert_eq!(
            format!("http://{}", SocketAddr::new(ip, 50052)),
            "http://[fd00::7]:50052"
        );
    }
}
