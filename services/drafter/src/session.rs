//! One draft stream's state machine: the session's drafter, its adaptive
//! policy, its context and the last tree sent.
//!
//! ```text
//!   start ──► plan(1) ─► draft ─► tree step 0
//!   outcome{step 0} ──► apply ─► plan(batch) ─► draft ─► tree step 1
//!   outcome{step 1} ──► apply ─► …
//! ```
//!
//! Every applied outcome is answered with exactly one tree, root-only when
//! the budget is zero, so the verifier never waits on a step the drafter
//! chose not to speculate. Outcomes arrive in order on one stream, one per
//! verify step, so the outcome for the last tree's step is the only one
//! that can be applied:
//!
//! - an outcome for an **earlier** step is stale or duplicated (a verifier
//!   retrying a send): it is ignored and answered with nothing, since the
//!   tree for the following step has already been sent;
//! - an outcome for a **later** step means outcomes were lost and the
//!   drafter's context no longer matches the verifier's: the stream ends
//!   with INVALID_ARGUMENT so the verifier can reopen it from a fresh start.
//!
//! **Pipelining.** When the policy has already decided not to speculate at
//! the step after the one being verified, there is nothing to wait for: the
//! session sends a tree with no nodes for that step at once, ahead of the
//! outcome it follows, and the verifier finds it waiting (its root is
//! ignored). The policy decides once per step either way; a decision to
//! draft is kept and used when the outcome arrives.
//!
//! The session is plain data with synchronous methods so it can move onto
//! a blocking thread for a model-drafter propose and back.

use std::time::{Duration, Instant};

use specmesh_draft::{
    Budget, DraftContext, Drafter, Feedback, PolicyConfig, SpecPolicy, TenantKey, TokenTree,
};
use specmesh_proto::{tree_to_wire, v1};

use crate::drafters::SessionDrafter;
use crate::error::SessionError;
use crate::validate::{Outcome, SessionSpec};

/// The verifier's batch size assumed for step 0 (the start carries none).
const FIRST_STEP_BATCH: usize = 1;

/// What [`DraftSession::apply`] made of an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Stale or duplicated: nothing changed, nothing to send.
    Ignored,
    /// Applied; the tree for the next step is due, planned for `batch`.
    Next { batch: usize, accepted: usize },
    /// Applied; the next step's tree was sent ahead ("nothing drafted").
    Ahead { batch: usize, accepted: usize },
}

/// The budget of one tree, decided before drafting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The step the tree is for.
    pub step: u64,
    pub budget: Budget,
}

/// A tree ready to send.
#[derive(Debug, Clone)]
pub struct Drafted {
    pub tree: v1::TokenTree,
    /// Drafted nodes, root excluded.
    pub nodes: usize,
    /// Time spent in the drafter's `propose`.
    pub took: Duration,
}

/// A session's drafting state; see the module docs.
#[derive(Debug)]
pub struct DraftSession {
    epoch: u64,
    tenant: TenantKey,
    vocab: u32,
    prompt_len: usize,
    max_context: usize,
    max_draft_tokens: usize,
    max_depth: usize,
    drafter: SessionDrafter,
    policy: SpecPolicy,
    /// Prompt then committed output; the last token is the next root.
    context: Vec<u32>,
    /// The last tree sent and its step; `None` before step 0 is drafted.
    last: Option<(u64, TokenTree)>,
    /// The step of the next tree to draft.
    next_step: u64,
    /// Send "nothing drafted" ahead when the policy says so.
    pipeline: bool,
    /// A step whose empty tree was sent ahead of its predecessor's outcome.
    ahead: Option<u64>,
    /// A decision to draft, taken ahead, for the step after the last tree.
    deferred: Option<Plan>,
}

impl DraftSession {
    /// A session for `spec`; contexts may grow to `max_context` tokens.
    pub fn new(
        spec: SessionSpec,
        drafter: SessionDrafter,
        max_context: usize,
        pipeline: bool,
    ) -> Result<DraftSession, SessionError> {
        let config = PolicyConfig {
            max_nodes: spec.max_draft_tokens + 1,
            max_depth: spec.max_depth,
            ..PolicyConfig::default()
        };
        let policy = SpecPolicy::new(spec.curve, config)
            .map_err(|e| SessionError::Internal(format!("policy config: {e}")))?;
        Ok(DraftSession {
            epoch: spec.epoch,
            tenant: spec.tenant,
            vocab: spec.vocab,
            prompt_len: spec.prompt_len,
            max_context,
            max_draft_tokens: spec.max_draft_tokens,
            max_depth: spec.max_depth,
            drafter,
            policy,
            context: spec.tokens,
            last: None,
            next_step: 0,
            pipeline,
            ahead: None,
            deferred: None,
        })
    }

    /// Whether drafting under `plan` may run a model forward (milliseconds:
    /// run it off the async workers).
    pub fn blocks(&self, plan: &Plan) -> bool {
        self.drafter.uses_model() && !plan.budget.is_off()
    }

    /// The plan for the first tree (step 0).
    pub fn plan_first(&mut self) -> Plan {
        self.plan(FIRST_STEP_BATCH)
    }

    /// Takes in the verifier's outcome of the last tree's step. Errors end
    /// the stream with INVALID_ARGUMENT.
    pub fn apply(&mut self, wire: v1::StepOutcome) -> Result<Applied, SessionError> {
        let Some((sent_step, tree)) = &self.last else {
            return Err(SessionError::Internal(
                "an outcome was applied before the first tree was drafted".into(),
            ));
        };
        let sent_step = *sent_step;
        if wire.step < sent_step {
            return Ok(Applied::Ignored);
        }
        if wire.step > sent_step {
            let reason = format!(
                "is {}, but the last tree sent was for step {sent_step}: the outcomes of steps \
                 {sent_step}..{} are missing",
                wire.step, wire.step
            );
            return Err(SessionError::invalid("outcome.step", reason));
        }
        let o = Outcome::from_wire(wire, tree, self.vocab)?;
        let grown = self.context.len().saturating_add(o.committed.len());
        if grown > self.max_context {
            let reason = format!(
                "would grow the context to {grown} tokens, over the drafter's limit of {}",
                self.max_context
            );
            return Err(SessionError::invalid("outcome.committed", reason));
        }
        // An empty path over our root-only tree is that tree's outcome (the
        // verifier sends no path when nothing was drafted): the root's
        // top-k still teaches token recycling.
        let ours: Option<&[usize]> = match o.path.as_slice() {
            [] if tree.len() == 1 && o.committed.len() == 1 => Some(&[0]),
            [] => None,
            path => Some(path),
        };
        let accepted = ours.map_or(0, |p| p.len() - 1);
        if let Some(path) = ours {
            let feedback = Feedback {
                tree,
                path,
                committed: &o.committed,
                top_k: &o.top_k,
            };
            self.drafter.drafter().observe(&feedback);
            self.policy.observe_feedback(&feedback);
        }
        self.context.extend_from_slice(&o.committed);
        self.next_step = sent_step + 1;
        if self.ahead == Some(self.next_step) {
            // The verifier verifies the root alone at that step: await its
            // outcome as that of a root-only tree.
            self.ahead = None;
            let root = *self.context.last().expect("the context only grows");
            let limits = Budget::OFF.limits(self.vocab);
            let tree = TokenTree::root_only(root, limits)
                .map_err(|e| SessionError::Internal(format!("root-only tree: {e}")))?;
            self.last = Some((self.next_step, tree));
            self.next_step += 1;
            return Ok(Applied::Ahead {
                batch: o.batch_size,
                accepted,
            });
        }
        Ok(Applied::Next {
            batch: o.batch_size,
            accepted,
        })
    }

    /// The plan for the tree due now: the decision taken ahead if there is
    /// one, else a fresh one.
    pub fn next_plan(&mut self, batch: usize) -> Plan {
        match self.deferred.take() {
            Some(p) => Plan {
                step: self.next_step,
                ..p
            },
            None => self.plan(batch),
        }
    }

    /// Decides the step after the last tree sent, ahead of the outcome it
    /// follows: returns the empty tree to send now when the decision is
    /// not to speculate, else keeps the decision for [`next_plan`].
    ///
    /// [`next_plan`]: DraftSession::next_plan
    pub fn plan_ahead(&mut self, batch: usize) -> Option<Drafted> {
        if !self.pipeline || self.ahead.is_some() || self.deferred.is_some() {
            return None;
        }
        let step = self.last.as_ref()?.0 + 1;
        let plan = Plan {
            step,
            ..self.plan(batch)
        };
        if !plan.budget.is_off() {
            self.deferred = Some(plan);
            return None;
        }
        self.ahead = Some(step);
        Some(Drafted {
            tree: v1::TokenTree {
                epoch: self.epoch,
                step,
                ..Default::default()
            },
            nodes: 0,
            took: Duration::ZERO,
        })
    }

    /// Decides the next tree's budget for a verifier batch of `batch`
    /// sessions: the policy's choice, within the verifier's bounds.
    pub fn plan(&mut self, batch: usize) -> Plan {
        let decided = self.policy.decide(batch.max(1)).budget;
        let budget = Budget {
            max_nodes: decided.max_nodes.min(self.max_draft_tokens + 1),
            max_depth: decided.max_depth.min(self.max_depth),
        };
        let budget = if budget.is_off() { Budget::OFF } else { budget };
        Plan {
            step: self.next_step,
            budget,
        }
    }

    /// Drafts the tree for `plan` and remembers it as the last tree sent.
    pub fn draft(&mut self, plan: Plan) -> Result<Drafted, SessionError> {
        let limits = plan.budget.limits(self.vocab);
        // Never empty: the start's tokens were, and the context only grows.
        let Some(&root) = self.context.last() else {
            return Err(SessionError::Internal(
                "the session's context is empty".into(),
            ));
        };
        let ctx = DraftContext {
            tokens: &self.context,
            prompt_len: self.prompt_len,
            limits,
        };
        let t0 = Instant::now();
        let proposed = self.drafter.drafter().propose(&ctx);
        let took = t0.elapsed();
        let fits = proposed.root_token() == root
            && proposed.len() <= limits.max_nodes
            && proposed.max_depth() <= limits.max_depth;
        debug_assert!(fits, "the merged drafter broke its limits");
        let tree = if fits {
            proposed
        } else {
            tracing::error!(
                nodes = proposed.len(),
                depth = proposed.max_depth(),
                "the drafter broke its limits: sending the root alone"
            );
            TokenTree::root_only(root, limits)
                .map_err(|e| SessionError::Internal(format!("root-only tree: {e}")))?
        };
        let wire = tree_to_wire(&tree, self.epoch, plan.step);
        let nodes = tree.draft_len();
        self.last = Some((plan.step, tree));
        Ok(Drafted {
            tree: wire,
            nodes,
            took,
        })
    }

    pub fn tenant(&self) -> &TenantKey {
        &self.tenant
    }

    /// The session's output so far: its context after the prompt.
    pub fn output(&self) -> &[u32] {
        self.context.get(self.prompt_len..).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
