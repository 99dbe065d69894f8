//! Lossless verification of token trees against the target model's logits.
//!
//! A drafter proposes a [`TokenTree`](specmesh_tree::TokenTree); the target
//! computes one logits row per node in a single forward; [`verify`] walks
//! the tree from the root, deciding at each node the token the target emits
//! at that output position, and keeps drafted tokens only while they agree.
//! The walk always ends with a *bonus* token of the target's own, so every
//! verification commits at least one token.
//!
//! Three rules decide a node's token, all lossless (the committed tokens
//! follow the target's distribution exactly, whatever was drafted):
//!
//! 1. greedy: the argmax — identical to plain greedy decoding;
//! 2. sampling without draft probabilities: plain sampling's own draw for
//!    that output position — identical tokens to plain seeded sampling;
//! 3. sampling with the draft distribution the children were drawn from:
//!    recursive rejection sampling without replacement (Jeon et al. 2024,
//!    arXiv 2402.14160), which accepts a first candidate with probability
//!    `Σ min(p, q)` (see `rrs.rs` for the rule, its references and its edge
//!    cases).
//!
//! The uniforms of output position `t` are
//! [`uniform_at`](specmesh_sampling::uniform_at)`(seed, t, ·)`: draw 0 for
//! rules 1–2 (it is plain sampling's), draws 1.. for rule 3. A drafter must
//! not derive its candidates from draws 1.. of the same seed, or rule 3's
//! accept tests would not be independent of the candidates.
//!
//! Under a constraint on the output (a grammar, see [`Constraint`]) every
//! decision is the masked, renormalised distribution's, drafted nodes the
//! constraint forbids are cut before the forward, and what it forces is
//! grafted as nodes ([`constrain`]).
//!
//! For each node of the accepted path the verifier also returns the target's
//! top-k tokens with log-probabilities (raw logits at temperature 1), the
//! input of token recycling (Luo et al. 2024, arXiv 2408.08696).

#![forbid(unsafe_code)]

mod constraint;
mod error;
mod min_tokens;
mod rows;
mod rrs;
mod topk;
mod verify;

pub use constraint::{Constrained, Constraint, ConstraintError, Rejection, constrain};
pub use error::VerifyError;
pub use min_tokens::MinTokens;
pub use rows::{LogitRows, RowMajor};
pub use topk::TokenLogprobs;
pub use verify::{Extras, Verification, verify, verify_with};
