//! The batcher's goodput planning (see `specmesh_planner`): before each
//! batched forward, which drafted nodes of each session's tree to verify;
//! after it, what the step taught the step-time model, the score
//! calibrations and each session's node-budget forecast.
//!
//! Each session carries its own [`SessionPlanning`] between steps (it
//! travels with the session's step job, as the KV cache does), so nothing
//! here outlives a session. What sessions share lives here: the step-time
//! model, and one score table per kind of drafting (`auto`, `model-free`,
//! `draft-model`, `combined`), every new session's prior, with what the
//! granted nodes' estimates missed by per depth (`specmesh_planner::correct`).
//!
//! A tree is calibrated by the kind that drafted it, which the drafter
//! names (`TokenTree.drafted_by`) when it chooses per step, as for `auto`
//! sessions: a suffix drafter's scores and a draft model's mean different
//! things, and one table taught by both misjudges both (a session that
//! left the draft model kept being granted less for its model-free trees).
//! A session keeps its own calibration per kind too.

use std::time::Instant;

use specmesh_planner::{
    Calibration, Contention, DepthCorrection, Forecast, Offer, Overhead, Planner, ScoreTable,
    StepModel,
};
use specmesh_tree::Sources;
use specmesh_tree::TokenTree;

use crate::drafting::{DraftingLog, Forward, Overlaps};

/// What a session carries for the planner from step to step.
#[derive(Debug, Clone)]
pub struct SessionPlanning {
    /// Its own calibration per kind of drafting.
    calibrations: [Calibration; KINDS],
    forecast: Forecast,
    /// Index of its kind of drafting in the shared tables.
    kind: usize,
    /// Index of the kind that drafted this step's tree.
    drafted_by: usize,
    /// Expected accepted tokens of its granted nodes per step it brought
    /// a tree (moving average).
    gain: f64,
    /// Whether that gain pays for what its speculating costs the batch
    /// (see `specmesh_planner::overhead` and `::contention`).
    pays: bool,
    /// Seconds its drafter computes per tree (moving average).
    drafting: f64,
}

impl SessionPlanning {
    /// A session drafting from `sources`, at most `max_draft` nodes a tree.
    pub fn new(sources: Sources, max_draft: usize) -> SessionPlanning {
        let kind = kind(sources);
        SessionPlanning {
            calibrations: Default::default(),
            forecast: Forecast::new(max_draft),
            kind,
            drafted_by: kind,
            gain: 1.0,
            pays: true,
            drafting: 0.0,
        }
    }

    /// This step's tree was drafted by `by` (`None`: by the session's own
    /// sources), its drafter computing `seconds` for it (`None`: not
    /// measured, as from an older drafter).
    pub fn drafted(&mut self, by: Option<Sources>, seconds: Option<f64>) {
        self.drafted_by = by.map_or(self.kind, kind);
        if let Some(s) = seconds.filter(|s| s.is_finite() && *s >= 0.0) {
            self.drafting += 0.2 * (s - self.drafting);
        }
    }

    /// The session's calibration of this step's tree, and the shared
    /// table of its kind, from `shared`.
    fn calibration<'a>(
        &'a mut self,
        shared: &'a mut [ScoreTable; KINDS],
    ) -> (&'a mut Calibration, &'a mut ScoreTable) {
        (
            &mut self.calibrations[self.drafted_by],
            &mut shared[self.drafted_by],
        )
    }

    /// Drafted nodes the planner expects to grant the session next step:
    /// none while its speculating does not pay for itself.
    pub fn node_budget(&self) -> usize {
        if self.pays { self.forecast.budget() } else { 0 }
    }
}

/// Kinds of drafting, each calibrated apart.
const KINDS: usize = 4;

/// The index of a kind of drafting in the tables.
fn kind(sources: Sources) -> usize {
    match sources {
        Sources::Auto => 0,
        Sources::ModelFree => 1,
        Sources::DraftModel => 2,
        Sources::Combined => 3,
    }
}

/// What the planner did to one session's tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Granted {
    /// Drafted nodes the drafter proposed.
    pub offered: usize,
    /// Expected accepted tokens of the granted nodes.
    pub expected: f64,
    /// When only part of the tree is verified: the original index of each
    /// verified node, the root first (`kept[pruned index] = original`).
    pub kept: Option<Vec<usize>>,
}

impl Granted {
    /// An original tree index for a verified (pruned) one.
    pub fn original(&self, node: usize) -> usize {
        self.kept.as_ref().map_or(node, |k| k[node])
    }

    /// The verified drafted nodes as the drafter's indices, ascending (the
    /// outcome's `granted`), when the tree was pruned.
    pub fn granted_wire(&self) -> Option<Vec<u32>> {
        self.kept
            .as_ref()
            .map(|k| k[1..].iter().map(|&i| i as u32).collect())
    }
}

/// One batch's plan, for metrics and the trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchPlan {
    pub grants: Vec<Granted>,
    /// Tokens in the forward.
    pub tokens: usize,
    pub proposed: usize,
    pub granted: usize,
    /// Expected accepted drafted tokens.
    pub expected: f64,
    /// Predicted seconds of the step (forward and fixed part).
    pub predicted_seconds: f64,
}

/// Batch-size classes of the step-time models: 1, 2, 3–4, 5–8, 9 and more
/// sessions.
const CLASSES: usize = 5;

fn class(sessions: usize) -> usize {
    match sessions {
        0 | 1 => 0,
        2 => 1,
        3 | 4 => 2,
        5..=8 => 3,
        _ => 4,
    }
}

#[derive(Debug)]
pub struct Goodput {
    enabled: bool,
    max_tokens: usize,
    /// One step-time model per batch-size class ([`class`]): a forward
    /// over two sessions' roots costs more than one session's root and a
    /// node (two contexts to attend over, two sequences' bookkeeping), so
    /// forwards of different batch sizes teach different models.
    models: Vec<StepModel>,
    shared: [ScoreTable; KINDS],
    /// Per kind of drafting, what granted nodes' estimates missed by.
    corrections: [DepthCorrection; KINDS],
    planner: Planner,
    /// Per batch slot, reused.
    estimates: Vec<Vec<f64>>,
    /// A verified tree's estimates, when learning (reused).
    learnt: Vec<f64>,
    overhead: Overhead,
    /// What drafting on these cores costs the forwards, and the forwards
    /// waiting for the drafting that overlapped them.
    contention: Contention,
    overlaps: Overlaps,
    /// Predicted committed tokens per second of the batches planned
    /// (moving average): what a session's overhead is priced at.
    goodput: f64,
}

impl Goodput {
    /// `enabled: false` verifies every tree whole (still timing steps).
    pub fn new(enabled: bool, max_tokens: usize, model: StepModel) -> Goodput {
        Goodput {
            enabled,
            max_tokens,
            models: vec![model; CLASSES],
            shared: [ScoreTable::default(); KINDS],
            corrections: [DepthCorrection::default(); KINDS],
            planner: Planner::default(),
            estimates: Vec::new(),
            learnt: Vec::new(),
            overhead: Overhead::default(),
            contention: Contention::default(),
            overlaps: Overlaps::default(),
            goodput: 0.0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Plans one forward over `trees` (one per session, `sessions` alike),
    /// pruning each tree in place to what it is granted.
    pub fn plan(
        &mut self,
        trees: &mut [&mut TokenTree],
        sessions: &[&SessionPlanning],
        extra: usize,
    ) -> BatchPlan {
        let n = trees.len();
        let mut out = BatchPlan {
            tokens: extra + trees.iter().map(|t| t.len()).sum::<usize>(),
            proposed: trees.iter().map(|t| t.draft_len()).sum(),
            ..BatchPlan::default()
        };
        out.grants = trees
            .iter()
            .map(|t| Granted {
                offered: t.draft_len(),
                expected: 0.0,
                kept: None,
            })
            .collect();
        if !self.enabled || out.proposed == 0 {
            out.granted = out.proposed;
            out.predicted_seconds = self.models[class(n)].step(out.tokens);
            return out;
        }
        if self.estimates.len() < n {
            self.estimates.resize_with(n, Vec::new);
        }
        for ((t, s), e) in trees.iter().zip(sessions).zip(&mut self.estimates) {
            let k = s.drafted_by;
            s.calibrations[k].estimates(&self.shared[k], t, e);
            self.corrections[k].apply(t, e);
        }
        let offers: Vec<Offer<'_>> = trees
            .iter()
            .zip(&self.estimates)
            .map(|(t, e)| Offer {
                tree: t,
                estimates: e,
                whole: t.has_draft_dists(),
            })
            .collect();
        let model = &self.models[class(n)];
        let plan = match self.planner.plan(&offers, model, extra, self.max_tokens) {
            Ok(plan) => plan,
            Err(e) => {
                // Estimates are built here for these very trees: a mismatch
                // is a bug; verify everything rather than fail the batch.
                tracing::error!(error = %e, "goodput planner: verifying every tree whole");
                out.granted = out.proposed;
                out.predicted_seconds = model.step(out.tokens);
                return out;
            }
        };
        drop(offers);
        for ((t, g), grant) in trees.iter_mut().zip(&plan.grants).zip(&mut out.grants) {
            grant.expected = g.expected;
            if g.is_whole() {
                continue;
            }
            match t.retain(&g.keep) {
                Ok((pruned, kept)) => {
                    **t = pruned;
                    grant.kept = Some(kept);
                }
                Err(e) => {
                    tracing::error!(error = %e, "goodput planner: a grant that is no subtree")
                }
            }
        }
        out.tokens = extra + trees.iter().map(|t| t.len()).sum::<usize>();
        out.granted = trees.iter().map(|t| t.draft_len()).sum();
        out.expected = plan.expected_tokens - n as f64;
        out.predicted_seconds = plan.seconds;
        self.goodput += 0.1 * (plan.goodput() - self.goodput);
        out
    }

    /// The target verified `tree` (as `grant` pruned it) for a session,
    /// accepting `path` (in `tree`'s indices).
    pub fn learn(
        &mut self,
        session: &mut SessionPlanning,
        tree: &TokenTree,
        path: &[usize],
        grant: &Granted,
    ) {
        if grant.offered == 0 {
            return;
        }
        let k = session.drafted_by;
        let (own, shared) = session.calibration(&mut self.shared);
        own.estimates(shared, tree, &mut self.learnt);
        self.corrections[k].observe(tree, &self.learnt, path);
        own.observe(shared, tree, path);
        session.forecast.observe(grant.offered, tree.draft_len());
        session.gain += 0.2 * (grant.expected - session.gain);
        let drafting = self.contention.price(session.drafting);
        session.pays = self.overhead.pays(session.gain, drafting, self.goodput);
    }

    /// A forward over `tokens` tokens of `sessions` sessions ran from
    /// `start` for `seconds`: learnt once the drafting that overlapped it
    /// is known ([`Goodput::settle`]).
    pub fn forward_done(&mut self, sessions: usize, tokens: usize, start: Instant, seconds: f64) {
        let end = start + std::time::Duration::from_secs_f64(seconds.max(0.0));
        self.overlaps.forward(Forward {
            start,
            end,
            sessions,
            tokens,
            seconds,
        });
    }

    /// Learns the forwards whose overlapping drafting is known by `now`
    /// from `log`: what drafting during them cost (the contention), and
    /// their time without it (the step-time models).
    pub fn settle(&mut self, log: &DraftingLog, now: Instant) {
        let (models, contention) = (&mut self.models, &mut self.contention);
        let logged = self.overlaps.settle(log, now, |f, overlap| {
            let model = &mut models[class(f.sessions)];
            contention.observe(overlap, f.seconds - model.forward(f.tokens));
            let alone = f.seconds - contention.slowdown() * overlap;
            model.observe(f.tokens, alone.max(0.5 * f.seconds));
        });
        self.contention.drafted(logged);
    }

    /// A step in which `speculating` sessions brought trees spent
    /// `seconds` outside its forward.
    pub fn observe_gap(&mut self, speculating: usize, seconds: f64) {
        for m in &mut self.models {
            m.observe_fixed(seconds);
        }
        self.overhead.observe(speculating, seconds);
    }

    /// Seconds one more speculating session adds to a step.
    pub fn overhead_per_session(&self) -> f64 {
        self.overhead.per_session()
    }

    /// Writes the step-time model and the overhead into `m`'s gauges.
    pub fn export(&self, m: &crate::batch_metrics::BatchMetrics) {
        for (model, sessions) in self.models.iter().zip(["1", "2", "4", "8", "16"]) {
            for (tokens, secs) in model.points() {
                m.model_forward
                    .with_label_values(&[sessions, &tokens.to_string()])
                    .set(secs);
            }
        }
        m.model_fixed.set(self.models[0].fixed());
        m.overhead_per_session.set(self.overhead_per_session());
        m.drafting_slowdown.set(self.contention.slowdown());
        m.drafting_overlap.set(self.contention.overlapped_share());
    }
}

#[cfg(test)]
mod tests;
