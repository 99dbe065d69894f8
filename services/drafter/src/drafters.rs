//! What each session drafts with: the process-wide pieces (the global
//! suffix index, the optional draft model) and the per-session [`Merged`]
//! drafter built from them.
//!
//! Every session gets prompt lookup, suffix decoding (its own text plus its
//! tenant's shard of the global index), token recycling and, when the
//! caller sent one, its predicted output ([`Predicted`]); they are
//! complementary (quoting the prompt, repeating earlier sessions, the
//! target's own recent preferences) and cost microseconds. With a draft
//! model configured, a session that gets a model slot also gets a
//! [`ModelDrafter`]. Each step drafts with one [`Arm`]: the model-free
//! drafters, the model, or both merged (the merge keeps the best-scored
//! nodes of all of them); the session's policy chooses the arm among those
//! the request's [`Sources`] allow.
//!
//! The model drafter drafts with the request's sampling parameters
//! (`DraftStart.sampling`): greedy requests get the draft's most likely
//! children, sampled ones children drawn from the draft's processed
//! distribution q, sent with the tree so the verifier accepts by recursive
//! rejection sampling (lossless for any q). Where the merge mixes model and
//! model-free candidates under one node the distributions are dropped and
//! the verifier's probability-free rule applies, lossless too.
//!
//! A session whose draft model keeps its KV by prefix starts from the
//! longest cached prefix of its context and publishes what the model
//! computes of the committed context ([`crate::prefix`]).
//!
//! A session's output joins the global index when its stream ends (see
//! [`DrafterSet::index_output`]): written from the drafter's own context,
//! which also holds the tokens committed on steps where the verifier did
//! not use our tree, rather than through [`SuffixDrafter::finish`], which
//! only sees what its `observe` and `propose` calls showed it.

use std::fmt;

use crate::validate::{StartSpec, TargetModel};
use specmesh_draft::{
    Arm, DraftContext, Drafter, Feedback, GlobalConfig, GlobalSuffixIndex, Merged, Predicted,
    PredictedConfig, PromptLookup, Sources, SuffixConfig, SuffixDrafter, TenantKey, TokenRecycler,
    TokenTree,
};
use specmesh_draft_model::{Cancel, CrossVocabDrafter, DraftOptions, DrafterStats, ModelDrafter};
use specmesh_sampling::SamplingParams;
use specmesh_tree::merge;
use tokio::sync::OwnedSemaphorePermit;

use crate::model::{DraftModel, ForwardCost, ModelRefusal};
use crate::prefix::{DraftKv, SessionPrefix};

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

    /// The draft model's KV cache by prefix, when it keeps one.
    pub fn draft_kv(&self) -> Option<&DraftKv> {
        self.model.as_ref().and_then(DraftModel::kv)
    }

    /// The drafter of the session `spec` starts; see [`Self::for_session`].
    /// A prediction joins the model-free drafters.
    pub fn for_spec(&self, spec: &StartSpec) -> Result<SessionDrafter, ModelRefusal> {
        let mut drafter = self.for_session(
            &spec.tenant,
            spec.vocab,
            &spec.sampling,
            spec.sources,
            &spec.target,
        )?;
        if !spec.prediction.is_empty() {
            drafter.free.push(Box::new(Predicted::new(
                spec.prediction.clone(),
                spec.prompt_len,
                PredictedConfig::default(),
            )));
        }
        // The draft model starts from the longest prefix of the context
        // it has cached (blocking: copies up to the whole context's KV).
        if let (Some(kv), Some((SessionModel::Same(m), _))) = (
            self.model.as_ref().and_then(DraftModel::kv),
            drafter.model.as_mut(),
        ) {
            let (prefix, taken) = kv.seed(&spec.cache_scope, &spec.tokens, m);
            drafter.prefix = Some(prefix);
            drafter.lookup = Some((spec.tokens.len() - 1, taken));
        }
        Ok(drafter)
    }

    /// The drafter of a new session of `tenant` over a vocabulary of
    /// `vocab` tokens, sampled with `sampling`, drafting with `sources`
    /// for `target`. Refused when the sources need the draft model and
    /// there is none, or when the draft model's vocabulary is not the
    /// target's (checked whenever the session might use the model,
    /// automatic choice included: a mismatch is a deployment error to fix,
    /// not something to route around in silence).
    pub fn for_session(
        &self,
        tenant: &TenantKey,
        vocab: u32,
        sampling: &SamplingParams,
        sources: Sources,
        target: &TargetModel,
    ) -> Result<SessionDrafter, ModelRefusal> {
        let suffix = match &self.index {
            Some(index) => {
                SuffixDrafter::with_global(SuffixConfig::default(), index, tenant.clone())
            }
            None => SuffixDrafter::new(SuffixConfig::default()),
        };
        let drafters: Vec<Box<dyn Drafter>> = vec![
            Box::new(PromptLookup::default()),
            Box::new(suffix),
            Box::new(TokenRecycler::default()),
        ];
        let mut arms = specmesh_draft::arms_for(sources, self.model.is_some());
        if arms.is_empty() {
            return Err(ModelRefusal::NoModel);
        }
        let mut model = None;
        let mut cost = None;
        if let Some(m) = self
            .model
            .as_ref()
            .filter(|_| arms.iter().any(|a| a.uses_model()))
        {
            m.check_target(target, vocab)?;
            model = model_drafter(m, vocab, sampling);
            cost = m.cost();
            if model.is_none() {
                // No slot: the session drafts model-free rather than not at all.
                arms = vec![Arm::ModelFree];
            }
        }
        Ok(SessionDrafter {
            free: Merged::new(drafters),
            model,
            arms,
            cost,
            prefix: None,
            lookup: None,
        })
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

/// A session's model drafter: in the target's vocabulary, or through text.
#[derive(Debug)]
enum SessionModel {
    Same(ModelDrafter),
    Cross(CrossVocabDrafter),
}

impl SessionModel {
    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        match self {
            SessionModel::Same(m) => m.propose(ctx),
            SessionModel::Cross(m) => m.propose(ctx),
        }
    }

    fn observe(&mut self, feedback: &Feedback<'_>) {
        match self {
            SessionModel::Same(m) => m.observe(feedback),
            SessionModel::Cross(m) => m.observe(feedback),
        }
    }

    fn stats(&self) -> DrafterStats {
        match self {
            SessionModel::Same(m) => m.stats(),
            SessionModel::Cross(m) => m.stats(),
        }
    }

    fn cancel_handle(&self) -> Cancel {
        match self {
            SessionModel::Same(m) => m.cancel_handle(),
            SessionModel::Cross(m) => m.cancel_handle(),
        }
    }

    /// Context tokens the draft model holds (its own tokens through text:
    /// close enough to price a catch-up).
    fn cached_len(&self) -> usize {
        match self {
            SessionModel::Same(m) => m.cached_len(),
            SessionModel::Cross(m) => m.cached_len(),
        }
    }
}

/// A model drafter and its slot, or `None` (logged) when no slot is free
/// or the model's vocabulary is not the session's.
fn model_drafter(
    m: &DraftModel,
    vocab: u32,
    sampling: &SamplingParams,
) -> Option<(SessionModel, OwnedSemaphorePermit)> {
    let Some(slot) = m.try_slot() else {
        tracing::debug!("every draft model slot is taken: drafting model-free");
        return None;
    };
    let options = DraftOptions::default();
    let drafter = match m.bridge() {
        // Through text the trees carry no draft distributions (they are
        // not the target's vocabulary's), so the model drafts greedily and
        // the verifier accepts its trees as deterministic proposals,
        // lossless for any sampling.
        Some(bridge) => {
            let own = m.model().config().vocab_size as u32;
            ModelDrafter::new(m.model().clone(), SamplingParams::greedy(), own, options)
                .map(|d| SessionModel::Cross(CrossVocabDrafter::new(d, bridge.clone())))
        }
        None => ModelDrafter::new(m.model().clone(), sampling.clone(), vocab, options)
            .map(SessionModel::Same),
    };
    match drafter {
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

/// One session's drafter: its model-free drafters (merged), its model
/// drafter and slot (if any, held for as long as the session lives), and
/// the arms its policy chooses among.
pub struct SessionDrafter {
    free: Merged,
    model: Option<(SessionModel, OwnedSemaphorePermit)>,
    arms: Vec<Arm>,
    /// What the draft model's forwards cost, when measured.
    cost: Option<ForwardCost>,
    /// Where the draft model's KV is published by prefix, when it is.
    prefix: Option<SessionPrefix>,
    /// Context tokens looked up in the draft model's cache at the start,
    /// and of those found; `None`: no lookup.
    lookup: Option<(usize, usize)>,
}

impl fmt::Debug for SessionDrafter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionDrafter")
            .field("model_free", &self.free)
            .field("model", &self.model.is_some())
            .field("arms", &self.arms)
            .finish()
    }
}

impl SessionDrafter {
    /// Whether the session has a draft model.
    pub fn has_model(&self) -> bool {
        self.model.is_some()
    }

    /// The draft model's seconds per one-token forward, measured when it
    /// loaded.
    pub fn forward_secs(&self) -> Option<f64> {
        self.cost
            .filter(|_| self.model.is_some())
            .map(|c| c.forward_secs)
    }

    /// Levels each model tree drafts beyond its depth: one through text
    /// ([`specmesh_draft_model::EXTRA_LEVELS`]), none otherwise.
    pub fn extra_levels(&self) -> usize {
        match &self.model {
            Some((SessionModel::Cross(_), _)) => specmesh_draft_model::EXTRA_LEVELS,
            _ => 0,
        }
    }

    /// Seconds the draft model would spend catching up on a context of
    /// `context_len` tokens before it can draft (0 when it holds it all, or
    /// without a model).
    pub fn catch_up_secs(&self, context_len: usize) -> f64 {
        match (&self.model, self.cost) {
            (Some((m, _)), Some(c)) => {
                context_len.saturating_sub(m.cached_len()) as f64 * c.prefill_token_secs
            }
            _ => 0.0,
        }
    }

    /// Context tokens the session looked up in the draft model's cache
    /// when it started, and of those found; `None` when it did not (no
    /// draft model, no cache, or no model slot).
    pub fn prefix_lookup(&self) -> Option<(usize, usize)> {
        self.lookup
    }

    /// Publishes the blocks of the committed context `ctx` the draft model
    /// holds after a propose.
    fn publish(&mut self, ctx: &DraftContext<'_>) {
        if let (Some(prefix), Some((SessionModel::Same(m), _))) =
            (self.prefix.as_mut(), self.model.as_ref())
        {
            prefix.publish(m, ctx.tokens);
        }
    }

    /// The arms the session's policy chooses among; never empty.
    pub fn arms(&self) -> &[Arm] {
        &self.arms
    }

    /// The model drafter's counters (zero without one).
    pub fn model_stats(&self) -> DrafterStats {
        self.model
            .as_ref()
            .map_or_else(DrafterStats::default, |(m, _)| m.stats())
    }

    /// A tree for `ctx` (the committed context) drafted the way `arm`
    /// says. An arm that needs the model the session does not have drafts
    /// model-free.
    pub fn propose(&mut self, arm: Arm, ctx: &DraftContext<'_>) -> TokenTree {
        let model = self.model.as_mut().map(|(m, _)| m);
        match (arm, model) {
            (Arm::ModelFree, _) | (_, None) => self.free.propose(ctx),
            (Arm::Model, Some(m)) => {
                let drafted = m.propose(ctx);
                self.publish(ctx);
                drafted
            }
            (Arm::Combined, Some(m)) => {
                let drafted = m.propose(ctx);
                self.with_model_tree(Arm::Combined, ctx, drafted)
            }
        }
    }

    /// What stops the draft model's propose between levels (drafting
    /// ahead); `None` without a model.
    pub fn model_cancel(&self) -> Option<Cancel> {
        self.model.as_ref().map(|(m, _)| m.cancel_handle())
    }

    /// The draft model's own tree for `ctx` (drafting ahead: a guessed
    /// context, so nothing is published); `None` without a model.
    pub fn propose_model(&mut self, ctx: &DraftContext<'_>) -> Option<TokenTree> {
        self.model.as_mut().map(|(m, _)| m.propose(ctx))
    }

    /// `arm`'s tree for `ctx` (the committed context) when the draft
    /// model's part of it, `drafted`, is already there (drafted ahead):
    /// the combined arm merges it with the model-free drafters' tree, as
    /// [`Self::propose`] does.
    pub fn with_model_tree(
        &mut self,
        arm: Arm,
        ctx: &DraftContext<'_>,
        drafted: TokenTree,
    ) -> TokenTree {
        self.publish(ctx);
        if arm != Arm::Combined {
            return drafted;
        }
        let free = self.free.propose(ctx);
        match (free.len() > 1, drafted.len() > 1) {
            // A lone tree keeps its draft distributions.
            (false, _) => drafted,
            (true, false) => free,
            (true, true) => merge(&[&drafted, &free], ctx.limits).unwrap_or(drafted),
        }
    }

    /// Every drafter learns from every step, whichever drafted it: the
    /// model-free ones index the text, the model drafter's cache follows
    /// the context on its next propose.
    pub fn observe(&mut self, feedback: &Feedback<'_>) {
        self.free.observe(feedback);
        if let Some((m, _)) = self.model.as_mut() {
            m.observe(feedback);
        }
    }
}
