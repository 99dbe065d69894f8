//! A drafter sized by the adaptive policy: what a drafter pod runs per
//! session, packaged for in-process use (local generation, benchmarks).

use specmesh_tree::{TokenTree, TreeLimits};

use crate::policy::SpecPolicy;
use crate::{DraftContext, Drafter, Feedback};

/// Wraps a drafter so that each step's tree budget comes from a
/// [`SpecPolicy`] (measured acceptance against the verifier's cost curve),
/// never above the caller's limits, and is zero when speculation does not
/// pay.
#[derive(Debug)]
pub struct Adaptive<D> {
    inner: D,
    policy: SpecPolicy,
    /// The verifier batch the next step will run in (its load).
    batch: usize,
}

impl<D: Drafter> Adaptive<D> {
    pub fn new(inner: D, policy: SpecPolicy) -> Adaptive<D> {
        Adaptive {
            inner,
            policy,
            batch: 1,
        }
    }

    /// Tells the policy how many sessions share the verifier's forward.
    pub fn set_batch(&mut self, batch: usize) {
        self.batch = batch.max(1);
    }

    pub fn policy(&self) -> &SpecPolicy {
        &self.policy
    }
}

impl<D: Drafter> Drafter for Adaptive<D> {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let budget = self.policy.decide(self.batch).budget;
        let limits = TreeLimits::new(
            budget.max_nodes.min(ctx.limits.max_nodes),
            budget.max_depth.min(ctx.limits.max_depth),
            ctx.limits.vocab,
        );
        if limits.max_nodes <= 1
            && let Ok(t) = TokenTree::root_only(ctx.root(), limits)
        {
            return t;
        }
        self.inner.propose(&DraftContext { limits, ..*ctx })
    }

    fn observe(&mut self, feedback: &Feedback<'_>) {
        self.policy.observe_feedback(feedback);
        self.inner.observe(feedback);
    }
}
