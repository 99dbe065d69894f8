//! Drafters: cheap proposers of token trees for the target to verify.
//!
//! Every drafter sits behind one narrow trait, [`Drafter`]: given the
//! session's tokens and a budget it proposes a [`TokenTree`] rooted at the
//! last committed token, and after each verify step it observes what the
//! target accepted. Drafters are per session; state shared across sessions
//! (the suffix drafter's global index) is an explicit, tenant-scoped handle.
//!
//! Nothing here does I/O, so everything is unit-tested in-process.

#![forbid(unsafe_code)]

pub mod adaptive;
pub mod lookup;
pub mod merged;
pub mod policy;
pub mod predicted;
pub mod recycle;
pub mod suffix;

pub use adaptive::Adaptive;
pub use lookup::{LookupConfig, PromptLookup};
pub use merged::Merged;
pub use policy::{
    AcceptanceStats, Arm, Arms, Budget, CostCurve, Decision, Learned, Ledger, PolicyConfig,
    PolicyError, Sources, SpecPolicy, StepTiming, arms_for,
};
pub use predicted::{Predicted, PredictedConfig};
pub use recycle::{RecycleConfig, TokenRecycler};
pub use specmesh_tree::{TokenTree, TreeLimits};
pub use suffix::{GlobalConfig, GlobalSuffixIndex, SuffixConfig, SuffixDrafter, TenantKey};

/// What a drafter sees when asked for a tree.
#[derive(Clone, Copy, Debug)]
pub struct DraftContext<'a> {
    /// Prompt then committed output. The last token is the tree's root (its
    /// KV is not computed yet); it is never empty.
    pub tokens: &'a [u32],
    /// How many of `tokens` are the prompt.
    pub prompt_len: usize,
    /// The budget for this step: the tree must fit it (node count includes
    /// the root).
    pub limits: TreeLimits,
}

impl DraftContext<'_> {
    pub fn root(&self) -> u32 {
        *self.tokens.last().expect("a draft context is never empty")
    }
}

/// What the target did with the last tree.
#[derive(Clone, Copy, Debug)]
pub struct Feedback<'a> {
    /// The tree that was verified.
    pub tree: &'a TokenTree,
    /// Tree nodes of the accepted path, root first (`[0]` when nothing was
    /// accepted).
    pub path: &'a [usize],
    /// Tokens committed by this step: the accepted drafted tokens, then the
    /// bonus token.
    pub committed: &'a [u32],
    /// For each node of `path`, the target's top tokens after it as
    /// (token, log-probability), most likely first. Entry `j` is the
    /// target's view of the token that follows `path[j]`.
    pub top_k: &'a [Vec<(u32, f32)>],
}

/// A source of draft trees for one session.
pub trait Drafter: Send {
    /// A short, stable name for metrics and logs.
    fn name(&self) -> &'static str;

    /// Proposes a tree rooted at `ctx.root()` within `ctx.limits`. Returns
    /// the root alone when it has nothing to offer; never fails.
    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree;

    /// Learns from a verify step. The default ignores it.
    fn observe(&mut self, _feedback: &Feedback<'_>) {}
}

impl<D: Drafter + ?Sized> Drafter for Box<D> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        (**self).propose(ctx)
    }

    fn observe(&mut self, feedback: &Feedback<'_>) {
        (**self).observe(feedback)
    }
}
