//! The adaptive speculation policy: how big a tree to draft this step.
//!
//! Speculation pays when the tokens a step is expected to commit grow faster
//! than the verify forward's cost. Both sides are measured: the verifier's
//! [`CostCurve`] (time of one forward over k tokens, relative to one token)
//! and the session's [`AcceptanceStats`] (per tree depth, how often the
//! target accepted that depth given it accepted the one above). The
//! [`SpecPolicy`] picks the node budget that maximises expected committed
//! tokens per unit of verify time, which is zero drafted nodes (plain
//! decoding) when nothing pays. A speculative step also costs more than its
//! forward (waiting for the tree, verifying it, the drafter's CPU): that
//! overhead is measured from the session's own step durations
//! ([`StepTiming`]) and added to the curve's price.
//!
//! A session need not start from a guess: the [`Ledger`] keeps what
//! earlier sessions of its workload measured (acceptance per depth, the
//! overhead), and [`SpecPolicy::seed`] starts a policy from it.
//!
//! Everything here is pure arithmetic on a handful of numbers, cheap enough
//! to run every step.
//!
//! # The model
//!
//! With per-depth conditional acceptance `a_d`, a chain of depth `D` commits
//! in expectation `E = 1 + Σ_{d≤D} Π_{j≤d} a_j` tokens (the bonus token plus
//! each accepted depth). A tree spends some of its nodes on siblings
//! instead of depth. We model a depth holding `w` candidates as accepted
//! with `1 − (1 − a_d)·(1 − g)^(w−1)`: each extra sibling catches a fixed
//! fraction `g` ([`PolicyConfig::width_gain`]) of the remaining misses. This
//! ignores that siblings hang off different parents and that a drafter's
//! later candidates are weaker than `g` suggests for flat distributions; it
//! only has to rank budgets, not predict acceptance. The shape for `k`
//! nodes is grown greedily, one node at a time where it adds most to `E`
//! (deeper, or a sibling at some depth), so the shape for `k + 1` extends
//! the one for `k` and `E` never falls as the budget grows.
//!
//! The measured `a_d` count a depth as accepted when *any* candidate there
//! was, so on wide trees they already include some width; a small `g`
//! keeps the double counting small.
//!
//! Drafting itself may cost time too: a draft model runs one forward per
//! tree level. [`SpecPolicy::set_level_cost`] prices a level in plain
//! steps, so a step of depth `D` costs `D` levels more, and a drafter that
//! is slow next to the verifier drafts shallow trees or none
//! ([`Arms`] chooses between drafters by the same arithmetic).
//!
//! A step over a verifier batch of `B` sessions (each with `k + 1` tokens,
//! root included) costs `cost((k + 1)·B) / cost(B)` relative to plain
//! decoding: under load the forward is less memory-bound, extra tokens are
//! dearer, and the policy drafts less.

mod acceptance;
mod arms;
mod curve;
mod ledger;
#[cfg(test)]
mod tests;
mod timing;

use specmesh_tree::TreeLimits;

pub use acceptance::{AcceptanceStats, offered_and_accepted};
pub use arms::{Arm, Arms, Sources, arms_for};
pub use curve::CostCurve;
pub use ledger::{Learned, Ledger};
pub use timing::StepTiming;

use crate::Feedback;

/// Why a cost curve or a policy configuration was refused; messages name the
/// offending value so a benchmark's output can be fixed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("a cost curve needs at least two points (k = 1 and a larger k), got {0}")]
    TooFewPoints(usize),
    #[error("the cost curve must start at k = 1 with cost 1, got ({k}, {cost})")]
    BadFirstPoint { k: usize, cost: f64 },
    #[error("cost curve point {index}: k = {k} must be larger than the previous k = {previous}")]
    UnsortedK {
        index: usize,
        k: usize,
        previous: usize,
    },
    #[error(
        "cost curve point {index}: cost {cost} at k = {k} is below the previous cost {previous}: a forward over more tokens cannot be cheaper"
    )]
    DecreasingCost {
        index: usize,
        k: usize,
        cost: f64,
        previous: f64,
    },
    #[error("cost curve point {index}: cost {cost} is not a finite positive number")]
    BadCost { index: usize, cost: f64 },
    #[error("policy option `{field}` is {value}: {reason}")]
    BadConfig {
        field: &'static str,
        value: f64,
        reason: &'static str,
    },
}

/// A tree budget. `max_nodes` counts the root, so 1 means no speculation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub max_nodes: usize,
    pub max_depth: usize,
}

impl Budget {
    /// Plain decoding: the root alone.
    pub const OFF: Budget = Budget {
        max_nodes: 1,
        max_depth: 0,
    };

    /// Whether this budget drafts nothing.
    pub fn is_off(&self) -> bool {
        self.max_nodes <= 1 || self.max_depth == 0
    }

    /// Drafted nodes (root excluded).
    pub fn drafted(&self) -> usize {
        self.max_nodes.saturating_sub(1)
    }

    /// As the limits a drafter builds its tree under.
    pub fn limits(&self, vocab: u32) -> TreeLimits {
        TreeLimits::new(self.max_nodes, self.max_depth, vocab)
    }
}

/// Knobs of the policy; [`PolicyConfig::default`] suits the CPU verifier.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Largest tree, root included.
    pub max_nodes: usize,
    /// Deepest tree.
    pub max_depth: usize,
    /// Acceptance rate assumed before any observation.
    pub prior_accept: f64,
    /// Observations the prior is worth.
    pub prior_strength: f64,
    /// Forgetting factor of the acceptance counts (see [`AcceptanceStats`]).
    pub decay: f64,
    /// Fraction of the remaining misses at a depth each extra sibling
    /// catches (the tree approximation, see the module docs), in [0, 1).
    pub width_gain: f64,
    /// While speculation is off, every `probe_interval`-th step drafts the
    /// probe budget anyway so acceptance keeps being measured; in a
    /// verifier batch of `B` sessions every `B · probe_interval`-th (see
    /// [`SpecPolicy::decide`]). 0 disables probing (then speculation, once
    /// off, stays off).
    pub probe_interval: u32,
    /// The probe tree: drafted nodes (a chain of this depth).
    pub probe_nodes: usize,
}

impl Default for PolicyConfig {
    fn default() -> PolicyConfig {
        PolicyConfig {
            max_nodes: 17,
            max_depth: 8,
            prior_accept: 0.5,
            prior_strength: 2.0,
            decay: 0.95,
            width_gain: 0.3,
            probe_interval: 16,
            probe_nodes: 2,
        }
    }
}

/// The policy's answer for one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub budget: Budget,
    /// Expected committed tokens per step under the model.
    pub expected_tokens: f64,
    /// Step cost relative to plain decoding at the same batch size.
    pub relative_cost: f64,
    /// True when this is an exploration probe, not the argmax.
    pub probe: bool,
}

impl Decision {
    /// Expected speed-up over plain decoding (tokens per unit verify time).
    pub fn expected_speedup(&self) -> f64 {
        self.expected_tokens / self.relative_cost
    }
}

/// The adaptive budget of one session: acceptance statistics, the
/// verifier's cost curve and the exploration counter.
///
/// Call [`SpecPolicy::decide`] once per step (or [`SpecPolicy::decide_run`]
/// once per run of steps) and feed each verify step back
/// with [`SpecPolicy::observe`] (or `observe_feedback`).
///
/// Exploration is deterministic: each step on which the argmax is "off"
/// increments a counter; when it reaches `probe_interval` that step drafts
/// the probe budget instead and the counter restarts. Any step on which
/// speculation pays resets it. So a session whose text turns predictable is
/// noticed within `probe_interval` steps, at a cost of one small tree per
/// `probe_interval` plain steps, and two runs of the same session make the
/// same decisions.
#[derive(Clone, Debug)]
pub struct SpecPolicy {
    config: PolicyConfig,
    curve: CostCurve,
    stats: AcceptanceStats,
    timing: StepTiming,
    /// What drafting one tree level costs, in plain steps.
    level_cost: f64,
    /// Levels drafted beyond a tree's depth (a draft model drafting
    /// through text drafts one more than the target tree keeps).
    extra_levels: usize,
    off_streak: u32,
    /// Drafted nodes the verifier expects to grant (its goodput planner's
    /// forecast): no budget above it is chosen. `usize::MAX`: no cap.
    grant_cap: usize,
    /// Deepest tree that arrives before the verifier needs it (levels of
    /// a drafter that pays a forward per level). `usize::MAX`: no cap.
    depth_cap: usize,
}

/// Candidate drafted-node counts (root excluded); the cost curve is
/// measured at about these sizes, and a coarse ladder keeps the budget from
/// flickering between neighbours of near-equal value.
const LADDER: [usize; 14] = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96];

impl SpecPolicy {
    pub fn new(curve: CostCurve, config: PolicyConfig) -> Result<SpecPolicy, PolicyError> {
        if config.max_nodes == 0 {
            return Err(PolicyError::BadConfig {
                field: "max_nodes",
                value: 0.0,
                reason: "counts the root, so must be >= 1",
            });
        }
        if !(0.0..1.0).contains(&config.width_gain) {
            return Err(PolicyError::BadConfig {
                field: "width_gain",
                value: config.width_gain,
                reason: "must be in [0, 1)",
            });
        }
        let stats = AcceptanceStats::new(config.prior_accept, config.prior_strength, config.decay)?;
        Ok(SpecPolicy {
            config,
            curve,
            stats,
            timing: StepTiming::default(),
            level_cost: 0.0,
            extra_levels: 0,
            off_streak: 0,
            grant_cap: usize::MAX,
            depth_cap: usize::MAX,
        })
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    pub fn curve(&self) -> &CostCurve {
        &self.curve
    }

    pub fn stats(&self) -> &AcceptanceStats {
        &self.stats
    }

    pub fn stats_mut(&mut self) -> &mut AcceptanceStats {
        &mut self.stats
    }

    /// Starts from what earlier sessions of the workload learned: their
    /// rates as the per-depth priors, their overhead until this session
    /// times its own.
    pub fn seed(&mut self, learned: &Learned) {
        self.stats.set_learned(&learned.rates);
        if let Some(o) = learned.overhead {
            self.timing.seed_overhead(o);
        }
    }

    /// See [`AcceptanceStats::observe`].
    pub fn observe(&mut self, offered: usize, accepted: usize) {
        self.stats.observe(offered, accepted);
    }

    /// A step (or a run of `steps` plain steps) that drafted `drafted` nodes
    /// in a verifier batch of `batch` took `secs`, outcome to outcome, not
    /// counting the drafting that [`SpecPolicy::set_level_cost`] prices
    /// (the caller subtracts it): see [`StepTiming`].
    pub fn observe_step_time(&mut self, drafted: usize, batch: usize, steps: usize, secs: f64) {
        if drafted == 0 {
            self.timing.observe_plain(steps, secs);
        } else {
            let predicted = self.curve.step_cost(drafted, batch.max(1));
            self.timing.observe_speculative(secs, predicted);
        }
    }

    pub fn timing(&self) -> &StepTiming {
        &self.timing
    }

    pub fn timing_mut(&mut self) -> &mut StepTiming {
        &mut self.timing
    }

    /// Prices drafting: one tree level costs `plain_steps` plain verify
    /// steps (0, the default, for drafters that take microseconds). Not a
    /// finite non-negative number: ignored.
    pub fn set_level_cost(&mut self, plain_steps: f64) {
        if plain_steps.is_finite() && plain_steps >= 0.0 {
            self.level_cost = plain_steps;
        }
    }

    /// Every tree drafts `levels` more than its depth, each priced as a
    /// level (see [`SpecPolicy::set_level_cost`]).
    pub fn set_extra_levels(&mut self, levels: usize) {
        self.extra_levels = levels;
    }

    /// What a speculative step drafting `drafted` nodes `depth` levels deep
    /// costs, relative to a plain one: the verify forward (the curve), the
    /// measured overhead of speculating and the drafting.
    fn step_cost(&self, drafted: usize, depth: usize, batch: usize) -> f64 {
        let levels = if depth > 0 {
            depth + self.extra_levels
        } else {
            0
        };
        self.curve.step_cost(drafted, batch)
            + self.timing.overhead()
            + self.level_cost * levels as f64
    }

    /// Caps the budgets chosen at `cap` drafted nodes (`None`: no cap):
    /// the verifier's forecast of what it will grant. A cap of 0 leaves
    /// speculation off but for the probes, which keep measuring.
    pub fn set_grant_cap(&mut self, cap: Option<usize>) {
        self.grant_cap = cap.unwrap_or(usize::MAX);
    }

    /// Caps the depth of the trees chosen at `cap` levels (`None`: no
    /// cap): deeper trees would arrive after the verifier has run its
    /// forward without them. A cap of 0 drafts nothing, probes included.
    pub fn set_depth_cap(&mut self, cap: Option<usize>) {
        self.depth_cap = cap.unwrap_or(usize::MAX);
    }

    /// The deepest tree allowed: the configuration's, or the cap.
    fn max_depth(&self) -> usize {
        self.config.max_depth.min(self.depth_cap)
    }

    /// See [`AcceptanceStats::observe_feedback`].
    pub fn observe_feedback(&mut self, feedback: &Feedback<'_>) {
        self.stats.observe_feedback(feedback);
    }

    /// The budget for this step when the verifier batches `batch` sessions.
    /// Advances the exploration counter.
    pub fn decide(&mut self, batch: usize) -> Decision {
        let best = self.best(batch);
        if !best.budget.is_off() {
            self.off_streak = 0;
            return best;
        }
        let depth = self.probe_depth();
        if depth == 0 {
            return best;
        }
        self.off_streak += 1;
        if self.off_streak < self.probe_interval(batch) {
            return best;
        }
        self.off_streak = 0;
        let budget = Budget {
            max_nodes: depth + 1,
            max_depth: depth,
        };
        let shape = Shape::grow(
            &self.stats.rates(depth),
            depth,
            depth,
            self.config.width_gain,
        );
        Decision {
            budget,
            expected_tokens: shape.expected.last().copied().unwrap_or(1.0),
            relative_cost: self.step_cost(depth, depth, batch),
            probe: true,
        }
    }

    /// Decides this step and, when it does not speculate, the run of steps
    /// after it that would not either: the same decisions, and the same
    /// exploration counter afterwards, as calling [`SpecPolicy::decide`]
    /// once and then again while it answers "off", at most `max_steps`
    /// calls in all. Returns the first decision (every "off" decision of
    /// the run is the same) and how many steps it stands for, at least 1.
    ///
    /// This lets a drafter tell the verifier about a whole run of plain
    /// steps at once; the run ends before the next probe.
    pub fn decide_run(&mut self, batch: usize, max_steps: usize) -> (Decision, usize) {
        let first = self.decide(batch);
        if !first.budget.is_off() || max_steps <= 1 {
            return (first, 1);
        }
        // While speculation is off, `decide` changes nothing but the probe
        // counter, and `best` does not read it: the next decisions differ
        // from this one only where the counter reaches the interval.
        if self.probe_depth() == 0 {
            // Never probing: off for good, and nothing counted.
            return (first, max_steps);
        }
        let left = (self.probe_interval(batch) - 1).saturating_sub(self.off_streak);
        let more = left.min(u32::try_from(max_steps - 1).unwrap_or(u32::MAX));
        self.off_streak += more;
        (first, 1 + more as usize)
    }

    /// Off steps between probes at batch `batch`: a probe lengthens the
    /// whole batch's forward, and under load, where the forward is no
    /// longer memory-bound, speculation rarely pays, so a session probes
    /// `batch` times less often: the batch as a whole then probes about
    /// as often as one session alone does.
    fn probe_interval(&self, batch: usize) -> u32 {
        let batch = u32::try_from(batch.max(1)).unwrap_or(u32::MAX);
        self.config.probe_interval.saturating_mul(batch)
    }

    /// The depth of a probe tree; 0 when the policy never probes.
    fn probe_depth(&self) -> usize {
        if self.config.probe_interval == 0 {
            return 0;
        }
        let probe = self.config.probe_nodes.min(self.config.max_nodes - 1);
        probe.min(self.max_depth())
    }

    /// The argmax budget for `batch`, without exploration and without
    /// changing any state.
    pub fn best(&self, batch: usize) -> Decision {
        let max_drafted = (self.config.max_nodes - 1).min(self.grant_cap);
        let max_depth = self.max_depth();
        let rates = self.stats.rates(max_depth);
        let shape = Shape::grow(&rates, max_drafted, max_depth, self.config.width_gain);
        let mut best = Decision {
            budget: Budget::OFF,
            expected_tokens: 1.0,
            relative_cost: 1.0,
            probe: false,
        };
        let candidates = LADDER
            .iter()
            .copied()
            .filter(|&k| k < max_drafted)
            .chain(std::iter::once(max_drafted));
        for k in candidates.filter(|&k| k > 0) {
            let d = Decision {
                budget: Budget {
                    max_nodes: k + 1,
                    max_depth: shape.depth[k],
                },
                expected_tokens: shape.expected[k],
                relative_cost: self.step_cost(k, shape.depth[k], batch),
                probe: false,
            };
            // Strictly better only: ties keep the smaller, cheaper budget.
            if d.expected_speedup() > best.expected_speedup() * (1.0 + 1e-9) {
                best = d;
            }
        }
        best
    }

    /// The most any budget could gain at batch `batch` if the target
    /// accepted every drafted token: a chain of `k` nodes commits `k + 1`
    /// tokens at the cost of `k` nodes (and `k` levels of drafting). An arm
    /// whose bound is below another's measured speed-up is not worth
    /// trying ([`Arms`]).
    pub fn upper_bound(&self, batch: usize) -> f64 {
        let max_drafted = (self.config.max_nodes - 1).min(self.max_depth());
        (0..=max_drafted)
            .map(|k| (k as f64 + 1.0) / self.step_cost(k, k, batch).max(1e-9))
            .fold(1.0, f64::max)
    }

    /// Expected committed tokens per step with `drafted` nodes, under the
    /// current statistics (see the module docs for the tree model).
    pub fn expected_tokens(&self, drafted: usize) -> f64 {
        let drafted = drafted.min(self.config.max_nodes - 1);
        let rates = self.stats.rates(self.config.max_depth);
        let shape = Shape::grow(
            &rates,
            drafted,
            self.config.max_depth,
            self.config.width_gain,
        );
        shape.expected[drafted]
    }
}

/// The greedily grown tree shape for every node count up to a maximum.
struct Shape {
    /// `expected[k]`: expected committed tokens with k drafted nodes.
    expected: Vec<f64>,
    /// `depth[k]`: the shape's depth with k drafted nodes.
    depth: Vec<usize>,
}

impl Shape {
    /// Adds nodes one at a time where they raise the expectation most: a
    /// new deepest level, or one more sibling at an existing depth.
    fn grow(rates: &[f64], max_drafted: usize, max_depth: usize, gain: f64) -> Shape {
        let max_depth = max_depth.min(rates.len());
        let mut width: Vec<usize> = Vec::with_capacity(max_depth);
        let mut expected = vec![1.0];
        let mut depth = vec![0];
        for _ in 0..max_drafted {
            let mut best: Option<(f64, Option<usize>)> = None;
            let mut consider = |e: f64, at: Option<usize>| {
                if best.is_none_or(|(b, _)| e > b) {
                    best = Some((e, at));
                }
            };
            if width.len() < max_depth {
                width.push(1);
                consider(expectation(rates, &width, gain), None);
                width.pop();
            }
            for d in 0..width.len() {
                width[d] += 1;
                consider(expectation(rates, &width, gain), Some(d));
                width[d] -= 1;
            }
            match best {
                Some((e, None)) => {
                    width.push(1);
                    expected.push(e);
                }
                Some((e, Some(d))) => {
                    width[d] += 1;
                    expected.push(e);
                }
                // max_depth == 0: no node fits.
                None => expected.push(expected[expected.len() - 1]),
            }
            depth.push(width.len());
        }
        Shape { expected, depth }
    }
}

/// `1 + Σ_d Π_{j≤d} a_j(w_j)` with `a(w) = 1 − (1 − a)(1 − g)^(w−1)`.
fn expectation(rates: &[f64], width: &[usize], gain: f64) -> f64 {
    let mut e = 1.0;
    let mut reach = 1.0;
    for (&a, &w) in rates.iter().zip(width) {
        let miss = (1.0 - a) * (1.0 - gain).powi(w.saturating_sub(1) as i32);
        reach *= 1.0 - miss;
        e += reach;
    }
    e
}

fn check_unit(field: &'static str, v: f64) -> Result<(), PolicyError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(PolicyError::BadConfig {
            field,
            value: v,
            reason: "must be in [0, 1]",
        })
    }
}
