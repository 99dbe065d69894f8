//! The target side of speculative decoding, free of I/O: a [`Session`]
//! holds one generation's KV cache and committed tokens; [`step_batch`]
//! verifies one token tree per session in a single batched forward and
//! commits each accepted path (with [`step_batch_fused`], next to a chunk
//! of another session's prefill); [`generate`] is the whole loop in-process
//! (the reference the distributed loop is measured against); [`plain`] is
//! plain decoding, one forward per token, the reference every speculative
//! path must reproduce.
//!
//! The invariant every step keeps: the KV cache holds all committed tokens
//! but the last, which is the root of the next tree. The first tree's root
//! is the last prompt token, so the very first step can already speculate.

#![forbid(unsafe_code)]

mod batch;
mod generate;
pub mod plain;
mod session;

pub use batch::{
    BatchTimes, FusedStep, PrefillChunk, step_batch, step_batch_fused, step_batch_timed,
};
pub use generate::{Generation, Stats, generate};
pub use session::{Finish, Session, SessionLimits, Step};

/// What can go wrong in a step; all of it is a bug or bad input upstream.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] specmesh_model::ModelError),
    #[error(transparent)]
    Block(#[from] specmesh_model::BlockError),
    #[error(transparent)]
    Verify(#[from] specmesh_verify::VerifyError),
    #[error("the tree's root is token {tree} but the session's last token is {session}")]
    RootMismatch { tree: u32, session: u32 },
    #[error("the session has already finished")]
    Finished,
    #[error("the context needs at least one token")]
    EmptyContext,
    #[error(
        "context of {tokens} tokens plus a tree of {tree} exceeds the model's context of {max}"
    )]
    ContextFull {
        tokens: usize,
        tree: usize,
        max: usize,
    },
}
