//! Drafting ahead: the draft model drafts the next tree while the verifier
//! verifies the last one.
//!
//! A draft model's tree levels cost a forward each, and without this the
//! verifier waits for all of them at every step. So once a model tree is
//! sent and the policy has already decided that the next step drafts with
//! the model too (the decision taken ahead, see the parent module), the
//! session guesses the outcome: the tree's most likely full path
//! ([`best_path`]) accepted, then one more token of the target's own. It
//! drafts one tree from the context plus that path, one level deeper than
//! the plan allows: its root's children are the guessed next tokens, and
//! the tree under each is a candidate for the next step.
//!
//! ```text
//!   tree{s} sent ─► draft_ahead: context + best path ─► guess
//!   outcome{s}: committed = best path + b ─► hit: the subtree under b is tree{s+1}
//!   outcome{s}: anything else             ─► miss: tree{s+1} drafted as usual
//! ```
//!
//! A hit is sent as soon as the outcome is applied; a miss costs what the
//! guess's level under way when the outcome came still had to run: a guess
//! gets only the levels that fit before its outcome, and stops at its next
//! level once an outcome it cannot hold for is here (`super::deadline`). The guess runs on the
//! drafter's cores, so it pays where those are not the verifier's (a
//! drafter pod, or `--cpus`). The draft model's cache follows whatever was
//! drafted last and goes back to the committed tokens by their common
//! prefix on the next propose, so a miss leaves nothing wrong behind.
//!
//! Sampling stays lossless: the subtree's children were drawn from the
//! draft model's distribution given the committed tokens above them (the
//! guess held, so its context is the real one), and each keeps that
//! distribution.

use std::time::{Duration, Instant};

use specmesh_draft::{Budget, DraftContext, TokenTree};

use super::ledger::Awaited;
use super::report::best_path;
use super::{DraftSession, Plan};

/// Nodes the guess may draft beyond the next tree's budget: its root's
/// children (the guessed next tokens) are not part of any next tree, and a
/// second guessed token needs room of its own.
const EXTRA_NODES: usize = 4;

/// Weight of a new outcome in the hit rate's moving average.
const HIT_EMA: f64 = 0.2;

/// The hit rate assumed before any guess was settled: a draft model of the
/// target's family has its whole best path accepted at about half of its
/// speculative steps (Qwen2.5-Coder-0.5B for the 1.5B on code,
/// `best_path_hits` in the drafter's session lines), and a guess holds when
/// that happens and the target's own token is one of the guessed ones.
pub(super) const PRIOR_HIT_RATE: f64 = 0.5;

/// A guess at the next step's tree; see the module docs.
#[derive(Debug)]
pub(super) struct Guess {
    /// The context's length when the guess was drafted.
    pub(super) base: usize,
    /// The tokens it assumed committed next, before the target's own: the
    /// awaited tree's best path below its root.
    pub(super) assumed: Vec<u32>,
    /// Drafted from the context plus `assumed`: its root is the last
    /// assumed token, its root's children the guessed next tokens.
    pub(super) tree: TokenTree,
    /// The plan the next tree is for (the decision taken ahead).
    pub(super) plan: Plan,
}

/// The session's drafting ahead; see the module docs.
#[derive(Debug, Default)]
pub(super) struct Guesses {
    /// Draft model trees are drafted ahead.
    pub(super) on: bool,
    /// The guess drafted ahead, until the outcome it guessed arrives.
    pub(super) pending: Option<Guess>,
    /// A guess that held: the next tree, for the plan it was drafted for.
    pub(super) ready: Option<(Plan, TokenTree)>,
    /// Moving average of the guesses that held.
    pub(super) hit_rate: f64,
    /// The guess's context (reused: no allocation per step).
    pub(super) context: Vec<u32>,
    pub(super) stats: GuessStats,
    /// `stats.secs` as last reported on a tree.
    pub(super) reported_secs: f64,
}

impl Guesses {
    /// The time spent drafting guesses since the last tree reported it
    /// (`TokenTree.ahead_micros`), now reported.
    pub(super) fn unreported_time(&mut self) -> Duration {
        let secs = (self.stats.secs - self.reported_secs).max(0.0);
        self.reported_secs = self.stats.secs;
        Duration::from_secs_f64(secs)
    }
}

/// Drafting ahead's counters, for the session's closing line.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GuessStats {
    /// Guesses drafted.
    pub drafted: u64,
    /// Guesses that held: their tree was sent.
    pub hits: u64,
    /// Seconds spent drafting guesses.
    pub secs: f64,
    /// Guesses stopped at their next level by an outcome they could not
    /// hold for.
    pub cancelled: u64,
    /// Steps that would have drafted ahead but where no useful guess fits
    /// before the outcome (see `deadline`).
    pub skipped: u64,
    /// Deepest guess drafted.
    pub max_depth: usize,
}

impl GuessStats {
    /// Guesses that held, of those drafted (0 before any).
    pub fn hit_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.hits as f64 / self.drafted as f64
        }
    }
}

impl DraftSession {
    /// Whether to draft ahead now: a model tree with nodes awaits its
    /// outcome, the next step will draft with the model, and a guess fits
    /// before the outcome arrives.
    pub fn wants_ahead(&self) -> bool {
        self.could_guess() && self.guess_depth() != Some(0)
    }

    /// [`Self::wants_ahead`] but for the time a guess has.
    fn could_guess(&self) -> bool {
        let tree_out = matches!(
            &self.ledger.awaited,
            Some(Awaited::Tree { tree, arm, .. }) if tree.len() > 1 && arm.uses_model()
        );
        let model_next = self
            .ledger
            .kept
            .is_some_and(|p| p.arm.uses_model() && !p.budget.is_off());
        self.guesses.on
            && self.drafter.has_model()
            && self.guesses.pending.is_none()
            && tree_out
            && model_next
    }

    /// The depth the next guess may have: what the plan wants (one level
    /// more than its tree: the guessed next token), cut to what fits before
    /// the outcome; `None` while no plan is kept.
    fn guess_depth(&self) -> Option<usize> {
        let wanted = self.ledger.kept?.budget.max_depth + 1;
        Some(
            self.clock
                .live
                .guess_depth(self.clock.forward_secs, wanted)
                .unwrap_or(wanted),
        )
    }

    /// The tokens a guess drafted now assumes committed before the target's
    /// own: the awaited model tree's best path below its root.
    pub fn guess_assumes(&self) -> Option<Vec<u32>> {
        let Some(Awaited::Tree { tree, .. }) = &self.ledger.awaited else {
            return None;
        };
        Some(
            best_path(tree)[1..]
                .iter()
                .map(|&n| tree.token(n))
                .collect(),
        )
    }

    /// The handle that stops a guess between its levels, for the task that
    /// waits for the outcome (`None` without a draft model).
    pub fn ahead_cancel(&self) -> Option<specmesh_draft_model::Cancel> {
        self.drafter.model_cancel()
    }

    /// Counts a step that wanted a guess but had no time for one.
    pub fn note_no_time_to_guess(&mut self) {
        if self.could_guess() && self.guess_depth() == Some(0) {
            self.guesses.stats.skipped += 1;
        }
    }

    /// Drafts the guess (runs the draft model: call it off the async
    /// workers); does nothing unless [`Self::wants_ahead`].
    pub fn draft_ahead(&mut self) {
        if !self.wants_ahead() {
            return;
        }
        let (Some(assumed), Some(plan)) = (self.guess_assumes(), self.ledger.kept) else {
            return;
        };
        let base = self.context.len();
        let mut tokens = std::mem::take(&mut self.guesses.context);
        tokens.clear();
        tokens.extend_from_slice(&self.context);
        tokens.extend_from_slice(&assumed);
        let depth = self.guess_depth().unwrap_or(plan.budget.max_depth + 1);
        let budget = Budget {
            max_nodes: plan.budget.max_nodes + EXTRA_NODES,
            max_depth: depth,
        };
        self.guesses.stats.max_depth = self.guesses.stats.max_depth.max(depth);
        let ctx = DraftContext {
            tokens: &tokens,
            prompt_len: self.terms.prompt_len,
            limits: budget.limits(self.terms.vocab),
        };
        let t0 = Instant::now();
        let before = self.drafter.model_stats().cancelled;
        let drafted = self.drafter.propose_model(&ctx);
        self.guesses.stats.secs += t0.elapsed().as_secs_f64();
        self.guesses.stats.cancelled += self.drafter.model_stats().cancelled - before;
        self.guesses.stats.drafted += 1;
        self.guesses.context = tokens;
        if let Some(tree) = drafted.filter(|t| t.len() > 1) {
            self.guesses.pending = Some(Guess {
                base,
                assumed,
                tree,
                plan,
            });
        }
    }

    /// After an outcome is applied: whether the guess held. A guess that
    /// held becomes the next tree, ready to send; any other is dropped.
    pub(super) fn settle_guess(&mut self) {
        let Some(g) = self.guesses.pending.take() else {
            return;
        };
        let n = g.base + g.assumed.len();
        let held = self.context.len() == n + 1 && self.context[g.base..n] == g.assumed[..];
        let next = held
            .then(|| g.tree.child_with(0, self.context[n]))
            .flatten()
            .and_then(|child| {
                g.tree
                    .subtree(child, g.plan.budget.limits(self.terms.vocab))
                    .ok()
            })
            .filter(|t| t.len() > 1);
        let hit = next.is_some();
        self.guesses.hit_rate += HIT_EMA * (f64::from(u8::from(hit)) - self.guesses.hit_rate);
        self.guesses.ready = next.map(|tree| (g.plan, tree));
    }

    /// The tree the guess held for `plan`, if it did.
    pub(super) fn take_ready(&mut self, plan: &Plan) -> Option<TokenTree> {
        let (for_plan, tree) = self.guesses.ready.take()?;
        (for_plan.arm == plan.arm && for_plan.budget == plan.budget).then_some(tree)
    }

    /// Whether the tree due for `plan` is a guess that held (nothing to
    /// draft).
    pub(super) fn has_ready(&self, plan: &Plan) -> bool {
        self.guesses
            .ready
            .as_ref()
            .is_some_and(|(p, _)| p.arm == plan.arm && p.budget == plan.budget)
    }

    /// The share of a model tree's drafting the verifier still sees: what
    /// the guesses that held did not hide.
    pub(super) fn exposed_drafting(&self) -> f64 {
        if self.guesses.on {
            1.0 - self.guesses.hit_rate
        } else {
            1.0
        }
    }

    /// Drafting ahead's counters.
    pub fn guess_stats(&self) -> GuessStats {
        self.guesses.stats
    }
}
