//! A prefix cache ([`specmesh_kvcache::Store`]) shared by a server's
//! sessions ([`SharedStore`]), and what it holds published as
//! `specmesh.v1.KvEvents` ([`KvEventsService`]) for the gateways'
//! prefix-aware placement. Verifiers publish their target KV, drafters
//! their draft model's: one protocol, one index per role in the gateway.

mod service;
mod shared;

pub use service::{KvEventsService, RunningCount};
pub use shared::{Events, Locked, SharedStore};
