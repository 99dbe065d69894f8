//! The gateway's members as they are now: the verifiers and drafters
//! placement chooses from ([`Placer`]), a client per verifier, and a health
//! watch per member ([`crate::health`]).
//!
//! The lists change while the gateway runs ([`Members::set`], called by the
//! DNS re-resolution in [`crate::resolve`]): a new member gets a lazily
//! connected channel and a watch and is placed on at once; one that leaves
//! gets no new requests, its watch stops, and the requests it runs go on
//! over the channel they hold (a pod removed from a headless Service is
//! usually draining: its sessions finish, or migrate if it goes away).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use specmesh_proto::v1::verifier_client::VerifierClient;
use specmesh_server::Dialer;
use specmesh_server::client::BadEndpoint;
use tonic::transport::Channel;
use tracing::{info, warn};

use crate::health::{Role, Watches};
use crate::placement::Placer;

/// How the gateway talks to its members.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub dialer: Dialer,
    pub max_message_bytes: usize,
    /// Over TLS: the names verifiers' and drafters' certificates carry;
    /// `None`: each endpoint's host.
    pub verifier_tls_name: Option<String>,
    pub drafter_tls_name: Option<String>,
}

impl ClientSettings {
    /// Plaintext, for tests.
    #[cfg(test)]
    pub fn plaintext(
        connect_timeout: std::time::Duration,
        max_message_bytes: usize,
    ) -> ClientSettings {
        ClientSettings {
            dialer: Dialer {
                security: specmesh_server::Security::Plaintext,
                connect_timeout,
            },
            max_message_bytes,
            verifier_tls_name: None,
            drafter_tls_name: None,
        }
    }

    fn tls_name(&self, role: Role) -> Option<&str> {
        match role {
            Role::Verifier => self.verifier_tls_name.as_deref(),
            Role::Drafter => self.drafter_tls_name.as_deref(),
        }
    }
}

/// The members now; shared by every request and the re-resolution task.
#[derive(Debug)]
pub struct Members {
    placer: Placer,
    settings: ClientSettings,
    /// Everything a change touches, changed under one lock so a member is
    /// never in the placer without its client and watch.
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// A client per verifier, by endpoint.
    clients: HashMap<String, VerifierClient<Channel>>,
    watches: Watches,
}

/// How many members of each role are up and down, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    pub verifiers_up: usize,
    pub verifiers_down: usize,
    pub drafters_up: usize,
    pub drafters_down: usize,
}

impl Members {
    /// No members yet: [`Members::set`] adds them.
    pub fn new(settings: ClientSettings) -> Members {
        Members {
            placer: Placer::new(Vec::new(), Vec::new()),
            settings,
            inner: Mutex::default(),
        }
    }

    pub fn placer(&self) -> &Placer {
        &self.placer
    }

    /// The client of the verifier at `endpoint`; `None` once it has left.
    pub fn client(&self, endpoint: &str) -> Option<VerifierClient<Channel>> {
        self.lock().clients.get(endpoint).cloned()
    }

    /// Makes `endpoints` the members of `role`, in that order (see
    /// [`Placer::set_verifiers`]), and logs what changed. Watching needs a
    /// runtime: outside one (never the server's case) members are placed on
    /// unwatched. Returns the endpoints that cannot be dialed (left out).
    pub fn set(&self, role: Role, endpoints: &[String]) -> Vec<BadEndpoint> {
        let mut refused = Vec::new();
        let mut inner = self.lock();
        // Channels first: an endpoint that cannot make one (never a valid
        // flag entry nor a resolved address) stays out.
        let mut channels = HashMap::new();
        let current = match role {
            Role::Verifier => self.placer.verifiers(),
            Role::Drafter => self.placer.drafters(),
        };
        let mut kept = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            if current.iter().any(|m| &m.endpoint == endpoint) {
                kept.push(endpoint.clone());
                continue;
            }
            match self
                .settings
                .dialer
                .channel(endpoint, self.settings.tls_name(role))
            {
                Ok(channel) => {
                    channels.insert(endpoint.clone(), channel);
                    kept.push(endpoint.clone());
                }
                Err(e) => {
                    warn!(role = role.name(), endpoint = %e.endpoint, reason = %e.reason, "cannot use member");
                    refused.push(e);
                }
            }
        }
        if role == Role::Verifier {
            for (endpoint, channel) in &channels {
                let client = VerifierClient::new(channel.clone())
                    .max_decoding_message_size(self.settings.max_message_bytes)
                    .max_encoding_message_size(self.settings.max_message_bytes);
                inner.clients.insert(endpoint.clone(), client);
            }
        }
        let change = match role {
            Role::Verifier => self.placer.set_verifiers(&kept),
            Role::Drafter => self.placer.set_drafters(&kept),
        };
        let watch = tokio::runtime::Handle::try_current().is_ok();
        for member in change.added {
            info!(role = role.name(), endpoint = %member.endpoint, "member joined");
            if let Some(channel) = channels.remove(&member.endpoint)
                && watch
            {
                let task = tokio::spawn(crate::kv_watch::watch(
                    role,
                    member.endpoint.clone(),
                    channel.clone(),
                    self.kv_index(role),
                ));
                inner.watches.add(role, member.clone(), channel);
                inner.watches.also(role, &member.endpoint, task);
            }
        }
        for member in change.removed {
            info!(role = role.name(), endpoint = %member.endpoint, "member left: no new requests go to it");
            inner.watches.remove(role, &member.endpoint);
            self.kv_index(role).forget(&member.endpoint);
            if role == Role::Verifier {
                inner.clients.remove(&member.endpoint);
            }
        }
        refused
    }

    /// The KV index of `role`'s members.
    fn kv_index(&self, role: Role) -> std::sync::Arc<crate::kv_index::KvIndex> {
        match role {
            Role::Verifier => self.placer.kv_index(),
            Role::Drafter => self.placer.drafter_kv_index(),
        }
    }

    /// Members up and down now.
    pub fn census(&self) -> Census {
        let count = |members: Vec<crate::placement::Member>| {
            let up = members.iter().filter(|m| m.is_healthy()).count();
            (up, members.len() - up)
        };
        let (verifiers_up, verifiers_down) = count(self.placer.verifiers());
        let (drafters_up, drafters_down) = count(self.placer.drafters());
        Census {
            verifiers_up,
            verifiers_down,
            drafters_up,
            drafters_down,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Members {
        Members::new(ClientSettings::plaintext(
            std::time::Duration::from_secs(1),
            1 << 20,
        ))
    }

    #[tokio::test]
    async fn a_member_has_a_client_exactly_while_it_is_in_the_list() {
        let m = members();
        let a = "http://127.0.0.1:1".to_owned();
        let b = "http://127.0.0.2:1".to_owned();
        m.set(Role::Verifier, &[a.clone(), b.clone()]);
        assert!(m.client(&a).is_some() && m.client(&b).is_some());
        let state = m.placer().verifiers()[1].clone();
        m.set(Role::Verifier, std::slice::from_ref(&b));
        assert!(m.client(&a).is_none());
        assert!(m.client(&b).is_some());
        // `b` stayed: the same member, not a new one.
        assert!(std::sync::Arc::ptr_eq(
            &state.healthy,
            &m.placer().verifiers()[0].healthy
        ));
        m.set(Role::Drafter, std::slice::from_ref(&a));
        assert!(m.client(&a).is_none(), "drafters have no verifier client");
        assert_eq!(m.census().drafters_up + m.census().drafters_down, 1);
        m.set(Role::Verifier, &[]);
        assert_eq!(m.census().verifiers_up + m.census().verifiers_down, 0);
    }
}
