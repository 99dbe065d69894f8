//! A drafter backed by a small language model: any GGUF (sharing the
//! target's vocabulary, or drafting through text when it does not), or
//! the target's own first layers ([`specmesh_model::Model::truncated`], a
//! self-draft).
//!
//! [`ModelDrafter`] grows its tree one depth per draft forward, spending the
//! node budget best-first by path probability. Greedy requests get the
//! draft's top tokens; sampled requests get children drawn without
//! replacement from the draft's processed distribution, which travels with
//! the tree (`DraftDist`) so the verifier can accept losslessly.
//!
//! [`check_vocab`] tells whether a draft model's tokenizer is the
//! target's; when it is not, [`CrossVocabDrafter`] drafts through text
//! ([`TextBridge`]), and trees still arrive in the target's vocabulary.
//!
//! A draft model may score only its most frequent tokens ([`TokenRanking`],
//! FR-Spec): the candidates, and a sampled node's q, are then over those.

#![forbid(unsafe_code)]

mod alloc;
mod cross;
mod dist;
mod drafter;
mod error;
mod ranking;
mod vocab;

pub use cross::{BridgeError, CrossVocabDrafter, EXTRA_LEVELS, TextBridge, TextMap};
pub use drafter::{Cancel, DraftOptions, DrafterStats, ModelDrafter};
pub use error::DraftModelError;
pub use ranking::{RankingError, TokenRanking};
pub use vocab::{VocabMismatch, check_pieces, check_vocab};
