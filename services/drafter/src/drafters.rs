//! What each session drafts with: the process-wide pieces (the global
//! suffix index, the optional draft model) and the per-session [`Merged`]
//! drafter built from them.
//!
//! Every session gets prompt lookup, suffix decoding (its own text plus its
//! tenant's shard of the global index) and token recycling; they are
//! complementary (quoting the prompt, repeating earlier sessions, the
//! target's own recent preferences) and cost microseconds. With a draft
//! model configured, a session that gets a model slot adds a
//! [`ModelDrafter`]; the merge keeps the best-scored nodes of all of them.
//!
//! The model drafter drafts with the request's sampling parameters
//! (`DraftStart.sampling`): greedy requests get the draft's most likely
//! children, sampled ones children drawn from the draft's processed
//! distribution q, sent with the tree so the verifier accepts by recursive
//! rejection sampling (lossless for any q). Where the merge mixes model and
//! model-free candidates under one node the distributions are dropped and
//! the verifier's probability-free rule applies, lossless too.
//!
//! A session's output joins the global index when its stream ends (see
//! [`DrafterSet::index_output`]): written from the drafter's own context,
//! which also holds the tokens committed on steps where the verifier did
//! not use our tree, rather than through [`SuffixDrafter::finish`], which
//! only sees what its `observe` and `propose` calls showed it.

use std::fmt;

use specmesh_draft::{
    Drafter, GlobalConfig, GlobalSuffixIndex, Merged, PromptLookup, SuffixConfig, SuffixDrafter,
    TenantKey, TokenRecycler,
};
use specmesh_draft_model::{DraftOptions, ModelDrafter};
use specmesh_sampling::SamplingParams;
use tokio::sync::OwnedSemaphorePermit;

use crate::model::DraftModel;

/// The process-wide drafting state every session draws on.
#[derive(Debug)]
pub struct DrafterSet {
    /// `None` when the index has no memory budget.
    index: Option<GlobalSuffixIndex>,
    model: Option<DraftModel>,
}

impl DrafterSet {
    /// A global index of `index_bytes` (0: none) and an optional model.
    pub fn new(index_bytes: usize, model: Option<DraftModel>) -> DrafterSet {
        let index = (index_bytes > 0).then(|| {
            GlobalSuffixIndex::new(GlobalConfig {
                max_bytes: index_bytes,
                ..GlobalConfig::default()
            })
        });
        DrafterSet { index, model }
    }

    /// The drafter of a new session of `tenant` over a vocabulary of
    /// `vocab` tokens, sampled with `sampling`.
    pub fn for_session(
        &self,
        tenant: &TenantKey,
        vocab: u32,
        sampling: &SamplingParams,
    ) -> SessionDrafter {
        let suffix = match &self.index {
            Some(index) => {
                SuffixDrafter::with_global(SuffixConfig::default(), index, tenant.clone())
            }
            None => SuffixDrafter::new(SuffixConfig::default()),
        };
        let mut drafters: Vec<Box<dyn Drafter>> = vec![
            Box::new(PromptLookup::default()),
            Box::new(suffix),
            Box::new(TokenRecycler::default()),
        ];
        let model_slot = match self
            .model
            .as_ref()
            .and_then(|m| model_drafter(m, vocab, sampling))
        {
            Some((drafter, slot)) => {
                drafters.push(Box::new(drafter));
                Some(slot)
            }
            None => None,
        };
        SessionDrafter {
            merged: Merged::new(drafters),
            model_slot,
        }
    }

    /// Adds a finished session's output to its tenant's part of the global
    /// index (blocking: O(tokens × trie depth) under the tenant's lock).
    /// Returns whether it was indexed.
    pub fn index_output(&self, tenant: &TenantKey, output: &[u32]) -> bool {
        match &self.index {
            Some(index) if !output.is_empty() => {
                index.insert(tenant, output);
                true
            }
            _ => false,
        }
    }
}

/// A model drafter and its slot, or `None` (logged) when no slot is free
/// or the model's vocabulary is not the session's.
fn model_drafter(
    m: &DraftModel,
    vocab: u32,
    sampling: &SamplingParams,
) -> Option<(ModelDrafter, OwnedSemaphorePermit)> {
    let Some(slot) = m.try_slot() else {
        tracing::debug!("every draft model slot is taken: drafting model-free");
        return None;
    };
    let options = DraftOptions::default();
    match ModelDrafter::new(m.model().clone(), sampling.clone(), vocab, options) {
        Ok(d) => {
            tracing::debug!("drafting with the model");
            Some((d, slot))
        }
        Err(error) => {
            tracing::warn!(%error, "the draft model cannot serve this session: drafting model-free");
            None
        }
    }
}

/// One session's drafter: the merge of its sub-drafters, holding its model
/// slot (if any) for as long as the session lives.
pub struct SessionDrafter {
    merged: Merged,
    model_slot: Option<OwnedSemaphorePermit>,
}

impl fmt::Debug for SessionDrafter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionDrafter")
            .field("drafters", &self.merged)
            .finish()
    }
}

impl SessionDrafter {
    /// Whether a propose may run a model forward (milliseconds, so off the
    /// async workers).
    pub fn uses_model(&self) -> bool {
        self.model_slot.is_some()
    }

    pub fn drafter(&mut self) -> &mut Merged {
        &mut self.merged
    }
}
