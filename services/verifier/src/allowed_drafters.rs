//! The drafters this verifier may dial: its own `--drafters` (static
//! entries and `dns:///` names, resolved as the gateway resolves its own,
//! so both see the same member identities). A run's draft plan may name
//! only these; the verifier never dials an address because a request
//! named it, so a caller that reaches the verifier cannot make it stream
//! prompts and committed tokens to a host of its choosing.
//!
//! DNS names are resolved every `--resolve-interval-ms`; a plan naming an
//! endpoint not in the set resolves them again at once (at most once per
//! [`ON_DEMAND_EVERY`], so refused requests cannot flood the DNS server),
//! because the gateway may have seen a new drafter pod first.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use specmesh_server::discovery::{self, MemberSource, Resolver};

use crate::error::VerifierError;
use crate::validate::DraftPlan;

/// The shortest time between two lookups caused by unknown endpoints.
pub const ON_DEMAND_EVERY: Duration = Duration::from_secs(1);

/// The configured drafter entries and the members they stand for now.
#[derive(Debug)]
pub struct Drafters {
    sources: Vec<MemberSource>,
    members: RwLock<Arc<[String]>>,
    /// One lookup at a time.
    resolver: tokio::sync::Mutex<Lookups>,
}

#[derive(Debug, Default)]
struct Lookups {
    resolver: Resolver,
    /// When the last lookup finished.
    last_done: Option<Instant>,
    /// When the last lookup for an unknown endpoint started.
    last_on_demand: Option<Instant>,
}

impl Drafters {
    /// The static entries are members at once; DNS names after the first
    /// [`Drafters::refresh`].
    pub fn new(sources: Vec<MemberSource>) -> Drafters {
        let lookups = Lookups::default();
        let members = lookups.resolver.members(&sources).into();
        Drafters {
            sources,
            members: RwLock::new(members),
            resolver: tokio::sync::Mutex::new(lookups),
        }
    }

    /// Whether any entry is a DNS name (else the set never changes).
    pub fn is_dynamic(&self) -> bool {
        discovery::is_dynamic(&self.sources)
    }

    /// The members now.
    pub fn members(&self) -> Arc<[String]> {
        Arc::clone(&self.members.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Resolves the DNS names again and publishes the members.
    pub async fn refresh(&self) {
        let mut guard = self.resolver.lock().await;
        self.resolve(&mut guard).await;
    }

    /// [`Drafters::refresh`] for a plan naming an unknown endpoint: skipped
    /// when a lookup finished after `asked` (its answer is as new as ours
    /// would be) or when the last such lookup is under [`ON_DEMAND_EVERY`]
    /// old (refused requests must not flood the DNS server).
    async fn refresh_on_demand(&self, asked: Instant) {
        let mut guard = self.resolver.lock().await;
        let fresh = guard.last_done.is_some_and(|t| t > asked);
        let limited = guard
            .last_on_demand
            .is_some_and(|t| t.elapsed() < ON_DEMAND_EVERY);
        if !fresh && !limited {
            guard.last_on_demand = Some(Instant::now());
            self.resolve(&mut guard).await;
        }
    }

    async fn resolve(&self, lookups: &mut Lookups) {
        if !lookups.resolver.refresh(&self.sources).await {
            return;
        }
        lookups.last_done = Some(Instant::now());
        let members: Arc<[String]> = lookups.resolver.members(&self.sources).into();
        *self.members.write().unwrap_or_else(|p| p.into_inner()) = members;
    }

    /// Refuses a plan naming any endpoint (its drafter or a fallback)
    /// outside the set, after resolving the names again if one is unknown.
    pub async fn check(&self, plan: &DraftPlan) -> Result<(), VerifierError> {
        let asked = Instant::now();
        let named = || std::iter::once(&plan.endpoint).chain(&plan.fallbacks);
        let unknown = |members: &[String]| named().find(|e| !members.contains(e)).cloned();
        if unknown(&self.members()).is_none() {
            return Ok(());
        }
        if self.is_dynamic() {
            self.refresh_on_demand(asked).await;
        }
        match unknown(&self.members()) {
            None => Ok(()),
            Some(endpoint) => Err(VerifierError::UnknownDrafter {
                endpoint,
                configured: self
                    .sources
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            }),
        }
    }
}

/// Resolves `drafters`' names every `interval`; runs until dropped.
pub async fn resolve_every(drafters: Arc<Drafters>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        drafters.refresh().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specmesh_server::discovery::parse_sources;

    use crate::validate::test_plan as plan;

    fn drafters(raw: &str) -> Drafters {
        let raw: Vec<String> = raw.split(',').map(str::to_owned).collect();
        Drafters::new(parse_sources("drafters", &raw).unwrap())
    }

    #[tokio::test]
    async fn only_configured_drafters_may_be_named() {
        let d = drafters("http://d-0:50061,http://d-1:50061");
        assert!(!d.is_dynamic());
        d.check(&plan("http://d-0:50061", &["http://d-1:50061"]))
            .await
            .unwrap();
        let err = d
            .check(&plan("http://d-0:50061", &["http://attacker:80"]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.to_string(),
            "draft endpoint `http://attacker:80` is not one of this verifier's drafters \
             (`--drafters` http://d-0:50061,http://d-1:50061): the gateway's and the \
             verifiers' drafter lists must name the same members"
        );
        let none = drafters("");
        assert!(none.members().is_empty());
        // A DNS name is no member until it resolves.
        let dns = drafters("dns:///specmesh-drafter:50061,http://d-0:50061");
        assert!(dns.is_dynamic());
        assert_eq!(&*dns.members(), ["http://d-0:50061"]);
        assert!(none.check(&plan("http://d-0:50061", &[])).await.is_err());
    }
}
