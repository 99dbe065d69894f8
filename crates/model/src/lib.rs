//! The model runtime of specmesh: a Llama-family transformer forward written
//! for speculative decoding.
//!
//! What differs from a plain inference forward (candle's `quantized_llama`):
//!
//! * A forward appends a [`Block`] of new tokens with explicit positions and
//!   an explicit attention structure: each new token sees the committed prefix
//!   plus its ancestors inside the block (a token tree; a chain is the special
//!   case). Logits come back for **every** new token.
//! * New tokens are *staged* in the sequence's KV cache until
//!   [`Sequence::commit`] keeps an accepted root-to-node path (scattered inside
//!   the block) and drops the rest; [`Sequence::truncate`] rolls back.
//! * Several sequences of different lengths go through one batched forward
//!   ([`Model::forward_batch`]): weights are read once for all of them.
//! * Every op is batch-invariant: a token's logits are bit-identical whatever
//!   else shares its forward, which is what makes greedy speculative decoding
//!   bit-exact against plain decoding.
//!
//! Weights are immutable and shared (`Arc`); per-sequence state is a separate
//! [`Sequence`] value. [`Model::truncated`] is a layer-truncated view over the
//! same weights, a cheap self-draft model.

mod attention;
mod block;
mod config;
pub mod cost;
mod error;
mod forward;
mod kv;
mod load;
mod logits;
mod model;
pub mod process;
mod rope;
mod sequence;
mod weights;

pub use block::{Block, BlockError};
pub use config::{Architecture, LlamaConfig, RopeStyle};
pub use error::ModelError;
pub use kv::{KvDtype, UnknownKvDtype};
pub use load::{LoadOptions, ModelFormat, Progress};
pub use logits::{Logits, TopToken};
pub use model::Model;
pub use sequence::Sequence;
pub use specmesh_kernels::Isa;
pub use specmesh_kernels::attn::AttnKernel;
