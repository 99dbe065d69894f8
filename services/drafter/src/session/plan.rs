//! A session's plans: which arm drafts the next tree and how big, decided
//! when the tree is due or ahead of the outcome it follows (a run of steps
//! the policy will not speculate at goes out as one empty tree).

use std::time::Duration;

use specmesh_draft::Budget;
use specmesh_proto::MAX_TREE_SPAN;

use super::ledger::SentAhead;
use super::{DraftSession, Drafted, Plan};
use crate::validate::{Computed, SentTree};

impl DraftSession {
    /// The plan for the first tree (step 0), for the verifier's batch as
    /// the session started.
    pub fn plan_first(&mut self) -> Plan {
        self.plan(self.terms.first_batch)
    }

    /// The plan for the tree due now: the decision taken ahead if there is
    /// one, else a fresh one.
    pub fn next_plan(&mut self, batch: usize) -> Plan {
        match self.ledger.kept.take() {
            Some(p) => Plan {
                step: self.ledger.next_step,
                ..p
            },
            None => self.plan(batch),
        }
    }

    /// Decides the steps after the last tree sent, ahead of the outcome
    /// they follow: when the decision is not to speculate, returns the
    /// empty tree to send now, standing for the whole run of steps the
    /// policy will not speculate at; else keeps the decision for
    /// [`next_plan`].
    ///
    /// [`next_plan`]: DraftSession::next_plan
    pub fn plan_ahead(&mut self, batch: usize) -> Option<Drafted> {
        if !self.ledger.pipeline
            || self.ledger.awaited.is_none()
            || self.ledger.sent_ahead.is_some()
            || self.ledger.kept.is_some()
        {
            return None;
        }
        let (plan, span) = self.plan_run(batch, MAX_TREE_SPAN as usize);
        if !plan.budget.is_off() {
            self.ledger.kept = Some(plan);
            return None;
        }
        let last = specmesh_proto::last_step(plan.step, span as u32);
        self.ledger.sent_ahead = Some(SentAhead {
            first: plan.step,
            last,
            arm: plan.arm,
        });
        self.ledger.next_step = last + 1;
        Some(Drafted {
            tree: SentTree {
                epoch: self.terms.epoch,
                step: plan.step,
                span: span as u32,
                tree: None,
                drafted_ahead: false,
                drafted_by: None,
                computed: Computed::default(),
            },
            nodes: 0,
            took: Duration::ZERO,
            retokenized: None,
        })
    }

    /// Decides the next tree's budget for a verifier batch of `batch`
    /// sessions: the policy's choice, within the verifier's bounds.
    pub fn plan(&mut self, batch: usize) -> Plan {
        self.plan_run(batch, 1).0
    }

    /// [`plan`], and when it does not speculate, how many steps from the
    /// next one on (at most `max_steps`) the policy will not either.
    ///
    /// [`plan`]: DraftSession::plan
    ///
    /// A verifier that plans its batch's forward (it sends a node budget)
    /// prices the batch itself: the session then decides as if it were
    /// alone and proposes at most the budget, and the verifier's planner
    /// prunes to what it grants. A zero budget drafts nothing but the
    /// policy's probes, so the planner keeps seeing what the session's
    /// drafts are worth.
    fn plan_run(&mut self, batch: usize, max_steps: usize) -> (Plan, usize) {
        self.price_switches();
        self.cap_model_depth(batch);
        let priced_for = if self.node_budget.is_some() {
            1
        } else {
            batch.max(1)
        };
        self.arms.set_grant_cap(self.node_budget);
        let output = self.context.len().saturating_sub(self.terms.prompt_len);
        self.arms
            .set_tokens_left(self.terms.max_new_tokens.map(|m| m.saturating_sub(output)));
        let (arm, decided, steps) = self.arms.decide_run(priced_for, max_steps);
        let budget = Budget {
            max_nodes: decided
                .budget
                .max_nodes
                .min(self.terms.max_draft_tokens + 1),
            max_depth: decided.budget.max_depth.min(self.terms.max_depth),
        };
        let budget = if budget.is_off() { Budget::OFF } else { budget };
        tracing::debug!(
            step = self.ledger.next_step,
            arm = arm.name(),
            nodes = budget.drafted(),
            depth = budget.max_depth,
            run = steps,
            expected = decided.expected_speedup(),
            probe = decided.probe,
            "decided"
        );
        let plan = Plan {
            step: self.ledger.next_step,
            arm,
            budget,
        };
        (plan, steps)
    }
}
