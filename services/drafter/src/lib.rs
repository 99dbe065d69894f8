//! The specmesh drafter service: proposes token trees for the sessions of
//! the verifiers that call it.
//!
//! A verifier opens one `Drafter.Draft` stream per session, sends the
//! session's context (`DraftStart`) and then the outcome of every verify
//! step; the drafter answers each with the tree for the next step (a run of
//! steps it will not speculate at gets one empty tree and one outcome: see
//! the `session` module). Drafting
//! is model-free by default (prompt lookup, suffix decoding over the
//! session and its tenant's earlier outputs, token recycling), so drafter
//! pods need no accelerator and scale apart from verifiers; a small draft
//! model can be added with `--draft-model`.
//!
//! The process is the service kit's (`specmesh_server::main::<Drafter>()`);
//! embedders `specmesh_server::start::<Drafter>(config)`, which exposes the
//! bound address and the [`Stats`] before serving.

#![forbid(unsafe_code)]

mod config;
mod drafters;
mod error;
mod learned;
mod metrics;
mod model;
mod prefix;
mod server;
mod service;
mod session;
mod state;
mod stats;
mod stream;
mod validate;

pub use config::{Args, Config, ConfigError, DEFAULT_LISTEN, DraftModelConfig, SERVICE};
pub use error::DrafterError;
pub use model::DraftModelError;
pub use server::{CLOSE_TIMEOUT, Drafter};
pub use specmesh_proto::limits::{MAX_DEPTH, MAX_DRAFT_TOKENS};
pub use stats::{Stats, StatsSnapshot};
pub use validate::ANONYMOUS_TENANT;
