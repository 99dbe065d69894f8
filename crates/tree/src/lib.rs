//! Token trees: what a drafter proposes and a verifier checks in one forward.
//!
//! Node 0 is the root: the last committed token, whose KV the target has not
//! computed yet. Every other node is a drafted token whose parent comes
//! before it, so the node order is topological and a cycle cannot be
//! written down. The target's logits at node `i` are its distribution for
//! the token that follows the path root → `i`.
//!
//! ```text
//!   node   0:"The"   1:"cat"  2:"dog"  3:"sat"  4:"ran"
//!   parent    -        0        0        1        1
//!   depth     0        1        1        2        2
//! ```
//!
//! A [`TokenTree`] can only be made by a [`TreeBuilder`] (which enforces the
//! [`TreeLimits`] as nodes are added and collapses duplicate siblings), by
//! [`TokenTree::from_untrusted`] (which validates what arrives over the
//! wire), or by [`merge`]. Whatever holds one may rely on:
//! parents before children, depth and node budgets respected, no two
//! siblings with the same token, every token below the vocabulary size, and
//! scores in `[0, 1]` that never grow along a path.

#![forbid(unsafe_code)]

mod builder;
mod error;
mod merge;
mod prune;
mod sources;
mod subtree;
mod tree;

pub use builder::TreeBuilder;
pub use error::TreeError;
pub use merge::merge;
pub use sources::Sources;
pub use tree::{DraftDist, TokenTree, TreeLimits};
