//! Automatic prefix caching for the KV caches of a model server.
//!
//! A sequence's committed KV is cut into blocks of [`BLOCK_TOKENS`] tokens.
//! Each block is named by a chained hash ([`hash`]): the hash of its
//! parent block and its own tokens, seeded by the [`Scope`] (tenant, the
//! caller's `cache_salt`). A request finds the longest run of its prompt's
//! blocks the [`Store`] holds and copies their KV instead of computing it.
//!
//! Why chained block hashes and not a radix tree: a block hash names a
//! whole prefix in 8 bytes, so the same ids can be published to other
//! processes (a gateway's index of which verifier holds what) and compared
//! there without the tokens; the tree structure the store needs (which
//! blocks are leaves, for eviction) is a parent link and a child count.
//! This is vLLM's automatic prefix caching and Dynamo's KV events.
//!
//! Why copy on hit and not paged attention sharing blocks by reference:
//! the model's KV is one contiguous buffer per layer per sequence, which
//! its attention kernels read by slot; a hit copies the blocks' KV into
//! the new sequence (about 57 KB per token on a 1.5B model, tens of
//! milliseconds for thousands of tokens, against seconds of prefill).
//! The price is that a hit is held twice while its session runs (in the
//! store and in the session's own reservation).

mod hash;
mod store;

pub use hash::{BlockHash, Scope, block_hashes, extend_block_hashes};
pub use store::{BlockEvent, Exhausted, KvBlock, Store, StoreUsage};

/// Tokens per block: a hit reuses whole blocks only, so at most this many
/// minus one tokens of a cached prefix are computed again. 16 is vLLM's
/// default; smaller blocks cost more hashes and bookkeeping per token.
pub const BLOCK_TOKENS: usize = 16;
