//! Choosing what to draft with, per step: the model-free drafters, a draft
//! model, or both merged.
//!
//! Each choice ([`Arm`]) keeps a [`SpecPolicy`] of its own, since their
//! acceptance differs (a draft model of the target's family agrees with it
//! most of the time; suffix lookup only where text repeats) and so does
//! their cost (model-free drafting takes microseconds, a draft model one
//! forward per tree level, priced with [`SpecPolicy::set_level_cost`]).
//! Every step goes to the arm whose best budget promises the most tokens
//! per unit of time; "off" is every arm's fallback, so choosing an arm is
//! never worse than its policy's own answer.
//!
//! Only the arm used learns from a step, so an arm that lost once would
//! never be measured again. So an arm not yet tried, or not used for
//! [`Arms::EXPLORE_INTERVAL`] steps, gets the next step, but only when it
//! could win: its [`SpecPolicy::upper_bound`] (every drafted token
//! accepted, at its known drafting cost) beats the best expected speed-up
//! of the others (an untried arm's resting on its prior), and only once
//! every arm listed before it has drafted [`Arms::MIN_EVIDENCE`] steps:
//! arms are listed cheapest first, and a draft model's first step costs
//! the prefill of the whole context, worth paying only against a measured
//! alternative, not a prior.
//!
//! Switching has a price of its own: a draft model that has not seen the
//! context yet must prefill it first ([`Arms::set_switch_cost`], in plain
//! steps). An arm is only chosen, or explored, when its advantage repays
//! that within [`Arms::HORIZON`] steps, so a long prompt (retrieval,
//! summarization) is not prefilled twice for a few tokens of gain. A draft model that costs nearly a verify step per level
//! is then never tried at all, sparing the session its prefill. A session
//! that will end sooner ([`Arms::set_tokens_left`]: its output is close to
//! the request's `max_new_tokens`) has fewer steps to repay a switch in:
//! the horizon is then the steps its tokens left take at the best arm's
//! expected tokens per step. Both rules are deterministic, like the
//! policy's own probing.
//!
//! An arm's first estimate is a guess unless earlier sessions of the
//! workload measured it ([`Arms::seed`] with the [`super::Ledger`]'s
//! [`Learned`]): then its policy starts from their acceptance and overhead,
//! and once [`Arms::LEARNED_SESSIONS`] sessions taught it, exploring it is
//! priced by that evidence rather than by the all-accepted bound: it is
//! tried only where its learned speed-up, with [`Arms::EXPLORE_MARGIN`]
//! for this session's text differing, beats the others' measured one. So
//! on a workload where the model-free drafters already win (code), a
//! draft model present costs no exploration, and where they do not, the
//! model is tried as before.

pub use specmesh_tree::Sources;

use super::{CostCurve, Decision, Learned, PolicyConfig, PolicyError, SpecPolicy};

/// The arms a session chooses among for `sources`, given whether the
/// drafter has a draft model. Empty when the request needs a model there
/// is not.
pub fn arms_for(sources: Sources, has_model: bool) -> Vec<Arm> {
    match (sources, has_model) {
        // The draft model merged with the model-free drafters. Its own
        // trees as the second arm instead were measured no better (1.5B,
        // SmolLM2 drafting ahead from a core of its own, Spec-Bench 3
        // per category: 1.31x either way; docs/lab/separate-host.md).
        (Sources::Auto, true) => vec![Arm::ModelFree, Arm::Combined],
        (Sources::Auto | Sources::ModelFree, _) => vec![Arm::ModelFree],
        (Sources::DraftModel, true) => vec![Arm::Model],
        (Sources::Combined, true) => vec![Arm::Combined],
        (Sources::DraftModel | Sources::Combined, false) => Vec::new(),
    }
}

/// One way of drafting a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arm {
    ModelFree,
    Model,
    Combined,
}

impl Arm {
    /// Whether this arm runs the draft model.
    pub fn uses_model(self) -> bool {
        !matches!(self, Arm::ModelFree)
    }

    pub fn name(self) -> &'static str {
        match self {
            Arm::ModelFree => "model-free",
            Arm::Model => "draft-model",
            Arm::Combined => "combined",
        }
    }
}

/// The arms of one session and their policies; see the module docs.
#[derive(Clone, Debug)]
pub struct Arms {
    arms: Vec<(Arm, SpecPolicy)>,
    /// Steps since each arm was last used.
    idle: Vec<u32>,
    /// Steps each arm drafted.
    used: Vec<u64>,
    /// Steps each arm decided, drafting or not.
    decided: Vec<u64>,
    /// What using each arm next costs once, in plain steps.
    switch_cost: Vec<f64>,
    /// Tokens the session may still commit; `None`: unknown.
    tokens_left: Option<usize>,
    /// Earlier sessions whose evidence seeded each arm.
    learned: Vec<u64>,
}

impl Arms {
    /// An arm unused for this many steps gets the next one.
    pub const EXPLORE_INTERVAL: u32 = 32;
    /// Steps every earlier arm decides (drafting or not) before a later
    /// one is explored.
    pub const MIN_EVIDENCE: u64 = 8;
    /// Steps within which a switch must repay its cost.
    pub const HORIZON: f64 = 64.0;
    /// Earlier sessions an arm's learned evidence must come from before
    /// it prices the arm's exploration.
    pub const LEARNED_SESSIONS: u64 = 3;
    /// How much better than its learned estimate an arm may turn out in
    /// this session: an arm within this of the best is still explored.
    pub const EXPLORE_MARGIN: f64 = 0.1;

    /// Starts `arm` from what earlier sessions of the workload learned
    /// (see the module docs).
    pub fn seed(&mut self, arm: Arm, learned: &Learned) {
        if let Some(i) = self.index(arm) {
            self.arms[i].1.seed(learned);
            self.learned[i] = learned.sessions;
        }
    }

    /// Using `arm` next costs `plain_steps` once (a draft model catching
    /// up on the context it has not seen); 0 once it has. Not a finite
    /// non-negative number: ignored.
    pub fn set_switch_cost(&mut self, arm: Arm, plain_steps: f64) {
        if let Some(i) = self.index(arm)
            && plain_steps.is_finite()
            && plain_steps >= 0.0
        {
            self.switch_cost[i] = plain_steps;
        }
    }

    /// The session may commit at most `tokens` more (`None`: unknown),
    /// which bounds the steps a switch has to repay its cost in.
    pub fn set_tokens_left(&mut self, tokens: Option<usize>) {
        self.tokens_left = tokens;
    }

    /// Steps within which a switch must repay its cost: [`Arms::HORIZON`],
    /// or fewer when the session ends sooner (its tokens left over the
    /// most any arm's best budget expects to commit per step, `bests`).
    fn horizon(&self, bests: &[Decision]) -> f64 {
        let Some(left) = self.tokens_left else {
            return Self::HORIZON;
        };
        let per_step = bests
            .iter()
            .map(|d| d.expected_tokens)
            .filter(|t| t.is_finite())
            .fold(1.0, f64::max);
        (left as f64 / per_step).clamp(1.0, Self::HORIZON)
    }

    /// A policy per arm of `arms` (at least one, no repeats), all on the
    /// verifier's `curve`.
    pub fn new(arms: &[Arm], curve: CostCurve, config: PolicyConfig) -> Result<Arms, PolicyError> {
        if arms.is_empty() {
            return Err(PolicyError::BadConfig {
                field: "arms",
                value: 0.0,
                reason: "at least one arm is needed",
            });
        }
        let mut list: Vec<(Arm, SpecPolicy)> = Vec::with_capacity(arms.len());
        for &a in arms {
            if list.iter().any(|(b, _)| *b == a) {
                return Err(PolicyError::BadConfig {
                    field: "arms",
                    value: list.len() as f64,
                    reason: "an arm is listed twice",
                });
            }
            list.push((a, SpecPolicy::new(curve.clone(), config.clone())?));
        }
        Ok(Arms {
            idle: vec![0; list.len()],
            used: vec![0; list.len()],
            decided: vec![0; list.len()],
            switch_cost: vec![0.0; list.len()],
            tokens_left: None,
            learned: vec![0; list.len()],
            arms: list,
        })
    }

    /// The arms, in the order given.
    pub fn arms(&self) -> impl Iterator<Item = Arm> + '_ {
        self.arms.iter().map(|(a, _)| *a)
    }

    pub fn policy(&self, arm: Arm) -> Option<&SpecPolicy> {
        self.arms.iter().find(|(a, _)| *a == arm).map(|(_, p)| p)
    }

    pub fn policy_mut(&mut self, arm: Arm) -> Option<&mut SpecPolicy> {
        self.arms
            .iter_mut()
            .find(|(a, _)| *a == arm)
            .map(|(_, p)| p)
    }

    /// Steps `arm` drafted so far.
    pub fn used(&self, arm: Arm) -> u64 {
        self.index(arm).map_or(0, |i| self.used[i])
    }

    fn index(&self, arm: Arm) -> Option<usize> {
        self.arms.iter().position(|(a, _)| *a == arm)
    }

    /// The arm for the next step when the verifier batches `batch`
    /// sessions, and its decision for a run of at most `max_steps` steps
    /// (see [`SpecPolicy::decide_run`]).
    /// See [`SpecPolicy::set_grant_cap`]; for every arm.
    pub fn set_grant_cap(&mut self, cap: Option<usize>) {
        for (_, p) in &mut self.arms {
            p.set_grant_cap(cap);
        }
    }

    /// See [`SpecPolicy::set_depth_cap`]; for `arm` alone.
    pub fn set_depth_cap(&mut self, arm: Arm, cap: Option<usize>) {
        if let Some(p) = self.policy_mut(arm) {
            p.set_depth_cap(cap);
        }
    }

    pub fn decide_run(&mut self, batch: usize, max_steps: usize) -> (Arm, Decision, usize) {
        let i = self.choose(batch);
        for (j, idle) in self.idle.iter_mut().enumerate() {
            *idle = if j == i { 0 } else { idle.saturating_add(1) };
        }
        let (arm, policy) = &mut self.arms[i];
        let (decision, steps) = policy.decide_run(batch, max_steps);
        if !decision.budget.is_off() {
            self.used[i] += 1;
        }
        self.decided[i] += steps as u64;
        (*arm, decision, steps)
    }

    /// The index of the arm to use: an untried or idle one that could
    /// win, else the best expected speed-up (ties: the earlier arm).
    fn choose(&self, batch: usize) -> usize {
        if self.arms.len() == 1 {
            return 0;
        }
        // Each arm's expected speed-up, less its switch cost spread over
        // the horizon.
        let bests: Vec<Decision> = self.arms.iter().map(|(_, p)| p.best(batch)).collect();
        let horizon = self.horizon(&bests);
        let amortised = |i: usize| self.switch_cost[i] / horizon;
        let speedups: Vec<f64> = bests
            .iter()
            .enumerate()
            .map(|(i, d)| d.expected_speedup() - amortised(i))
            .collect();
        // The others' estimates (an untried arm's rests on its prior).
        let best_other = |except: usize| {
            speedups
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != except)
                .map(|(_, &s)| s)
                .fold(1.0, f64::max)
        };
        for (i, (_, p)) in self.arms.iter().enumerate() {
            let stale = self.used[i] == 0 || self.idle[i] >= Self::EXPLORE_INTERVAL;
            let measured = self.decided[..i].iter().all(|&u| u >= Self::MIN_EVIDENCE);
            // What the arm could reach: the learned estimate with a
            // margin where earlier sessions measured it, else everything
            // accepted.
            let reach = if self.learned[i] >= Self::LEARNED_SESSIONS {
                bests[i].expected_speedup() * (1.0 + Self::EXPLORE_MARGIN)
            } else {
                p.upper_bound(batch)
            };
            let bound = reach - amortised(i);
            if stale && measured && bound > best_other(i) * (1.0 + 1e-9) {
                return i;
            }
        }
        let mut best = 0;
        for (i, &s) in speedups.iter().enumerate() {
            if s > speedups[best] * (1.0 + 1e-9) {
                best = i;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arms(list: &[Arm]) -> Arms {
        Arms::new(list, CostCurve::cpu_default(), PolicyConfig::default()).unwrap()
    }

    /// Teaches `arm` a per-depth acceptance of `rate` over chains of 8.
    fn train(a: &mut Arms, arm: Arm, rate: f64) {
        crate::policy::tests::observe_chains(a.policy_mut(arm).unwrap(), rate, 200);
    }

    #[test]
    fn sources_name_their_arms() {
        assert_eq!(
            arms_for(Sources::Auto, true),
            [Arm::ModelFree, Arm::Combined]
        );
        assert_eq!(arms_for(Sources::Auto, false), [Arm::ModelFree]);
        assert_eq!(arms_for(Sources::ModelFree, true), [Arm::ModelFree]);
        assert_eq!(arms_for(Sources::DraftModel, true), [Arm::Model]);
        assert!(arms_for(Sources::DraftModel, false).is_empty());
        assert!(arms_for(Sources::Combined, false).is_empty());
    }

    #[test]
    fn arms_are_checked() {
        let c = CostCurve::cpu_default;
        assert!(Arms::new(&[], c(), PolicyConfig::default()).is_err());
        assert!(Arms::new(&[Arm::Model, Arm::Model], c(), PolicyConfig::default()).is_err());
    }

    #[test]
    fn an_arm_that_cannot_win_is_never_tried() {
        let mut a = arms(&[Arm::ModelFree, Arm::Combined]);
        // A draft forward costing a whole verify step per level: even if
        // the target accepted everything, the model would not pay.
        a.policy_mut(Arm::Combined).unwrap().set_level_cost(1.0);
        assert!(a.policy(Arm::Combined).unwrap().upper_bound(1) < 1.2);
        train(&mut a, Arm::ModelFree, 0.6);
        for _ in 0..100 {
            assert_eq!(a.decide_run(1, 1).0, Arm::ModelFree);
        }
        assert_eq!(a.used(Arm::Combined), 0);
    }

    #[test]
    fn untried_arms_go_first_then_the_faster_wins() {
        let mut a = arms(&[Arm::ModelFree, Arm::Combined]);
        // Both untried and free to draft: the first until it has evidence,
        // then the other.
        for _ in 0..Arms::MIN_EVIDENCE {
            assert_eq!(a.decide_run(1, 1).0, Arm::ModelFree);
        }
        assert_eq!(a.decide_run(1, 1).0, Arm::Combined);
        // The model accepts 95% per depth but costs 0.4 plain steps per
        // level; model-free accepts 30%: the model pays.
        train(&mut a, Arm::Combined, 0.95);
        train(&mut a, Arm::ModelFree, 0.3);
        a.policy_mut(Arm::Combined).unwrap().set_level_cost(0.4);
        assert_eq!(a.decide_run(1, 1).0, Arm::Combined);
        // The same model costing 3 plain steps per level does not.
        a.policy_mut(Arm::Combined).unwrap().set_level_cost(3.0);
        let (arm, d, _) = a.decide_run(1, 1);
        assert_eq!(arm, Arm::ModelFree, "{d:?}");
    }

    #[test]
    fn a_switch_that_cannot_repay_its_catch_up_is_not_made() {
        let mut a = arms(&[Arm::ModelFree, Arm::Combined]);
        train(&mut a, Arm::ModelFree, 0.3);
        a.policy_mut(Arm::Combined).unwrap().set_level_cost(0.2);
        // A long context to prefill first: 200 plain steps' worth.
        a.set_switch_cost(Arm::Combined, 200.0);
        for _ in 0..64 {
            assert_eq!(a.decide_run(1, 1).0, Arm::ModelFree);
        }
        // Once caught up (a short context), it is worth a try.
        a.set_switch_cost(Arm::Combined, 1.0);
        assert_eq!(a.decide_run(1, 1).0, Arm::Combined);
        a.set_switch_cost(Arm::Combined, f64::NAN);
        assert_eq!(a.switch_cost[1], 1.0);
    }

    #[test]
    fn a_session_near_its_end_does_not_switch() {
        let fresh = || {
            let mut a = arms(&[Arm::ModelFree, Arm::Combined]);
            train(&mut a, Arm::ModelFree, 0.5);
            train(&mut a, Arm::Combined, 0.9);
            a.policy_mut(Arm::Combined).unwrap().set_level_cost(0.05);
            // Catching the model up: 4 plain steps' worth.
            a.set_switch_cost(Arm::Combined, 4.0);
            // The untried first arm goes first.
            assert_eq!(a.decide_run(1, 1).0, Arm::ModelFree);
            a
        };
        // With the end unknown (or far), the better arm repays its switch.
        let mut a = fresh();
        assert_eq!(a.decide_run(1, 1).0, Arm::Combined);
        let mut a = fresh();
        a.set_tokens_left(Some(1000));
        assert_eq!(a.decide_run(1, 1).0, Arm::Combined);
        // A dozen tokens left: two steps at the model's pace, too few to
        // repay 4 plain steps.
        let mut a = fresh();
        a.set_tokens_left(Some(12));
        for _ in 0..40 {
            assert_eq!(a.decide_run(1, 1).0, Arm::ModelFree);
        }
        // Once caught up, a switch costs nothing and the better arm wins.
        a.set_switch_cost(Arm::Combined, 0.0);
        assert_eq!(a.decide_run(1, 1).0, Arm::Combined);
    }

    #[test]
    fn an_idle_arm_is_measured_again() {
        let mut a = arms(&[Arm::ModelFree, Arm::Combined]);
        for _ in 0..=Arms::MIN_EVIDENCE {
            a.decide_run(1, 1);
        }
        assert_eq!(a.used(Arm::Combined), 1);
        // Combined accepts little: it loses on its estimate, but all
        // accepted it could win, so it is measured again now and then.
        train(&mut a, Arm::ModelFree, 0.6);
        train(&mut a, Arm::Combined, 0.1);
        a.policy_mut(Arm::Combined).unwrap().set_level_cost(0.05);
        let picks: Vec<Arm> = (0..=Arms::EXPLORE_INTERVAL + 1)
            .map(|_| a.decide_run(1, 1).0)
            .collect();
        let combined = picks.iter().filter(|&&p| p == Arm::Combined).count();
        assert_eq!(combined, 1, "{picks:?}");
        assert_eq!(picks[Arms::EXPLORE_INTERVAL as usize], Arm::Combined);
    }

    /// What `sessions` earlier sessions measured: `rate` per depth and
    /// `overhead` plain steps per speculative step.
    fn learned(rate: f64, overhead: f64, sessions: u64) -> Learned {
        Learned {
            rates: vec![rate; 16],
            overhead: Some(overhead),
            sessions,
        }
    }

    #[test]
    fn a_model_earlier_sessions_saw_lose_is_not_explored() {
        // Code: the model-free drafters accept 85% per depth for free;
        // earlier sessions saw the model's arm accept 50% at 0.05 plain
        // steps per level and 0.2 overhead.
        let fresh = |seeded: u64| {
            let mut a = arms(&[Arm::ModelFree, Arm::Combined]);
            a.policy_mut(Arm::Combined).unwrap().set_level_cost(0.05);
            a.seed(Arm::ModelFree, &learned(0.85, 0.1, seeded));
            a.seed(Arm::Combined, &learned(0.5, 0.2, seeded));
            train(&mut a, Arm::ModelFree, 0.85);
            a
        };
        let mut a = fresh(5);
        // Had everything been accepted the model would win; as learned,
        // not even with the margin.
        let free = a.policy(Arm::ModelFree).unwrap().best(1).expected_speedup();
        let model = a.policy(Arm::Combined).unwrap();
        assert!(model.upper_bound(1) > free);
        assert!(model.best(1).expected_speedup() * (1.0 + Arms::EXPLORE_MARGIN) < free);
        for _ in 0..200 {
            assert_eq!(a.decide_run(1, 1).0, Arm::ModelFree);
        }
        assert_eq!(a.used(Arm::Combined), 0);
        // Taught by too few sessions, the model is explored on its bound.
        let mut a = fresh(Arms::LEARNED_SESSIONS - 1);
        let picks: Vec<Arm> = (0..100).map(|_| a.decide_run(1, 1).0).collect();
        assert!(picks.contains(&Arm::Combined), "{picks:?}");
    }

    #[test]
    fn a_model_earlier_sessions_saw_win_is_used_at_once_and_lost_ground_reexplored() {
        // Chat: the model-free drafters accept 30%, the model 90%.
        let mut a = arms(&[Arm::ModelFree, Arm::Combined]);
        a.policy_mut(Arm::Combined).unwrap().set_level_cost(0.05);
        a.seed(Arm::ModelFree, &learned(0.3, 0.1, 5));
        a.seed(Arm::Combined, &learned(0.9, 0.2, 5));
        assert_eq!(a.decide_run(1, 1).0, Arm::Combined);
        // This session's text turns out to defeat the model: it falls back
        // to model-free, and is measured again while its learned estimate,
        // with the margin, could still win.
        train(&mut a, Arm::Combined, 0.05);
        train(&mut a, Arm::ModelFree, 0.3);
        let picks: Vec<Arm> = (0..=Arms::EXPLORE_INTERVAL + 1)
            .map(|_| a.decide_run(1, 1).0)
            .collect();
        assert_eq!(picks[0], Arm::ModelFree);
    }

    #[test]
    fn a_costly_drafter_drafts_shallower() {
        let mut a = arms(&[Arm::Model]);
        train(&mut a, Arm::Model, 0.9);
        let free = a.policy(Arm::Model).unwrap().best(1);
        a.policy_mut(Arm::Model).unwrap().set_level_cost(0.5);
        let costly = a.policy(Arm::Model).unwrap().best(1);
        assert!(
            costly.budget.max_depth < free.budget.max_depth,
            "{free:?} vs {costly:?}"
        );
        a.policy_mut(Arm::Model).unwrap().set_level_cost(10.0);
        assert!(a.policy(Arm::Model).unwrap().best(1).budget.is_off());
    }
}
