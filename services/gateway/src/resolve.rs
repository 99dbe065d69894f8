//! DNS membership: the gateway resolves the `dns:///` entries of
//! `--verifiers` and `--drafters` ([`specmesh_server::discovery`]) every
//! `--resolve-interval-ms` and sets the member lists ([`Members::set`]), so
//! scaling a Deployment needs no gateway restart.

use std::sync::Arc;
use std::time::Duration;

use specmesh_server::discovery::{self, MemberSource, Resolver};

use crate::health::Role;
use crate::members::Members;

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
        discovery::is_dynamic(&self.verifiers) || discovery::is_dynamic(&self.drafters)
    }

    /// The lists before any name is resolved: the static entries.
    pub fn initial(&self, role: Role) -> Vec<String> {
        Resolver::default().members(self.of(role))
    }

    fn of(&self, role: Role) -> &[MemberSource] {
        match role {
            Role::Verifier => &self.verifiers,
            Role::Drafter => &self.drafters,
        }
    }
}

/// Resolves the DNS entries of `sources` now and every interval after,
/// setting `members` each time; runs until dropped.
pub async fn run(members: Arc<Members>, sources: Sources) {
    let mut resolver = Resolver::default();
    let mut ticker = tokio::time::interval(sources.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        // A failed lookup keeps each name's last answer: setting the lists
        // anyway is harmless.
        resolver.refresh(&sources.verifiers).await;
        resolver.refresh(&sources.drafters).await;
        members.set(Role::Verifier, &resolver.members(&sources.verifiers));
        members.set(Role::Drafter, &resolver.members(&sources.drafters));
    }
}
