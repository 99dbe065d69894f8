//! Member health: the gateway watches every verifier and
//! drafter over `grpc.health.v1.Health/Watch` (the whole server's status,
//! service `""`) and keeps each member's `healthy` flag, which placement
//! reads ([`crate::placement`]).
//!
//! | what the member does                          | flag  |
//! |-----------------------------------------------|-------|
//! | reports SERVING                               | up    |
//! | reports anything else (NOT_SERVING: draining) | down  |
//! | cannot be reached, or the watch breaks        | down, retried with backoff |
//! | has no health service (UNIMPLEMENTED)         | up: nothing to watch |
//!
//! A draining member (SIGTERM) reports NOT_SERVING before its running
//! sessions end, so new sessions go elsewhere at once; a restarted one is
//! placed on again as soon as its watch reports SERVING. Members start up:
//! a gateway that has not heard from them yet still places on them, and a
//! request that finds one down is re-placed as before.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use specmesh_server::backoff::Backoff;

use crate::placement::Member;

/// First wait before watching a member again after a failure; doubles up
/// to [`RETRY_MAX`] (each with jitter: [`Backoff`]), and starts over once
/// the member answers.
const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(4);

/// What a member is, for logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Verifier,
    Drafter,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Verifier => "verifier",
            Role::Drafter => "drafter",
        }
    }
}

/// The running watches of each member (its health, and a verifier's KV
/// events); dropping it stops them.
#[derive(Debug, Default)]
pub struct Watches(HashMap<(Role, String), Vec<JoinHandle<()>>>);

impl Watches {
    /// Starts watching `member` over `channel` (on the current runtime).
    pub fn add(&mut self, role: Role, member: Member, channel: Channel) {
        let key = (role, member.endpoint.clone());
        let task = tokio::spawn(watch(role, member, channel));
        if let Some(old) = self.0.insert(key, vec![task]) {
            old.iter().for_each(JoinHandle::abort);
        }
    }

    /// Adds `task` to the member's watches (stopped with them).
    pub fn also(&mut self, role: Role, endpoint: &str, task: JoinHandle<()>) {
        self.0
            .entry((role, endpoint.to_owned()))
            .or_default()
            .push(task);
    }

    /// Stops watching the member at `endpoint` (it left the list).
    pub fn remove(&mut self, role: Role, endpoint: &str) {
        if let Some(tasks) = self.0.remove(&(role, endpoint.to_owned())) {
            tasks.iter().for_each(JoinHandle::abort);
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for task in self.0.values().flatten() {
            task.abort();
        }
    }
}

/// Watches one member for as long as the gateway runs.
async fn watch(role: Role, member: Member, channel: Channel) {
    let mut client = HealthClient::new(channel);
    let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        match client.watch(request).await {
            Ok(response) => {
                let mut updates = response.into_inner();
                // Each update is the member's status now; the stream ends
                // or breaks only when the member goes away.
                while let Ok(Some(update)) = updates.message().await {
                    let up = update.status() == ServingStatus::Serving;
                    if up {
                        capabilities(&mut client, &member).await;
                    }
                    set(role, &member, up);
                    retry.reset();
                }
                set(role, &member, false);
            }
            Err(status) if status.code() == Code::Unimplemented => {
                tracing::warn!(
                    role = role.name(),
                    endpoint = %member.endpoint,
                    "the member serves no grpc.health.v1: placing on it unwatched"
                );
                set(role, &member, true);
                return;
            }
            Err(_) => set(role, &member, false),
        }
        tokio::time::sleep(retry.next_wait()).await;
    }
}

/// Asks the member which capabilities it serves (each a health service of
/// its own name, see [`specmesh_server::capability`]); an older member
/// answers NOT_FOUND, and is not placed on for them.
async fn capabilities(client: &mut HealthClient<Channel>, member: &Member) {
    let request = || HealthCheckRequest {
        service: specmesh_server::capability::STRUCTURED.to_owned(),
    };
    let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
    let mut serves = false;
    // NOT_FOUND is an answer (an older member); a failed call is asked
    // again a few times before the member counts as not serving.
    for _ in 0..4 {
        match client.check(request()).await {
            Ok(r) => {
                serves = r.into_inner().status() == ServingStatus::Serving;
                break;
            }
            Err(s) if s.code() == Code::NotFound || s.code() == Code::Unimplemented => break,
            Err(_) => tokio::time::sleep(retry.next_wait()).await,
        }
    }
    let was = member
        .structured
        .swap(serves, std::sync::atomic::Ordering::Relaxed);
    if was != serves {
        tracing::info!(endpoint = %member.endpoint, serves, "structured outputs capability");
    }
}

/// Records the member's state, logging changes.
fn set(role: Role, member: &Member, up: bool) {
    if !member.set_healthy(up) {
        return;
    }
    if up {
        tracing::info!(role = role.name(), endpoint = %member.endpoint, "member up: placing on it again");
    } else {
        tracing::warn!(role = role.name(), endpoint = %member.endpoint, "member down: not placing on it");
    }
}
