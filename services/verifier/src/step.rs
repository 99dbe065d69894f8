//! One session's steps, without I/O: which tree each step verifies (the
//! drafter's, validated, or the root alone) and what a verified step sends
//! (its `Committed` event to the gateway and, when due, its `StepOutcome`
//! to the drafter). The `stream` module is its I/O shell: it asks the
//! drafter, runs the batcher, sends the messages. Tests drive this core
//! in-process, step by step.
//!
//! A tree with no nodes may stand for a run of steps (its `span`): the
//! session verifies the root alone at each without waiting for the drafter
//! or telling it anything, and reports the whole run in one outcome after
//! its last step. The gateway sees every step as usual.

use specmesh_engine::{Finish, Step};
use specmesh_tree::Sources;
use specmesh_tree::{TokenTree, TreeLimits, merge};

use crate::error::VerifierError;
use crate::outcome::{Outcome, Report};

/// What the drafter answered for a step.
#[derive(Debug)]
pub enum Answer {
    /// Its tree (possibly one with no nodes standing for a span of steps).
    Tree(Drafted),
    /// A tree the wire edge refused (`validate::drafted`): the session
    /// goes on without the drafter, for this reason.
    Invalid(String),
    /// Nothing in time: this step verifies the root alone.
    Late,
    /// The stream failed: the session goes on without speculation.
    Lost(String),
    /// The drafter refused the session as the request asked for it
    /// (FAILED_PRECONDITION: no draft model, or one whose vocabulary is not
    /// the target's): the run fails with its message.
    Refused(String),
}

/// A drafter's tree as the wire edge read it.
#[derive(Debug)]
pub struct Drafted {
    /// Its nodes, valid within the session's tree limits; `None`: nothing
    /// drafted.
    pub tree: Option<TokenTree>,
    /// The last step it stands for (a tree with no nodes may stand for a
    /// span of steps).
    pub last: u64,
    /// The drafter drafted it ahead of the outcome before it.
    pub drafted_ahead: bool,
    /// The way of drafting that made it, when the drafter named one.
    pub drafted_by: Option<Sources>,
    /// Seconds the drafter computed for it, when it said.
    pub drafting: Option<f64>,
}

/// The tree a step verifies.
#[derive(Debug)]
pub struct Planned {
    pub tree: TokenTree,
    /// Target top-k per accepted node to report (token recycling); 0
    /// without a drafter.
    pub top_k: usize,
    /// Why the drafter was dropped at this step, when it was.
    pub dropped: Option<String>,
    /// The way of drafting that made the tree, when the drafter named one
    /// (the planner calibrates its scores apart).
    pub drafted_by: Option<Sources>,
    /// Seconds the drafter computed for the tree, when it said (the
    /// planner prices drafting on shared cores).
    pub drafting: Option<f64>,
}

/// What a verified step sends.
#[derive(Debug)]
pub struct Verified {
    /// To the gateway, every step.
    pub committed: Committed,
    /// To the drafter, when its outcome is due.
    pub outcome: Option<Outcome>,
    /// The session ended at this step.
    pub finished: bool,
}

/// A verified step, for the gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    pub step: u64,
    /// The tokens it committed (accepted drafts, then the target's own).
    pub tokens: Vec<u32>,
    /// Drafted nodes it verified, and how many the target accepted.
    pub drafted: u32,
    pub accepted: u32,
    /// The session ended at this step; `eos`: by the end-of-sequence token.
    pub finished: bool,
    pub eos: bool,
    /// Microseconds the step waited for the drafter's tree.
    pub tree_wait_us: u32,
    /// The step verified a tree drafted ahead.
    pub drafted_ahead: bool,
    /// Tokens accepted from what the grammar forced.
    pub forced: u32,
    /// With logprobs on: one per token.
    pub logprobs: Vec<specmesh_verify::TokenLogprobs>,
}

/// What the batch made of a step's tree: the goodput planner's grant, and
/// how long the forward took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepGrant {
    /// Drafted nodes the drafter proposed.
    pub offered: usize,
    /// The verified ones (drafter's indices, ascending) when not all were.
    pub granted: Option<Vec<u32>>,
    /// The planner's forecast for the next tree; `None` with it off.
    pub node_budget: Option<u32>,
    /// Microseconds of the batched forward that verified it.
    pub forward_us: u32,
    /// Microseconds after the forward the verifier waits for the next
    /// tree before going on without it.
    pub tree_deadline_us: u32,
}

/// Bounds of a session's trees.
#[derive(Debug, Clone, Copy)]
pub struct TreeBounds {
    pub vocab: u32,
    /// Drafted nodes per tree, at most (0: never draft).
    pub max_draft: usize,
    pub max_depth: usize,
    /// Target top-k reported per accepted node.
    pub recycle_top_k: usize,
}

/// A session's step state; see the module docs.
#[derive(Debug)]
pub struct Steps {
    epoch: u64,
    bounds: TreeBounds,
    drafting: bool,
    step: u64,
    /// The outcome owed to the drafter: set while a span's steps run.
    report: Option<Report>,
    /// What this step waited for the drafter's tree, in microseconds.
    wait_us: u32,
    /// This step verifies a tree the drafter drafted ahead.
    drafted_ahead: bool,
    /// The drafter was re-attached after the session lost its first: its
    /// refusal drops it rather than failing a running session.
    reattached: bool,
}

impl Steps {
    /// A session's first step; `drafting` when a drafter stream is open.
    pub fn new(epoch: u64, bounds: TreeBounds, drafting: bool) -> Steps {
        Steps {
            epoch,
            bounds,
            drafting: drafting && bounds.max_draft > 0,
            step: 0,
            report: None,
            wait_us: 0,
            drafted_ahead: false,
            reattached: false,
        }
    }

    /// The step being planned or verified.
    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether a drafter still drafts for the session.
    pub fn drafting(&self) -> bool {
        self.drafting
    }

    /// Whether this step asks the drafter for a tree: not without one, nor
    /// inside a span (the drafter drafts nothing there and hears of it when
    /// the span is over).
    pub fn wants_tree(&self) -> bool {
        self.drafting && self.report.is_none()
    }

    /// Records how long this step waited for the drafter's answer (before
    /// [`Steps::plan`]).
    pub fn waited(&mut self, wait: std::time::Duration) {
        self.wait_us = u32::try_from(wait.as_micros()).unwrap_or(u32::MAX);
    }

    /// The drafter is gone: plain decoding from here on.
    pub fn drafter_lost(&mut self) {
        self.drafting = false;
        self.report = None;
    }

    /// A drafter took the session again (see [`crate::reattach`]): it
    /// drafts from this step on.
    pub fn reattached(&mut self) {
        self.drafting = self.bounds.max_draft > 0;
        self.report = None;
        self.reattached = true;
    }

    /// The tree this step verifies. `answer` is the drafter's when
    /// [`Steps::wants_tree`] (else ignored); `root` the session's last
    /// token and `room` the drafted nodes its context still has room for.
    pub fn plan(
        &mut self,
        answer: Option<Answer>,
        root: u32,
        room: usize,
    ) -> Result<Planned, VerifierError> {
        let mut dropped = None;
        let mut drafted_by = None;
        let mut drafting = None;
        let tree = if !self.wants_tree() {
            root_only(root, self.bounds.vocab)?
        } else {
            let (tree, through) = match answer.unwrap_or(Answer::Late) {
                Answer::Late => (root_only(root, self.bounds.vocab)?, self.step),
                Answer::Lost(why) => {
                    dropped = Some(format!("draft stream lost: {why}"));
                    (root_only(root, self.bounds.vocab)?, self.step)
                }
                Answer::Refused(why) if self.reattached => {
                    dropped = Some(format!("the re-attached drafter refused: {why}"));
                    (root_only(root, self.bounds.vocab)?, self.step)
                }
                Answer::Refused(why) => return Err(VerifierError::DrafterRefused(why)),
                Answer::Invalid(why) => {
                    dropped = Some(why);
                    (root_only(root, self.bounds.vocab)?, self.step)
                }
                Answer::Tree(drafted) => {
                    let (ahead, by) = (drafted.drafted_ahead, drafted.drafted_by);
                    let took = drafted.drafting;
                    match self.accept(drafted, root, room) {
                        Ok(planned) => {
                            self.drafted_ahead = ahead;
                            drafted_by = by;
                            drafting = took;
                            planned
                        }
                        Err(why) => {
                            dropped = Some(why);
                            (root_only(root, self.bounds.vocab)?, self.step)
                        }
                    }
                }
            };
            if dropped.is_some() {
                self.drafter_lost();
            } else {
                let mut report = Report::new(self.step, through);
                report.waited(self.wait_us);
                self.report = Some(report);
            }
            tree
        };
        Ok(Planned {
            tree,
            top_k: if self.drafting {
                self.bounds.recycle_top_k
            } else {
                0
            },
            dropped,
            drafted_by,
            drafting,
        })
    }

    /// The limits a drafter's tree must keep (the wire edge checks them).
    pub fn tree_limits(&self) -> TreeLimits {
        let b = self.bounds;
        TreeLimits::new(b.max_draft + 1, b.max_depth, b.vocab)
    }

    /// The drafter's tree for this step, fitted to `room`, with the last
    /// step it stands for; `Err`: why the drafter is dropped.
    fn accept(&self, drafted: Drafted, root: u32, room: usize) -> Result<(TokenTree, u64), String> {
        let b = self.bounds;
        let Some(tree) = drafted.tree else {
            // "Nothing drafted", possibly sent ahead of the last outcome:
            // its root is not known to the drafter yet, so it is not
            // checked. A span that started before this step (its tree came
            // late) covers the rest of it.
            let through = drafted.last.max(self.step);
            let tree = root_only(root, b.vocab).map_err(|e| e.to_string())?;
            return Ok((tree, through));
        };
        if tree.root_token() != root {
            return Err(format!(
                "the drafter's tree has root {}, the session's is {root}",
                tree.root_token()
            ));
        }
        let fit = TreeLimits::new(b.max_draft.min(room) + 1, b.max_depth, b.vocab);
        if tree.len() > fit.max_nodes {
            // Near the end of the context: keep the best part that fits.
            let fitted = merge(&[&tree], fit).map_err(|e| format!("fitting the tree: {e}"))?;
            return Ok((fitted, self.step));
        }
        Ok((tree, self.step))
    }

    /// Records the verification of the planned tree (`grant.offered`
    /// drafted nodes, of which the planner verified `step.drafted`, in a
    /// forward of `batch_size` sessions) and moves to the next step.
    pub fn verified(&mut self, step: &Step, grant: StepGrant, batch_size: usize) -> Verified {
        let finished = step.finish.is_some();
        let committed = Committed {
            step: self.step,
            tokens: step.committed.clone(),
            drafted: step.drafted as u32,
            accepted: step.accepted as u32,
            finished,
            eos: step.finish == Some(Finish::Eos),
            tree_wait_us: std::mem::take(&mut self.wait_us),
            drafted_ahead: std::mem::take(&mut self.drafted_ahead),
            forced: step.forced as u32,
            logprobs: step.logprobs.clone(),
        };
        let mut outcome = None;
        if !finished && let Some(r) = self.report.as_mut() {
            r.add(step, grant.offered, grant.granted, grant.node_budget);
            r.forward(grant.forward_us, grant.tree_deadline_us);
            if r.is_complete() {
                let r = self.report.take().expect("just added to");
                outcome = Some(r.into_outcome(batch_size));
            }
        }
        self.step += 1;
        Verified {
            committed,
            outcome,
            finished,
        }
    }
}

/// The root alone: plain decoding.
pub fn root_only(root: u32, vocab: u32) -> Result<TokenTree, VerifierError> {
    TokenTree::root_only(root, TreeLimits::new(1, 0, vocab))
        .map_err(|e| VerifierError::Internal(format!("the root alone: {e}")))
}

#[cfg(test)]
mod tests;
