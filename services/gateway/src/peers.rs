//! Tenant limits across gateway replicas: each gateway asks the others
//! (`--peers`, the same `dns:///` resolution as `--verifiers`; in
//! Kubernetes the gateways' headless Service) what each tenant used there,
//! every `--peer-sync-ms`, and counts it against the tenant here.
//!
//! The choice: **shared counters, not a split budget.** Splitting a
//! tenant's limit N ways holds only when its requests spread evenly: a
//! client pinned to one gateway by its connection would get 1/N of what
//! it pays for. Here every gateway keeps the tenant's whole bucket and
//! charges it with the tokens the tenant used anywhere: its own as they
//! happen, the others' at each sync (a gateway reports the tokens it
//! charged since it started, only its own, never what it learnt, so
//! nothing is counted twice). Running requests are summed the same way:
//! a tenant at its concurrency limit across the gateways is refused on
//! each.
//!
//! The error bound: a gateway learns another's use one sync interval
//! (plus a call) late, so over any window a tenant can use at most its
//! limit plus what it uses on the other N−1 gateways in one interval
//! (at 500 ms and a tenant at its whole limit, 1/120 of a minute's tokens
//! per other gateway), and generated tokens are charged when a request
//! ends, as on one gateway; concurrent admissions within one interval can
//! exceed the concurrency limit by up to N−1. A gateway that does not
//! answer stops counting (its tenants' running requests drop out, its
//! use since its last answer is not charged) until it answers again; a
//! restarted one (a new `instance`) starts a new count.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use specmesh_proto::v1;
use specmesh_proto::v1::gateway_peers_client::GatewayPeersClient;
use specmesh_server::client::Dialer;
use specmesh_server::discovery::{MemberSource, Resolver};
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::quota::Quotas;

/// What the gateway learnt from each peer, by endpoint. Pure.
#[derive(Debug, Default)]
pub struct Ledger {
    peers: HashMap<String, Seen>,
}

#[derive(Debug)]
struct Seen {
    instance: u64,
    /// Per tenant: the peer's `tokens_total` at its last answer.
    totals: HashMap<String, u64>,
    /// Per tenant: requests running there at its last answer.
    running: HashMap<String, usize>,
}

/// Tokens a tenant used on a peer since its last answer, and the peer's
/// limit for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Used {
    pub tenant: String,
    pub tokens: u64,
    pub tokens_per_minute: Option<u64>,
}

impl Ledger {
    /// The answer of the peer at `endpoint`: what each tenant used there
    /// since its last one. A peer seen for the first time, or restarted (a
    /// new instance, or a total that went down), sets the count's start.
    pub fn observe(&mut self, endpoint: &str, report: &v1::UsageResponse) -> Vec<Used> {
        let running = report
            .tenants
            .iter()
            .filter(|t| t.running > 0)
            .map(|t| (t.tenant.clone(), t.running as usize))
            .collect();
        let totals: HashMap<String, u64> = report
            .tenants
            .iter()
            .map(|t| (t.tenant.clone(), t.tokens_total))
            .collect();
        let mut used = Vec::new();
        if let Some(seen) = self.peers.get(endpoint)
            && seen.instance == report.instance
        {
            for t in &report.tenants {
                let before = seen.totals.get(&t.tenant).copied().unwrap_or(0);
                // Below the last total: the count began again.
                let tokens = t.tokens_total.checked_sub(before).unwrap_or(t.tokens_total);
                if tokens > 0 {
                    used.push(Used {
                        tenant: t.tenant.clone(),
                        tokens,
                        tokens_per_minute: (t.tokens_per_minute > 0).then_some(t.tokens_per_minute),
                    });
                }
            }
        }
        self.peers.insert(
            endpoint.to_string(),
            Seen {
                instance: report.instance,
                totals,
                running,
            },
        );
        used
    }

    /// Stops counting the peer at `endpoint` (gone, or not answering).
    pub fn forget(&mut self, endpoint: &str) {
        self.peers.remove(endpoint);
    }

    /// Keeps only the peers in `endpoints`.
    pub fn retain(&mut self, endpoints: &[String]) {
        self.peers.retain(|e, _| endpoints.contains(e));
    }

    /// Requests each tenant runs on the peers, summed.
    pub fn remote_running(&self) -> HashMap<String, usize> {
        let mut sum = HashMap::new();
        for seen in self.peers.values() {
            for (tenant, n) in &seen.running {
                *sum.entry(tenant.clone()).or_insert(0) += n;
            }
        }
        sum
    }

    /// Peers counted now.
    pub fn len(&self) -> usize {
        self.peers.len()
    }
}

/// The `GatewayPeers` API: this gateway's own use.
#[derive(Debug, Clone)]
pub struct PeerService {
    quotas: Arc<Quotas>,
    instance: u64,
}

impl PeerService {
    pub fn new(quotas: Arc<Quotas>, instance: u64) -> PeerService {
        PeerService { quotas, instance }
    }
}

#[tonic::async_trait]
impl v1::gateway_peers_server::GatewayPeers for PeerService {
    async fn usage(
        &self,
        request: Request<v1::UsageRequest>,
    ) -> Result<Response<v1::UsageResponse>, Status> {
        debug!(
            from = request.get_ref().from_instance,
            "peer asked for usage"
        );
        let tenants = self
            .quotas
            .local_use()
            .into_iter()
            .map(|u| v1::TenantUsage {
                tenant: u.tenant,
                tokens_total: u.tokens_total,
                running: u.running,
                tokens_per_minute: u.tokens_per_minute.unwrap_or(0),
            })
            .collect();
        Ok(Response::new(v1::UsageResponse {
            instance: self.instance,
            tenants,
        }))
    }
}

/// How the gateway finds and asks its peers.
#[derive(Debug, Clone)]
pub struct Sync {
    pub peers: Vec<MemberSource>,
    pub interval: Duration,
    pub dialer: Dialer,
    /// The name peers' certificates carry (default: each endpoint's host).
    pub tls_name: Option<String>,
    /// This gateway's instance: an endpoint that answers with it is itself.
    pub instance: u64,
}

/// Asks every peer every interval and charges what they report; runs
/// until dropped. `synced` is set to the peers that answered last round.
pub async fn run(quotas: Arc<Quotas>, sync: Sync, synced: prometheus::IntGauge) {
    let mut resolver = Resolver::default();
    let mut ledger = Ledger::default();
    let mut clients: HashMap<String, GatewayPeersClient<tonic::transport::Channel>> =
        HashMap::new();
    let mut itself: HashSet<String> = HashSet::new();
    let mut failing: HashSet<String> = HashSet::new();
    let mut ticker = tokio::time::interval(sync.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let call_timeout = sync.interval.max(Duration::from_secs(1));
    loop {
        ticker.tick().await;
        resolver.refresh(&sync.peers).await;
        let endpoints = resolver.members(&sync.peers);
        ledger.retain(&endpoints);
        clients.retain(|e, _| endpoints.contains(e));
        for endpoint in &endpoints {
            if itself.contains(endpoint) {
                continue;
            }
            let client = match clients.get(endpoint) {
                Some(c) => c.clone(),
                None => match sync.dialer.channel(endpoint, sync.tls_name.as_deref()) {
                    Ok(channel) => {
                        let c = GatewayPeersClient::new(channel);
                        clients.insert(endpoint.clone(), c.clone());
                        c
                    }
                    Err(e) => {
                        warn!(error = %e, "a peer gateway's endpoint does not parse");
                        continue;
                    }
                },
            };
            let ask = v1::UsageRequest {
                from_instance: sync.instance,
            };
            let answer = tokio::time::timeout(call_timeout, client.clone().usage(ask)).await;
            match answer {
                Ok(Ok(report)) => {
                    let report = report.into_inner();
                    if report.instance == sync.instance {
                        info!(%endpoint, "this gateway is among its peers: not asking itself");
                        itself.insert(endpoint.clone());
                        continue;
                    }
                    if failing.remove(endpoint) {
                        info!(%endpoint, "peer gateway answers again");
                    }
                    let now = Instant::now();
                    for used in ledger.observe(endpoint, &report) {
                        quotas.charge_remote(
                            &used.tenant,
                            used.tokens,
                            used.tokens_per_minute,
                            now,
                        );
                    }
                }
                failed => {
                    let why = match failed {
                        Ok(Err(status)) => format!("{}: {}", status.code(), status.message()),
                        _ => format!("no answer within {call_timeout:?}"),
                    };
                    if failing.insert(endpoint.clone()) {
                        warn!(%endpoint, error = %why, "peer gateway does not answer: its tenants' use is not counted here until it does");
                    }
                    ledger.forget(endpoint);
                }
            }
        }
        quotas.set_remote_running(ledger.remote_running());
        synced.set(ledger.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(instance: u64, tenants: &[(&str, u64, u32)]) -> v1::UsageResponse {
        v1::UsageResponse {
            instance,
            tenants: tenants
                .iter()
                .map(|&(t, total, running)| v1::TenantUsage {
                    tenant: t.into(),
                    tokens_total: total,
                    running,
                    tokens_per_minute: 600,
                })
                .collect(),
        }
    }

    #[test]
    fn a_peer_is_charged_what_it_used_since_its_last_answer() {
        let mut l = Ledger::default();
        // The first answer sets the start: nothing charged.
        assert!(l.observe("p", &report(1, &[("a", 500, 1)])).is_empty());
        assert_eq!(l.remote_running(), HashMap::from([("a".into(), 1)]));
        let used = l.observe("p", &report(1, &[("a", 650, 0), ("b", 20, 2)]));
        assert_eq!(
            used,
            vec![
                Used {
                    tenant: "a".into(),
                    tokens: 150,
                    tokens_per_minute: Some(600)
                },
                Used {
                    tenant: "b".into(),
                    tokens: 20,
                    tokens_per_minute: Some(600)
                }
            ]
        );
        assert_eq!(l.remote_running(), HashMap::from([("b".into(), 2)]));
        // Restarted: a new instance starts a new count.
        assert!(l.observe("p", &report(2, &[("a", 30, 0)])).is_empty());
        assert_eq!(l.observe("p", &report(2, &[("a", 40, 0)]))[0].tokens, 10);
    }

    #[test]
    fn running_requests_add_up_over_peers_and_leave_with_them() {
        let mut l = Ledger::default();
        l.observe("p", &report(1, &[("a", 0, 2)]));
        l.observe("q", &report(7, &[("a", 0, 3), ("b", 0, 1)]));
        assert_eq!(l.remote_running()["a"], 5);
        l.forget("q");
        assert_eq!(l.remote_running()["a"], 2);
        assert!(!l.remote_running().contains_key("b"));
        l.retain(&[]);
        assert_eq!(l.len(), 0);
    }
}
