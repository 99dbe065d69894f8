//! DNS membership: a `dns:///NAME:PORT` entry of `--verifiers` or
//! `--drafters` stands for every A and AAAA record of NAME (in Kubernetes,
//! a headless Service: one record per ready pod), each a member
//! `http://ADDRESS:PORT`. The gateway resolves such names every
//! `--resolve-interval-ms` and sets the member lists ([`Members::set`]), so
//! scaling a Deployment needs no gateway restart. `http://host:port`
//! entries are static members, connected to by name as given.
//!
//! The syntax is gRPC's own target name (`dns:[//authority]/host:port`),
//! without the authority: names are resolved with the system's resolver
//! configuration (`/etc/resolv.conf`, with the pod's search domains and
//! `ndots`), through `hickory-resolver` rather than `getaddrinfo` because
//! membership must tell "the name has no records" (the Service has no ready
//! pod: no members) from "the DNS server did not answer" (keep the members
//! we have).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use tracing::{info, warn};

use crate::health::Role;
use crate::members::Members;

/// Where the members of one `--verifiers` / `--drafters` entry come from.
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

/// Every entry of both flags, and how often to resolve the DNS ones.
#[derive(Debug, Clone)]
pub struct Sources {
    pub verifiers: Vec<MemberSource>,
    pub drafters: Vec<MemberSource>,
    pub interval: Duration,
}

impl Sources {
    /// Whether any entry is a DNS name (else the lists never change).
    pub fn is_dynamic(&self) -> bool {
        self.verifiers
            .iter()
            .chain(&self.drafters)
            .any(|s| matches!(s, MemberSource::Dns { .. }))
    }

    /// The lists before any name is resolved: the static entries.
    pub fn initial(&self, role: Role) -> Vec<String> {
        let mut lists = Resolved::default();
        lists.members(self.of(role))
    }

    fn of(&self, role: Role) -> &[MemberSource] {
        match role {
            Role::Verifier => &self.verifiers,
            Role::Drafter => &self.drafters,
        }
    }
}

/// What each DNS name resolved to last time it answered.
#[derive(Debug, Default)]
struct Resolved(std::collections::HashMap<(String, u16), Vec<String>>);

impl Resolved {
    /// The members of `sources`: static entries as given and each name's
    /// addresses (sorted, so the list is stable), without repeats.
    fn members(&mut self, sources: &[MemberSource]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for source in sources {
            let endpoints = match source {
                MemberSource::Static(endpoint) => vec![endpoint.clone()],
                MemberSource::Dns { host, port } => self
                    .0
                    .get(&(host.clone(), *port))
                    .cloned()
                    .unwrap_or_default(),
            };
            for endpoint in endpoints {
                if !out.contains(&endpoint) {
                    out.push(endpoint);
                }
            }
        }
        out
    }

    /// Resolves one name; on a failure other than "no such records" the
    /// last answer stands.
    async fn refresh(&mut self, resolver: &TokioResolver, host: &str, port: u16) {
        let key = (host.to_owned(), port);
        let endpoints = match resolver.lookup_ip(host).await {
            Ok(found) => {
                let mut endpoints: Vec<String> = found
                    .iter()
                    .map(|ip| format!("http://{}", SocketAddr::new(ip, port)))
                    .collect();
                endpoints.sort();
                endpoints.dedup();
                endpoints
            }
            Err(e) if e.is_no_records_found() => Vec::new(),
            Err(e) => {
                warn!(name = host, error = %e, "DNS lookup failed: keeping the members it gave last");
                return;
            }
        };
        let before = self.0.insert(key, endpoints.clone());
        if before.as_ref() != Some(&endpoints) {
            info!(
                name = host,
                addresses = endpoints.len(),
                "DNS name resolved"
            );
        }
    }
}

/// Resolves the DNS entries of `sources` now and every interval after,
/// setting `members` each time; runs until dropped.
pub async fn run(members: Arc<Members>, sources: Sources) {
    let mut resolved = Resolved::default();
    let mut resolver: Option<TokioResolver> = None;
    let names: Vec<(String, u16)> = sources
        .verifiers
        .iter()
        .chain(&sources.drafters)
        .filter_map(|s| match s {
            MemberSource::Dns { host, port } => Some((host.clone(), *port)),
            MemberSource::Static(_) => None,
        })
        .collect();
    let mut ticker = tokio::time::interval(sources.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if resolver.is_none() {
            // The system configuration is read once; a pod's does not change.
            match TokioResolver::builder_tokio().and_then(|b| b.build()) {
                Ok(r) => resolver = Some(r),
                Err(e) => {
                    warn!(error = %e, "cannot read the system's DNS configuration: retrying");
                    continue;
                }
            }
        }
        let Some(r) = resolver.as_ref() else { continue };
        for (host, port) in &names {
            resolved.refresh(r, host, *port).await;
        }
        members.set(Role::Verifier, &resolved.members(&sources.verifiers));
        members.set(Role::Drafter, &resolved.members(&sources.drafters));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_entries_come_first_and_names_add_their_addresses() {
        let sources = vec![
            MemberSource::Static("http://v-0:50052".into()),
            MemberSource::Dns {
                host: "verifier".into(),
                port: 50052,
            },
            MemberSource::Static("http://10.0.0.2:50052".into()),
        ];
        let mut resolved = Resolved::default();
        assert_eq!(
            resolved.members(&sources),
            ["http://v-0:50052", "http://10.0.0.2:50052"],
            "a name not resolved yet has no members"
        );
        resolved.0.insert(
            ("verifier".into(), 50052),
            vec![
                "http://10.0.0.1:50052".into(),
                "http://10.0.0.2:50052".into(),
            ],
        );
        assert_eq!(
            resolved.members(&sources),
            [
                "http://v-0:50052",
                "http://10.0.0.1:50052",
                "http://10.0.0.2:50052"
            ]
        );
        assert_eq!(sources[1].to_string(), "dns:///verifier:50052");
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
