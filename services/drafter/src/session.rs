//! One draft stream's state machine: the session's drafter, its adaptive
//! policy, its context and what it awaits the outcome of.
//!
//! ```text
//!   start ──► plan(1) ─► draft ─► tree step 0
//!   outcome{step 0} ──► apply ─► plan(batch) ─► draft ─► tree step 1
//!   outcome{step 1} ──► apply ─► …
//! ```
//!
//! Every step gets a tree, root-only when the budget is zero, so the
//! verifier never waits on a step the drafter chose not to speculate.
//! Outcomes arrive in order on one stream and report every step once, so
//! the only outcome that can be applied is one that reports the next
//! unreported step:
//!
//! - an outcome for an **earlier** step is stale or duplicated (a verifier
//!   retrying a send): it is ignored and answered with nothing, since the
//!   tree for the following step has already been sent;
//! - an outcome for a **later** step, or whose `span` starts after the next
//!   unreported step, means outcomes were lost and the drafter's context no
//!   longer matches the verifier's; one whose `span` starts before it
//!   reports steps twice. Either ends the stream with INVALID_ARGUMENT so
//!   the verifier can reopen it from a fresh start.
//!
//! **Pipelining.** When the policy has already decided not to speculate at
//! the step after the last tree sent, there is nothing to wait for: the
//! session sends a tree with no nodes for that step at once, ahead of the
//! outcome it follows, and the verifier finds it waiting (its root is
//! ignored). The policy decides the whole run of steps it will not
//! speculate at (up to its next probe, at most [`MAX_TREE_SPAN`]) at once,
//! and the one tree stands for all of them (its `span`): the verifier
//! verifies the root alone at each, without a message either way, and
//! reports them in one outcome after the last. A decision to draft is kept
//! and used when the outcome it waits for arrives.
//!
//! ```text
//!   tree{s} ─► plan_ahead: off for n steps ─► tree{s+1, span n}
//!   outcome{s} ──► apply: Ahead ─► plan_ahead: probe at s+n+1, kept
//!   outcome{s+n, span n} ──► apply: Next ─► draft ─► tree{s+n+1} ─► plan_ahead …
//! ```
//!
//! A verifier that reaches a span's tree late has verified its first steps
//! on its own and reported them one by one; it reports the rest in one
//! outcome. So the session awaits the outcomes of steps `next..=last` and
//! applies any piece that starts exactly at `next`.
//!
//! **Its parts.** The session owns a few parts, each in its file with its
//! methods: what the start fixed ([`Terms`]); the [`StepLedger`]
//! (`ledger.rs`: which steps were sent, which outcome is due, the empty
//! trees **sent ahead** for the steps above, the decision kept for the
//! next); the [`Clock`] (`clock.rs`: what steps and draft model forwards
//! took, `deadline.rs`: what that leaves a tree); and the [`Guesses`]
//! (`guess.rs`: a draft model's next tree **drafted ahead** on a guessed
//! outcome). Applying an outcome (`apply.rs`) and planning the next tree
//! (`plan.rs`, `pricing.rs`) read them together.
//!
//! The session is plain data with synchronous methods so it can move onto
//! a blocking thread for a model-drafter propose and back.

mod apply;
mod clock;
mod deadline;
mod guess;
mod ledger;
mod plan;
mod pricing;
mod report;

use std::time::{Duration, Instant};

use specmesh_draft::{Arm, Arms, Budget, DraftContext, PolicyConfig, TenantKey, TokenTree};

use clock::Clock;
use guess::Guesses;
use ledger::StepLedger;
pub use report::Reported;

use crate::drafters::SessionDrafter;
use crate::error::DrafterError;
use crate::validate::StartSpec;
use crate::validate::{Computed, SentTree};

/// What [`DraftSession::apply`] made of an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Stale or duplicated: nothing changed, nothing to send.
    Ignored,
    /// Applied; more steps of the same span are to be reported, nothing to
    /// send.
    Within(Reported),
    /// Applied; the tree for the next step is due, planned for `batch`.
    Next { batch: usize, reported: Reported },
    /// Applied; the next steps' tree was sent ahead ("nothing drafted").
    Ahead { batch: usize, reported: Reported },
}

impl Applied {
    /// What the outcome reported, unless it was ignored.
    pub fn reported(&self) -> Option<&Reported> {
        match self {
            Applied::Ignored => None,
            Applied::Within(r) | Applied::Next { reported: r, .. } => Some(r),
            Applied::Ahead { reported: r, .. } => Some(r),
        }
    }
}

/// The budget of one tree, decided before drafting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The step the tree is for.
    pub step: u64,
    /// What drafts it.
    pub arm: Arm,
    pub budget: Budget,
}

/// A tree ready to send.
#[derive(Debug, Clone)]
pub struct Drafted {
    pub tree: SentTree,
    /// Drafted nodes, root excluded.
    pub nodes: usize,
    /// Time spent in the drafter's `propose`.
    pub took: Duration,
    /// Set when the draft model drafted through text.
    pub retokenized: Option<Retokenized>,
}

/// What drafting through text cost a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retokenized {
    /// Mapping the context and the draft between the vocabularies.
    pub took: Duration,
    /// Target tokens dropped where the draft's text ended inside one.
    pub lost: u64,
}

/// The acceptance a draft model's arm assumes before it has drafted: a
/// smaller model of the target's family agrees with it most of the time
/// (Qwen2.5-Coder-0.5B drafting greedily for the 1.5B: 93–100% of its
/// drafted tokens accepted on code, docs/lab/drafting.md). The model-free drafters' prior of 0.5 made
/// the first step decline the model and leave it off for a whole probe
/// interval.
const MODEL_PRIOR_ACCEPT: f64 = 0.8;

/// A session's drafting state; see the module docs. Its parts each keep
/// one job: [`Terms`] what the start fixed, [`StepLedger`] which steps
/// were sent and which outcome is due, [`Clock`] what steps and draft
/// model forwards took, [`Guesses`] the trees drafted ahead of their
/// outcome.
#[derive(Debug)]
pub struct DraftSession {
    terms: Terms,
    drafter: SessionDrafter,
    arms: Arms,
    /// Drafted nodes the verifier expects to grant the next tree (its
    /// goodput planner's forecast, from the last outcome); `None` while the
    /// verifier sends none.
    node_budget: Option<usize>,
    /// Prompt then committed output; the last token is the next root.
    context: Vec<u32>,
    ledger: StepLedger,
    clock: Clock,
    guesses: Guesses,
}

/// What the session's start fixed.
#[derive(Debug)]
struct Terms {
    epoch: u64,
    tenant: TenantKey,
    vocab: u32,
    prompt_len: usize,
    /// The request's output limit past `prompt_len`, if the verifier said.
    max_new_tokens: Option<usize>,
    max_context: usize,
    max_draft_tokens: usize,
    max_depth: usize,
    /// The verifier's batch as the session started: step 0's plan.
    first_batch: usize,
}

impl DraftSession {
    /// A session for `spec`; contexts may grow to `max_context` tokens.
    pub fn new(
        spec: StartSpec,
        drafter: SessionDrafter,
        max_context: usize,
        pipeline: bool,
    ) -> Result<DraftSession, DrafterError> {
        let config = PolicyConfig {
            max_nodes: spec.max_draft_tokens + 1,
            max_depth: spec.max_depth,
            ..PolicyConfig::default()
        };
        let mut arms = Arms::new(drafter.arms(), spec.curve, config)
            .map_err(|e| DrafterError::Internal(format!("policy config: {e}")))?;
        for &arm in drafter.arms() {
            if let Some(p) = arms.policy_mut(arm).filter(|_| arm.uses_model()) {
                p.stats_mut().set_prior(MODEL_PRIOR_ACCEPT);
                p.set_extra_levels(drafter.extra_levels());
            }
        }
        let forward_secs = drafter.forward_secs();
        if let Some(secs) = spec.target.step_seconds {
            for &arm in drafter.arms() {
                if let Some(p) = arms.policy_mut(arm) {
                    p.timing_mut().declare_plain(secs);
                    if let Some(f) = forward_secs.filter(|_| arm.uses_model()) {
                        p.set_level_cost(f / secs);
                    }
                }
            }
        }
        Ok(DraftSession {
            terms: Terms {
                epoch: spec.epoch,
                tenant: spec.tenant,
                vocab: spec.vocab,
                prompt_len: spec.prompt_len,
                max_new_tokens: spec.max_new_tokens,
                max_context,
                max_draft_tokens: spec.max_draft_tokens,
                max_depth: spec.max_depth,
                first_batch: spec.batch_size,
            },
            drafter,
            node_budget: None,
            arms,
            context: spec.tokens,
            ledger: StepLedger::starting(spec.first_step, pipeline),
            clock: Clock::starting(forward_secs, spec.target.step_seconds),
            guesses: Guesses::default(),
        })
    }

    /// Drafts the draft model's trees ahead of their outcome (see
    /// [`guess`]).
    pub fn with_draft_ahead(mut self, on: bool) -> DraftSession {
        self.guesses.on = on;
        if on {
            self.guesses.hit_rate = guess::PRIOR_HIT_RATE;
            self.price_levels();
        }
        self
    }

    /// The measured extra cost of a speculative step beyond its forward, in
    /// plain steps (see [`Self::record_step_time`]).
    pub fn step_overhead(&self) -> f64 {
        self.arms
            .arms()
            .filter_map(|a| self.arms.policy(a))
            .map(|p| p.timing().overhead())
            .fold(0.0, f64::max)
    }

    /// Steps each arm drafted, for the session's closing line.
    pub fn arm_steps(&self) -> Vec<(&'static str, u64)> {
        self.arms
            .arms()
            .map(|a| (a.name(), self.arms.used(a)))
            .collect()
    }

    /// Seconds of one draft model forward, once measured.
    pub fn draft_forward_secs(&self) -> Option<f64> {
        self.clock.forward_secs
    }

    /// Times the outcome just applied, arrived at `now`: the time since the
    /// previous outcome is what its steps cost this session (drafting,
    /// round trip and verification included), which teaches the policy the
    /// overhead of speculating (`specmesh_draft::StepTiming`). The first
    /// outcome only starts the clock: its time includes the prefill.
    pub fn record_step_time(&mut self, now: Instant) {
        let Some((u, since)) = self.clock.settle(now) else {
            return;
        };
        // The drafting is priced per level (below), not as overhead.
        let secs = since - u.draft_secs;
        for &arm in self.drafter.arms() {
            // Plain steps are every arm's unit; a speculative step teaches
            // the arm that drafted it.
            if u.drafted > 0 && arm != u.arm {
                continue;
            }
            if let Some(p) = self.arms.policy_mut(arm) {
                p.observe_step_time(u.drafted, u.batch, u.steps, secs.max(0.0));
            }
        }
        self.price_levels();
    }

    /// Whether drafting under `plan` may run a model forward (milliseconds:
    /// run it off the async workers).
    pub fn blocks(&self, plan: &Plan) -> bool {
        self.drafter.has_model()
            && plan.arm.uses_model()
            && !plan.budget.is_off()
            && !self.has_ready(plan)
    }

    /// The verifier's batch as the session started.
    pub fn first_batch(&self) -> usize {
        self.terms.first_batch
    }

    /// Drafts the tree for `plan` and awaits its outcome.
    pub fn draft(&mut self, plan: Plan) -> Result<Drafted, DrafterError> {
        let limits = plan.budget.limits(self.terms.vocab);
        // Never empty: the start's tokens were, and the context only grows.
        let Some(&root) = self.context.last() else {
            return Err(DrafterError::Internal(
                "the session's context is empty".into(),
            ));
        };
        let ready = self.take_ready(&plan);
        let ctx = DraftContext {
            tokens: &self.context,
            prompt_len: self.terms.prompt_len,
            limits,
        };
        let before = self.drafter.model_stats();
        let t0 = Instant::now();
        let drafted_ahead = ready.is_some();
        let proposed = match ready {
            Some(tree) => {
                self.guesses.stats.hits += 1;
                self.drafter.with_model_tree(plan.arm, &ctx, tree)
            }
            None => self.drafter.propose(plan.arm, &ctx),
        };
        let took = t0.elapsed();
        let after = self.drafter.model_stats();
        self.clock.last_draft = (
            took.as_secs_f64(),
            after.forwards - before.forwards,
            after.context_tokens - before.context_tokens,
        );
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
                .map_err(|e| DrafterError::Internal(format!("root-only tree: {e}")))?
        };
        let sent = SentTree {
            epoch: self.terms.epoch,
            step: plan.step,
            span: 1,
            tree: Some(tree.clone()),
            drafted_ahead: drafted_ahead && fits,
            drafted_by: Some(plan.arm),
            computed: Computed {
                draft: took,
                ahead: self.guesses.unreported_time(),
            },
        };
        let nodes = tree.draft_len();
        self.ledger.sent(plan.step, tree, plan.arm);
        let retokenized = (after.retokenize_nanos > before.retokenize_nanos).then(|| Retokenized {
            took: Duration::from_nanos(after.retokenize_nanos - before.retokenize_nanos),
            lost: after.boundary_lost - before.boundary_lost,
        });
        Ok(Drafted {
            tree: sent,
            nodes,
            took,
            retokenized,
        })
    }

    /// The target's vocabulary size.
    pub fn vocab(&self) -> u32 {
        self.terms.vocab
    }

    pub fn tenant(&self) -> &TenantKey {
        &self.terms.tenant
    }

    /// The session's output so far: its context after the prompt.
    pub fn output(&self) -> &[u32] {
        self.context
            .get(self.terms.prompt_len..)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
