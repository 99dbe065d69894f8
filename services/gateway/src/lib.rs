//! The specmesh gateway: the public `specmesh.v1.Generation` API in front of
//! the verifiers (which hold the target model) and the drafters.
//!
//! A request flows through one module per stage:
//!
//! ```text
//! service ──► validate ────► placement ──► decode ──► output ──► caller
//! (admit,      (Valid*       (verifier,    (Verifier.Run,  (detokenize,
//!  deadline)    types)        drafter,      recovery)       stop strings)
//!                             epoch)
//! ```
//!
//! Beside the request path, `members` keeps the verifiers and drafters
//! placement chooses from (`health` watches each one, `resolve` re-resolves
//! `dns:///` entries).
//!
//! `main.rs` hands the process to the service kit: `specmesh_server::main::<Gateway>()`.

#![forbid(unsafe_code)]

pub mod auth;
mod config;
mod error;
mod health;
pub mod http;
mod kv_index;
mod kv_watch;
mod members;
mod metrics;
mod model;
mod output;
mod peers;
mod placement;
mod quota;
mod resolve;
mod server;
mod service;
mod spec_stats;
mod state;
mod stop;
mod stream;
mod validate;

#[cfg(test)]
mod testing;

pub use config::{Args, Config, ConfigError, DEFAULT_MAX_NEW_TOKENS, SERVICE};
pub use error::GatewayError;
pub use model::{ModelMeta, ModelMetaError};
pub use server::Gateway;
pub use service::GenerationService;
pub use validate::{Limits, ValidationError};
