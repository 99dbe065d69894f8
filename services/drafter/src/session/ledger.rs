//! Which steps the session sent trees for, which outcome is due next, and
//! the decisions it took ahead of the outcome they follow (see the parent
//! module's docs on pipelining). Two things happen "ahead" in a session;
//! this ledger keeps the first: an empty tree **sent ahead** for steps the
//! policy will not speculate at ([`StepLedger::sent_ahead`]). The second,
//! a draft model's tree **drafted ahead** on a guessed outcome, is
//! [`super::guess`]'s.

use specmesh_draft::{Arm, TokenTree};

use super::Plan;
use crate::error::DrafterError;

/// What the session awaits the outcome of.
#[derive(Debug)]
pub(super) enum Awaited {
    /// A drafted tree (perhaps the root alone) for one step, by `arm`.
    Tree {
        step: u64,
        tree: TokenTree,
        arm: Arm,
    },
    /// Steps `next..=last` of a tree sent ahead with no nodes: each
    /// verified the root alone; `arm`'s policy decided them.
    Span { next: u64, last: u64, arm: Arm },
}

impl Awaited {
    /// The first and last step still to be reported.
    pub(super) fn steps(&self) -> (u64, u64) {
        match *self {
            Awaited::Tree { step, .. } => (step, step),
            Awaited::Span { next, last, .. } => (next, last),
        }
    }

    pub(super) fn arm(&self) -> Arm {
        match *self {
            Awaited::Tree { arm, .. } | Awaited::Span { arm, .. } => arm,
        }
    }
}

/// Steps `first..=last`, whose empty tree was sent ahead of the outcome
/// that precedes them; `arm`'s policy decided them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SentAhead {
    pub(super) first: u64,
    pub(super) last: u64,
    pub(super) arm: Arm,
}

/// The session's steps; see the module docs.
#[derive(Debug)]
pub(super) struct StepLedger {
    /// What the next outcome reports on; `None` before step 0 is drafted
    /// and while the tree due is being drafted.
    pub(super) awaited: Option<Awaited>,
    /// The step of the next tree to send: one past every step a tree was
    /// sent for.
    pub(super) next_step: u64,
    /// Send "nothing drafted" ahead when the policy says so.
    pub(super) pipeline: bool,
    /// The steps whose empty tree was sent ahead, until their turn.
    pub(super) sent_ahead: Option<SentAhead>,
    /// A decision to draft, taken ahead, for the step after the last tree.
    pub(super) kept: Option<Plan>,
}

impl StepLedger {
    /// A ledger whose first tree is for `first_step`.
    pub(super) fn starting(first_step: u64, pipeline: bool) -> StepLedger {
        StepLedger {
            awaited: None,
            next_step: first_step,
            pipeline,
            sent_ahead: None,
            kept: None,
        }
    }

    /// Whether an outcome reporting `span` steps up to `step` is the one
    /// due: `Ok(false)` when it is stale or duplicated (ignored), an error
    /// naming the field when outcomes were lost or it reports steps twice.
    pub(super) fn is_due(&self, step: u64, span: u64) -> Result<bool, DrafterError> {
        let Some(awaited) = &self.awaited else {
            return Err(DrafterError::Internal(
                "an outcome was applied while no tree awaited one".into(),
            ));
        };
        let (next, last) = awaited.steps();
        if step < next {
            return Ok(false);
        }
        if step > last {
            let reason = format!(
                "is {step}, but the outcome due reports {}: outcomes were lost",
                steps_text(next, last)
            );
            return Err(DrafterError::invalid("outcome.step", reason));
        }
        // `step` is at most `last`, a step a tree was sent for: no overflow.
        let first = (step + 1).checked_sub(span);
        if first != Some(next) {
            let reason = match first {
                Some(first) if first > next => format!(
                    "is {span}: the outcome reports {} but not {} before it: outcomes were lost",
                    steps_text(first, step),
                    steps_text(next, first - 1)
                ),
                _ => format!(
                    "is {span}: the outcome reports steps before step {next}, which were \
                     reported already"
                ),
            };
            return Err(DrafterError::invalid("outcome.span", reason));
        }
        Ok(true)
    }

    /// Awaits the outcome of `tree`, sent for `step` by `arm`.
    pub(super) fn sent(&mut self, step: u64, tree: TokenTree, arm: Arm) {
        self.awaited = Some(Awaited::Tree { step, tree, arm });
        self.next_step = step + 1;
    }
}

/// "step 4" or "steps 4..=9", for messages.
fn steps_text(first: u64, last: u64) -> String {
    if first == last {
        format!("step {first}")
    } else {
        format!("steps {first}..={last}")
    }
}
