//! Applying an outcome: which outcome is due, checking it against what
//! was sent, learning from it, and what to send next (see the parent
//! module's docs).

use specmesh_draft::{Arm, Budget, Feedback, TokenTree};

use super::clock::Untimed;
use super::ledger::{Awaited, SentAhead};
use super::{Applied, DraftSession, Reported};
use crate::error::DrafterError;
use crate::validate::{Outcome, Report, SpanOutcome};

impl DraftSession {
    /// Takes in the verifier's outcome of the next unreported steps. Errors
    /// end the stream with INVALID_ARGUMENT and change nothing.
    pub fn apply(&mut self, report: Report) -> Result<Applied, DrafterError> {
        let (step, span) = (report.step, report.span);
        if !self.ledger.is_due(step, span)? {
            return Ok(Applied::Ignored);
        }
        let tree_wait_us = report.tree_wait_us;
        let forward_us = report.forward_us;
        let tree_deadline_us = report.tree_deadline_us;
        let awaited = self.ledger.awaited.take().expect("checked above");
        let arm = awaited.arm();
        let last = awaited.steps().1;
        let drafted = match &awaited {
            Awaited::Tree { tree, .. } => tree.len() - 1,
            Awaited::Span { .. } => 0,
        };
        let applied = match &awaited {
            Awaited::Tree { tree, arm, .. } => self.apply_tree(report, tree, *arm),
            Awaited::Span { arm, .. } => self.apply_span(report, span as usize, *arm),
        };
        let (mut reported, batch) = match applied {
            Ok(a) => a,
            Err(e) => {
                self.ledger.awaited = Some(awaited);
                return Err(e);
            }
        };
        reported.tree_wait_us = tree_wait_us;
        tracing::debug!(
            step,
            span,
            arm = arm.name(),
            drafted,
            accepted = reported.accepted,
            speculative = reported.speculative,
            forward_us,
            tree_wait_us,
            "outcome"
        );
        // A guess held the drafter up until this outcome came, so the
        // verifier's wait for the tree is not the link's alone.
        let guessed = self.guesses.pending.is_some();
        // Whatever the outcome, a guess drafted ahead is settled by it.
        self.settle_guess();
        // Every tree was drafted, empty ones too (a model may draft nothing
        // usable): its drafting is not the step's.
        let (draft_secs, model_forwards, caught_up) = match &awaited {
            Awaited::Tree { .. } => std::mem::take(&mut self.clock.last_draft),
            Awaited::Span { .. } => (0.0, 0, 0),
        };
        self.clock
            .live
            .observe(forward_us, tree_wait_us, draft_secs, !guessed && span == 1);
        self.clock.live.observe_deadline(tree_deadline_us);
        self.clock.untimed = Some(Untimed {
            arm,
            drafted,
            batch,
            steps: span as usize,
            draft_secs,
            model_forwards,
            caught_up,
        });
        if step < last {
            self.ledger.awaited = Some(Awaited::Span {
                next: step + 1,
                last,
                arm,
            });
            return Ok(Applied::Within(reported));
        }
        match self.ledger.sent_ahead.take_if(|s| s.first == last + 1) {
            Some(SentAhead { first, last, arm }) => {
                // Sent ahead: the verifier verifies the root alone there.
                self.ledger.awaited = Some(Awaited::Span {
                    next: first,
                    last,
                    arm,
                });
                Ok(Applied::Ahead { batch, reported })
            }
            None => Ok(Applied::Next { batch, reported }),
        }
    }

    /// Applies the outcome of one step that verified `tree` (or, when its
    /// path is empty, something else).
    fn apply_tree(
        &mut self,
        report: Report,
        tree: &TokenTree,
        arm: Arm,
    ) -> Result<(Reported, usize), DrafterError> {
        let o = Outcome::from_report(report, tree)?;
        self.check_room(o.committed.len())?;
        self.node_budget = o.node_budget;
        let drafted_nothing = tree.len() == 1;
        // When the verifier verified only part of the tree, that part is
        // what the target judged: nodes left out were neither accepted nor
        // rejected, so learning reads the pruned tree and its path.
        let (tree, path) = match &o.pruned {
            Some(p) => (&p.tree, p.path.as_slice()),
            None => (tree, o.path.as_slice()),
        };
        // An empty path over our root-only tree is that tree's outcome (the
        // verifier sends no path when nothing was drafted): the root's
        // top-k still teaches token recycling.
        let ours: Option<&[usize]> = match path {
            [] if tree.len() == 1 && o.committed.len() == 1 => Some(&[0]),
            [] => None,
            path => Some(path),
        };
        // The draft model ran and drafted nothing the target could use
        // (through text, a path may end inside a target token): to the
        // policy its depth 1 was offered and refused, so an arm that keeps
        // paying forwards for empty trees stops being chosen.
        if drafted_nothing
            && self.clock.last_draft.1 > 0
            && let Some(p) = self.arms.policy_mut(arm)
        {
            p.observe(1, 0);
        }
        if let Some(path) = ours {
            let feedback = Feedback {
                tree,
                path,
                committed: &o.committed,
                top_k: &o.top_k,
            };
            self.drafter.observe(&feedback);
            if let Some(p) = self.arms.policy_mut(arm) {
                p.observe_feedback(&feedback);
            }
        } else if tree.len() > 1 {
            // The verifier did not verify our tree (it came after the
            // draft timeout): to the policy, a tree that late is one whose
            // every node was rejected, so an arm too slow to be waited for
            // stops being chosen.
            let feedback = Feedback {
                tree,
                path: &[0],
                committed: &o.committed,
                top_k: &[],
            };
            if let Some(p) = self.arms.policy_mut(arm) {
                p.observe_feedback(&feedback);
            }
        }
        self.context.extend_from_slice(&o.committed);
        let reported = Reported::verified(tree, ours.unwrap_or_default());
        Ok((reported, o.batch_size))
    }

    /// Applies the outcome of `steps` steps that verified the root alone:
    /// each is learned from as the root-only tree it was.
    fn apply_span(
        &mut self,
        report: Report,
        steps: usize,
        arm: Arm,
    ) -> Result<(Reported, usize), DrafterError> {
        let o = SpanOutcome::from_report(report, steps)?;
        self.check_room(o.committed.len())?;
        self.node_budget = o.node_budget;
        let limits = Budget::OFF.limits(self.terms.vocab);
        if o.forced > 0 {
            // A grammar forced tokens between the steps' own: the rows no
            // longer follow the tokens one to one, so nothing is learned.
            self.context.extend_from_slice(&o.committed);
            return Ok((Reported::plain(steps as u64), o.batch_size));
        }
        for (i, &token) in o.committed.iter().enumerate() {
            let root = *self.context.last().expect("the context only grows");
            let tree = TokenTree::root_only(root, limits)
                .map_err(|e| DrafterError::Internal(format!("root-only tree: {e}")))?;
            let feedback = Feedback {
                tree: &tree,
                path: &[0],
                committed: &o.committed[i..=i],
                top_k: o.top_k.get(i..=i).unwrap_or_default(),
            };
            self.drafter.observe(&feedback);
            if let Some(p) = self.arms.policy_mut(arm) {
                p.observe_feedback(&feedback);
            }
            self.context.push(token);
        }
        Ok((Reported::plain(steps as u64), o.batch_size))
    }

    /// Refuses an outcome that would grow the context past its limit.
    fn check_room(&self, committed: usize) -> Result<(), DrafterError> {
        let grown = self.context.len().saturating_add(committed);
        if grown > self.terms.max_context {
            let reason = format!(
                "would grow the context to {grown} tokens, over the drafter's limit of {}",
                self.terms.max_context
            );
            return Err(DrafterError::invalid("outcome.committed", reason));
        }
        Ok(())
    }
}
