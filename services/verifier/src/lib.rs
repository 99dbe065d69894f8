//! The specmesh verifier: holds the target model and the KV caches of its
//! sessions. The gateway runs sessions on it (`Verifier.Run`); for each, the
//! verifier pulls draft trees straight from the drafter the gateway placed,
//! verifies the trees of concurrent sessions in batched forwards, and
//! streams committed tokens back.
//!
//! ```text
//!   gateway ──Run──▶ verifier ──Draft (bidi)──▶ drafter
//!          ◀─commits─         ◀──── trees ─────
//! ```

#![forbid(unsafe_code)]

mod allowed_drafters;
mod batch_metrics;
mod batcher;
pub mod calibrate;
pub mod config;
mod draft_link;
mod drafting;
mod error;
mod goodput;
mod memory;
mod metrics;
mod outcome;
mod reattach;
mod server;
mod service;
mod state;
mod step;
mod stream;
mod validate;

pub use config::{Args, Config, ConfigError, SERVICE};
pub use error::VerifierError;
pub use server::Verifier;
