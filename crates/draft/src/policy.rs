//! The adaptive speculation policy: how big a tree to draft this step.
//!
//! Speculation pays when the tokens a step is expected to commit grow faster
//! than the verify forward's cost. Both sides are measured: the verifier's
//! [`CostCurve`] (time of one forward over k tokens, relative to one token)
//! and the session's [`AcceptanceStats`] (per tree depth, how often the
//! target accepted that depth given it accepted the one above). The
//! [`SpecPolicy`] picks the node budget that maximises expected committed
//! tokens per unit of verify time, which is zero drafted nodes (plain
//! decoding) when nothing pays.
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
//! A step over a verifier batch of `B` sessions (each with `k + 1` tokens,
//! root included) costs `cost((k + 1)·B) / cost(B)` relative to plain
//! decoding: under load the forward is less memory-bound, extra tokens are
//! dearer, and the policy drafts less.

use specmesh_tree::{TokenTree, TreeLimits};

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

/// The verifier's cost of one forward over `k` tokens relative to `k = 1`,
/// linear between measured points and extrapolated from the last segment.
#[derive(Clone, Debug, PartialEq)]
pub struct CostCurve {
    /// (k, relative cost), k strictly increasing from 1, cost
    /// non-decreasing from 1.
    points: Vec<(usize, f64)>,
}

impl CostCurve {
    /// Validates relative costs: `points[0]` must be `(1, 1.0)`, k strictly
    /// increasing, costs finite and non-decreasing.
    pub fn new(points: Vec<(usize, f64)>) -> Result<CostCurve, PolicyError> {
        if points.len() < 2 {
            return Err(PolicyError::TooFewPoints(points.len()));
        }
        for (index, &(_, cost)) in points.iter().enumerate() {
            if !cost.is_finite() || cost <= 0.0 {
                return Err(PolicyError::BadCost { index, cost });
            }
        }
        let (k0, c0) = points[0];
        if k0 != 1 || (c0 - 1.0).abs() > 1e-9 {
            return Err(PolicyError::BadFirstPoint { k: k0, cost: c0 });
        }
        for (index, w) in points.windows(2).enumerate() {
            let ((pk, pc), (k, cost)) = (w[0], w[1]);
            if k <= pk {
                return Err(PolicyError::UnsortedK {
                    index: index + 1,
                    k,
                    previous: pk,
                });
            }
            if cost < pc {
                return Err(PolicyError::DecreasingCost {
                    index: index + 1,
                    k,
                    cost,
                    previous: pc,
                });
            }
        }
        Ok(CostCurve { points })
    }

    /// Builds the curve from absolute forward times (any unit), dividing by
    /// the time at `k = 1`, which must be the first point: what a benchmark
    /// measures directly.
    pub fn from_times(times: &[(usize, f64)]) -> Result<CostCurve, PolicyError> {
        let Some(&(k0, t0)) = times.first() else {
            return Err(PolicyError::TooFewPoints(0));
        };
        if k0 != 1 || !t0.is_finite() || t0 <= 0.0 {
            return Err(PolicyError::BadFirstPoint { k: k0, cost: t0 });
        }
        CostCurve::new(times.iter().map(|&(k, t)| (k, t / t0)).collect())
    }

    /// The CPU verifier's curve measured on the test model at context 512
    /// (`bench-model`); a reasonable default until the verifier reports its
    /// own.
    pub fn cpu_default() -> CostCurve {
        CostCurve {
            points: vec![(1, 1.0), (2, 1.26), (4, 1.85), (8, 2.99), (16, 5.02)],
        }
    }

    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// Relative cost of a forward over `k` tokens (`k` ≥ 1; smaller values
    /// are treated as 1).
    pub fn cost(&self, k: usize) -> f64 {
        let k = k.max(1);
        // The segment containing k, or the last one to extrapolate from.
        let i = self
            .points
            .windows(2)
            .position(|w| k <= w[1].0)
            .unwrap_or(self.points.len() - 2);
        let ((k0, c0), (k1, c1)) = (self.points[i], self.points[i + 1]);
        c0 + (c1 - c0) * (k as f64 - k0 as f64) / (k1 - k0) as f64
    }

    /// Cost of a speculative step drafting `drafted` nodes per session,
    /// relative to plain decoding, when the verifier batches `batch`
    /// sessions (each sends its root plus `drafted` nodes).
    pub fn step_cost(&self, drafted: usize, batch: usize) -> f64 {
        let b = batch.max(1);
        self.cost((drafted + 1) * b) / self.cost(b)
    }
}

/// Per-depth acceptance counts with a Beta prior and exponential forgetting.
///
/// Depth `d`'s rate is the posterior mean of
/// `P(depth d accepted | depth d − 1 accepted and depth d was offered)`.
/// Its prior is the global prior for depth 1 and depth `d − 1`'s posterior
/// below that, so a depth the session never reached is assumed to behave
/// like the deepest one it did: zero acceptance at depth 1 does not leave
/// an optimistic default waiting at depth 2.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptanceStats {
    prior: f64,
    strength: f64,
    decay: f64,
    /// (accepted, rejected) weights per depth, index 0 = depth 1.
    counts: Vec<(f64, f64)>,
}

impl AcceptanceStats {
    /// `prior`: assumed rate before any observation, in [0, 1];
    /// `strength`: how many observations the prior is worth (> 0);
    /// `decay`: factor applied to a depth's counts each time it is
    /// observed, in (0, 1] (1 = never forget; 0.95 ≈ the last 20 steps).
    pub fn new(prior: f64, strength: f64, decay: f64) -> Result<AcceptanceStats, PolicyError> {
        check_unit("prior", prior)?;
        if !strength.is_finite() || strength <= 0.0 {
            return Err(PolicyError::BadConfig {
                field: "prior_strength",
                value: strength,
                reason: "must be a finite number > 0",
            });
        }
        if !(decay > 0.0 && decay <= 1.0) {
            return Err(PolicyError::BadConfig {
                field: "decay",
                value: decay,
                reason: "must be in (0, 1]",
            });
        }
        Ok(AcceptanceStats {
            prior,
            strength,
            decay,
            counts: Vec::new(),
        })
    }

    /// Replaces the prior (e.g. with a drafter's own confidence); the
    /// observations are kept. Values outside [0, 1] are clamped.
    pub fn set_prior(&mut self, prior: f64) {
        if prior.is_finite() {
            self.prior = prior.clamp(0.0, 1.0);
        }
    }

    pub fn prior(&self) -> f64 {
        self.prior
    }

    /// Records a step: depths `1..=accepted` were accepted and, when
    /// `offered > accepted`, depth `accepted + 1` was offered and refused.
    /// Deeper depths tell nothing (they were conditional on a refused one).
    /// `offered` is the depth the tree reached *below the accepted path*:
    /// [`AcceptanceStats::observe_feedback`] derives it from a verify step.
    pub fn observe(&mut self, offered: usize, accepted: usize) {
        let accepted = accepted.min(offered);
        let seen = if offered > accepted {
            accepted + 1
        } else {
            accepted
        };
        if self.counts.len() < seen {
            self.counts.resize(seen, (0.0, 0.0));
        }
        for (d, c) in self.counts[..seen].iter_mut().enumerate() {
            c.0 *= self.decay;
            c.1 *= self.decay;
            if d < accepted {
                c.0 += 1.0;
            } else {
                c.1 += 1.0;
            }
        }
    }

    /// Records a verify step from its feedback. The depth after the accepted
    /// path counts as refused only when the last accepted node had children
    /// (a leaf offered nothing deeper).
    pub fn observe_feedback(&mut self, feedback: &Feedback<'_>) {
        let (offered, accepted) = offered_and_accepted(feedback.tree, feedback.path);
        self.observe(offered, accepted);
    }

    /// The estimated conditional acceptance rate at `depth` (≥ 1).
    pub fn rate(&self, depth: usize) -> f64 {
        let mut mean = self.prior;
        for &(acc, rej) in self.counts.iter().take(depth.max(1)) {
            mean = (acc + mean * self.strength) / (acc + rej + self.strength);
        }
        mean
    }

    /// Rates for depths `1..=max_depth`, computed in one pass.
    pub fn rates(&self, max_depth: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(max_depth);
        let mut mean = self.prior;
        for d in 0..max_depth {
            if let Some(&(acc, rej)) = self.counts.get(d) {
                mean = (acc + mean * self.strength) / (acc + rej + self.strength);
            }
            out.push(mean);
        }
        out
    }
}

/// (offered, accepted) depths of a verify step: `path` is the accepted
/// root-to-node path; the next depth was offered when its last node has
/// children.
pub fn offered_and_accepted(tree: &TokenTree, path: &[usize]) -> (usize, usize) {
    let accepted = path.len().saturating_sub(1);
    let last = path.last().copied().unwrap_or(0);
    let has_children = last < tree.len() && !tree.children(last).is_empty();
    (accepted + usize::from(has_children), accepted)
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
    /// probe budget anyway so acceptance keeps being measured. 0 disables
    /// probing (then speculation, once off, stays off).
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
/// Call [`SpecPolicy::decide`] once per step and feed each verify step back
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
    off_streak: u32,
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
            off_streak: 0,
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

    /// See [`AcceptanceStats::observe`].
    pub fn observe(&mut self, offered: usize, accepted: usize) {
        self.stats.observe(offered, accepted);
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
        let probe = self.config.probe_nodes.min(self.config.max_nodes - 1);
        let depth = probe.min(self.config.max_depth);
        if self.config.probe_interval == 0 || depth == 0 {
            return best;
        }
        self.off_streak += 1;
        if self.off_streak < self.config.probe_interval {
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
            relative_cost: self.curve.step_cost(depth, batch),
            probe: true,
        }
    }

    /// The argmax budget for `batch`, without exploration and without
    /// changing any state.
    pub fn best(&self, batch: usize) -> Decision {
        let max_drafted = self.config.max_nodes - 1;
        let max_depth = self.config.max_depth;
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
                relative_cost: self.curve.step_cost(k, batch),
                probe: false,
            };
            // Strictly better only: ties keep the smaller, cheaper budget.
            if d.expected_speedup() > best.expected_speedup() * (1.0 + 1e-9) {
                best = d;
            }
        }
        best
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

#[cfg(test)]
mod tests {
    use super::*;
    use specmesh_tree::TreeBuilder;

    fn policy_with(rate: f64, curve: CostCurve) -> SpecPolicy {
        let mut p = SpecPolicy::new(curve, PolicyConfig::default()).unwrap();
        p.stats_mut().set_prior(rate);
        p
    }

    /// A policy that has seen `steps` chain steps, each accepting a depth
    /// with probability exactly `rate` in the long run (deterministic
    /// pattern).
    fn trained(rate: f64, steps: usize) -> SpecPolicy {
        let mut p = SpecPolicy::new(CostCurve::cpu_default(), PolicyConfig::default()).unwrap();
        let mut acc = 0.0;
        for _ in 0..steps {
            let mut accepted = 0;
            while accepted < 8 {
                acc += rate;
                if acc >= 1.0 {
                    acc -= 1.0;
                    accepted += 1;
                } else {
                    break;
                }
            }
            p.observe(8, accepted);
        }
        p
    }

    #[test]
    fn cost_curve_interpolates_and_extrapolates() {
        let c = CostCurve::cpu_default();
        assert_eq!(c.cost(1), 1.0);
        assert_eq!(c.cost(0), 1.0);
        assert!((c.cost(3) - (1.26 + 1.85) / 2.0).abs() < 1e-12);
        assert!((c.cost(16) - 5.02).abs() < 1e-12);
        // Last segment slope (5.02 - 2.99) / 8 per token.
        assert!((c.cost(24) - (5.02 + 8.0 * (5.02 - 2.99) / 8.0)).abs() < 1e-12);
        assert!((c.step_cost(0, 4) - 1.0).abs() < 1e-12);
        assert!((c.step_cost(1, 4) - 2.99 / 1.85).abs() < 1e-12);
    }

    #[test]
    fn cost_curve_validation_names_the_problem() {
        assert_eq!(
            CostCurve::new(vec![(1, 1.0)]),
            Err(PolicyError::TooFewPoints(1))
        );
        assert!(matches!(
            CostCurve::new(vec![(2, 1.0), (4, 2.0)]),
            Err(PolicyError::BadFirstPoint { k: 2, .. })
        ));
        assert!(matches!(
            CostCurve::new(vec![(1, 1.0), (4, 2.0), (4, 3.0)]),
            Err(PolicyError::UnsortedK { index: 2, .. })
        ));
        assert!(matches!(
            CostCurve::new(vec![(1, 1.0), (4, 2.0), (8, 1.5)]),
            Err(PolicyError::DecreasingCost { index: 2, .. })
        ));
        assert!(matches!(
            CostCurve::new(vec![(1, 1.0), (4, f64::NAN)]),
            Err(PolicyError::BadCost { index: 1, .. })
        ));
        let c = CostCurve::from_times(&[(1, 2.0), (2, 2.5), (4, 4.0)]).unwrap();
        assert_eq!(c.points(), &[(1, 1.0), (2, 1.25), (4, 2.0)]);
        // A flat stretch is allowed (extra tokens may be free).
        assert!(CostCurve::new(vec![(1, 1.0), (2, 1.0)]).is_ok());
        assert!(
            CostCurve::new(vec![(1, 1.0), (4, 2.0), (8, 1.5)])
                .unwrap_err()
                .to_string()
                .contains("cannot be cheaper")
        );
    }

    #[test]
    fn stats_follow_observations_and_forget() {
        let mut s = AcceptanceStats::new(0.5, 2.0, 0.9).unwrap();
        assert_eq!(s.rate(1), 0.5);
        for _ in 0..50 {
            s.observe(4, 4);
        }
        assert!(s.rate(1) > 0.9 && s.rate(4) > 0.9, "{}", s.rate(4));
        // Unreached depths inherit the deepest measured rate.
        assert!(s.rate(7) > 0.9);
        for _ in 0..50 {
            s.observe(4, 0);
        }
        assert!(s.rate(1) < 0.1, "forgets: {}", s.rate(1));
        // Depth 2 was never reached after depth 1 started failing: it keeps
        // the counts it had (a conditional rate), decayed only when observed.
        assert!(s.rate(2) > 0.5, "{}", s.rate(2));
        assert!(AcceptanceStats::new(1.5, 2.0, 0.9).is_err());
        assert!(AcceptanceStats::new(0.5, 0.0, 0.9).is_err());
        assert!(AcceptanceStats::new(0.5, 1.0, 0.0).is_err());
    }

    #[test]
    fn a_leaf_on_the_accepted_path_counts_no_refusal() {
        let mut b = TreeBuilder::new(1, TreeLimits::new(8, 4, 100)).unwrap();
        let a = b.push(0, 2, 0.9).unwrap();
        let c = b.push(a, 3, 0.8).unwrap();
        b.push(0, 4, 0.1).unwrap();
        let t = b.build();
        assert_eq!(offered_and_accepted(&t, &[0, a, c]), (2, 2));
        assert_eq!(offered_and_accepted(&t, &[0, a]), (2, 1));
        assert_eq!(offered_and_accepted(&t, &[0]), (1, 0));
        let root_only = TokenTree::root_only(1, TreeLimits::new(1, 0, 100)).unwrap();
        assert_eq!(offered_and_accepted(&root_only, &[0]), (0, 0));
    }

    #[test]
    fn high_acceptance_gives_a_large_budget() {
        let p = trained(0.95, 200);
        let d = p.best(1);
        assert!(d.budget.max_nodes >= 9, "{d:?}");
        assert!(d.budget.max_depth >= 6, "{d:?}");
        assert!(d.expected_speedup() > 1.5, "{d:?}");
    }

    #[test]
    fn zero_acceptance_turns_speculation_off_except_on_probes() {
        let mut p = trained(0.0, 200);
        let interval = p.config().probe_interval as usize;
        let mut probes = Vec::new();
        for step in 0..4 * interval {
            let d = p.decide(1);
            if d.probe {
                probes.push(step);
                assert_eq!(
                    d.budget,
                    Budget {
                        max_nodes: 3,
                        max_depth: 2
                    }
                );
                // The probe fails too.
                p.observe(2, 0);
            } else {
                assert_eq!(d.budget, Budget::OFF, "step {step}");
                assert!(d.budget.is_off());
            }
        }
        let expected: Vec<usize> = (1..=4).map(|i| i * interval - 1).collect();
        assert_eq!(probes, expected, "every {interval}-th off step probes");
    }

    #[test]
    fn probes_let_speculation_turn_back_on() {
        let mut p = trained(0.0, 100);
        let mut on_at = None;
        for step in 0..200 {
            let d = p.decide(1);
            if d.probe {
                // The text became predictable: the probe is fully accepted.
                p.observe(d.budget.max_depth, d.budget.max_depth);
            } else if !d.budget.is_off() {
                on_at = Some(step);
                break;
            }
        }
        assert!(on_at.is_some(), "speculation never came back on");
    }

    #[test]
    fn steeper_cost_curve_gives_a_smaller_budget() {
        let flat = policy_with(0.8, CostCurve::cpu_default());
        let steep = policy_with(
            0.8,
            CostCurve::new(vec![(1, 1.0), (2, 1.8), (4, 3.5), (8, 7.0), (16, 14.0)]).unwrap(),
        );
        let (a, b) = (flat.best(1).budget, steep.best(1).budget);
        assert!(b.max_nodes < a.max_nodes, "flat {a:?}, steep {b:?}");
        // Linear cost (no batching gain at all): speculation never pays.
        let linear = policy_with(0.8, CostCurve::new(vec![(1, 1.0), (2, 2.0)]).unwrap());
        assert_eq!(linear.best(1).budget, Budget::OFF);
    }

    #[test]
    fn larger_batch_gives_a_smaller_budget() {
        let p = policy_with(0.8, CostCurve::cpu_default());
        let sizes: Vec<usize> = [1, 2, 4, 8, 16]
            .iter()
            .map(|&b| p.best(b).budget.max_nodes)
            .collect();
        assert!(sizes.windows(2).all(|w| w[1] <= w[0]), "{sizes:?}");
        assert!(sizes[4] < sizes[0], "{sizes:?}");
    }

    #[test]
    fn budget_grows_monotonically_with_acceptance() {
        let mut last = 1;
        let mut seen_off = false;
        for i in 0..=20 {
            let rate = i as f64 / 20.0;
            let b = policy_with(rate, CostCurve::cpu_default()).best(1).budget;
            seen_off |= b.is_off();
            assert!(b.max_nodes >= last, "rate {rate}: {b:?} < {last}");
            assert!(b.max_nodes <= 17 && b.max_depth <= 8);
            last = b.max_nodes;
        }
        assert!(seen_off && last > 1);
    }

    #[test]
    fn expectation_never_falls_with_more_nodes() {
        for rate in [0.1, 0.5, 0.9] {
            let p = policy_with(rate, CostCurve::cpu_default());
            let e: Vec<f64> = (0..=16).map(|k| p.expected_tokens(k)).collect();
            assert_eq!(e[0], 1.0);
            assert!(e.windows(2).all(|w| w[1] >= w[0]), "{rate}: {e:?}");
            // Chains: the first node adds exactly a_1.
            assert!((e[1] - (1.0 + rate)).abs() < 1e-12);
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        let c = CostCurve::cpu_default();
        let cfg = |f: fn(&mut PolicyConfig)| {
            let mut cfg = PolicyConfig::default();
            f(&mut cfg);
            SpecPolicy::new(c.clone(), cfg)
        };
        assert!(cfg(|c| c.max_nodes = 0).is_err());
        assert!(cfg(|c| c.width_gain = 1.0).is_err());
        assert!(cfg(|c| c.prior_accept = -0.1).is_err());
        // Without room for a probe, an off policy stays off.
        let mut p = cfg(|c| c.max_nodes = 1).unwrap();
        assert!((0..40).all(|_| p.decide(1).budget.is_off()));
        let b = Budget {
            max_nodes: 5,
            max_depth: 3,
        };
        assert_eq!(b.limits(100), TreeLimits::new(5, 3, 100));
        assert_eq!(b.drafted(), 4);
    }
}
