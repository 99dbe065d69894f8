//! The drafter configurations the offline commands score, by name.

use std::sync::Arc;

use specmesh_draft::{
    Drafter, GlobalSuffixIndex, Merged, PromptLookup, SuffixConfig, SuffixDrafter, TenantKey,
    TokenRecycler,
};
use specmesh_draft_model::{DraftOptions, ModelDrafter};
use specmesh_model::Model;
use specmesh_sampling::SamplingParams;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DrafterKind {
    /// Prompt lookup: n-gram matches in prompt and output.
    Lookup,
    /// Suffix decoding over the session and a global index of past outputs.
    Suffix,
    /// Token recycling: the target's own top-k of earlier steps.
    Recycle,
    /// All three merged into one tree.
    Merged,
    /// A small model drafting a top-k tree: the target's first layers
    /// (`--self-draft-layers`).
    SelfDraft,
}

impl std::fmt::Display for DrafterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            DrafterKind::Lookup => "lookup",
            DrafterKind::Suffix => "suffix",
            DrafterKind::Recycle => "recycle",
            DrafterKind::Merged => "merged",
            DrafterKind::SelfDraft => "self-draft",
        })
    }
}

/// State shared across sessions, as on a drafter pod.
#[derive(Debug, Default, Clone)]
pub struct Shared {
    pub index: GlobalSuffixIndex,
    /// The draft model of `SelfDraft`.
    pub draft_model: Option<Arc<Model>>,
}

impl Shared {
    pub fn new() -> Shared {
        Shared::default()
    }
}

/// A fresh per-session drafter of `kind`.
pub fn make(kind: DrafterKind, shared: &Shared, tenant: &str) -> Box<dyn Drafter> {
    let suffix = || {
        SuffixDrafter::with_global(
            SuffixConfig::default(),
            &shared.index,
            TenantKey::new(tenant),
        )
    };
    match kind {
        DrafterKind::Lookup => Box::new(PromptLookup::default()),
        DrafterKind::Suffix => Box::new(suffix()),
        DrafterKind::Recycle => Box::new(TokenRecycler::new(Default::default())),
        DrafterKind::SelfDraft => {
            let model = shared
                .draft_model
                .clone()
                .expect("SelfDraft needs Shared::draft_model");
            let vocab = model.config().vocab_size as u32;
            Box::new(
                ModelDrafter::new(
                    model,
                    SamplingParams::greedy(),
                    vocab,
                    DraftOptions::default(),
                )
                .expect("the draft model shares the target's vocabulary"),
            )
        }
        DrafterKind::Merged => Box::new(Merged::new(vec![
            Box::new(suffix()),
            Box::new(PromptLookup::default()),
            Box::new(TokenRecycler::new(Default::default())),
        ])),
    }
}

/// Records a finished session's output in the global index, as the drafter
/// service does when a session ends.
pub fn finish(shared: &Shared, tenant: &str, output: &[u32]) {
    shared.index.insert(&TenantKey::new(tenant), output);
}
