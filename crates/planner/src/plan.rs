//! The allocation: which nodes of each session's tree one batched forward
//! verifies (see the crate docs for the objective).

use std::cmp::Ordering;

use specmesh_tree::TokenTree;

use crate::{PlanError, StepModel, unit};

/// The least relative gain in predicted goodput a plan with granted nodes
/// must promise over plain decoding; below it the batch decodes plain.
///
/// The prediction is made of estimates that err: under load the granted
/// nodes' calibrated estimates ran 2–8% above what the target accepted
/// (SmolLM2 at 4 and 16 streams, Intel Xeon), and a speculating step pays
/// costs the plan does not see (the tree waits, the drafter's messages;
/// 1–2% of a step at 16 streams). A plan predicted to win less than that
/// wins nothing on average and loses under the winner's curse (the nodes
/// granted are those whose estimates stand highest). At one stream a
/// plan's predicted gain is tens of per cent, and this changes nothing.
pub const MIN_GAIN: f64 = 0.02;

/// One session's tree as offered to the planner.
#[derive(Debug, Clone, Copy)]
pub struct Offer<'a> {
    pub tree: &'a TokenTree,
    /// The calibrated probability that the target accepts the path to each
    /// node, indexed like the tree (index 0, the root, is ignored).
    pub estimates: &'a [f64],
    /// Granted whole or not at all: the tree carries draft distributions,
    /// and cutting it by its scores would bias rejection sampling (see
    /// `specmesh_tree::merge`). Such a tree is always granted whole: its
    /// size was bounded by the forecast before it was drawn, and a
    /// decision that depended on its draws would bias the output too.
    pub whole: bool,
}

/// What one session gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// Which nodes to verify, indexed like the tree; `keep[0]` is the root
    /// and always true. Ancestor-closed.
    pub keep: Vec<bool>,
    /// Drafted nodes granted.
    pub nodes: usize,
    /// Drafted nodes offered.
    pub offered: usize,
    /// Expected accepted drafted tokens from the granted nodes.
    pub expected: f64,
}

impl Grant {
    /// Whether every offered node is granted.
    pub fn is_whole(&self) -> bool {
        self.nodes == self.offered
    }
}

/// The batch's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub grants: Vec<Grant>,
    /// Tokens in the forward: roots, granted nodes and `extra` tokens.
    pub tokens: usize,
    /// Expected committed tokens (roots' bonus tokens included).
    pub expected_tokens: f64,
    /// Predicted seconds of the step.
    pub seconds: f64,
    /// Predicted seconds of the same batch decoding plain.
    pub plain_seconds: f64,
}

impl Plan {
    /// Predicted committed tokens per second of the plan.
    pub fn goodput(&self) -> f64 {
        self.expected_tokens / self.seconds.max(1e-12)
    }

    /// Predicted goodput of plain decoding: one token per session.
    pub fn plain_goodput(&self) -> f64 {
        self.grants.len() as f64 / self.plain_seconds.max(1e-12)
    }

    /// Drafted nodes granted in all.
    pub fn granted(&self) -> usize {
        self.grants.iter().map(|g| g.nodes).sum()
    }

    /// Drafted nodes offered in all.
    pub fn offered(&self) -> usize {
        self.grants.iter().map(|g| g.offered).sum()
    }
}

/// A candidate node: (estimate, depth, session, node).
#[derive(Debug, Clone, Copy)]
struct Candidate {
    p: f64,
    depth: u32,
    session: u32,
    node: u32,
}

/// The planner, with scratch space reused from step to step.
#[derive(Debug, Default)]
pub struct Planner {
    candidates: Vec<Candidate>,
}

impl Planner {
    /// Plans one forward over `offers` with `extra` more tokens in it that
    /// gain nothing now (prefill chunks sharing the forward) and at most
    /// `max_tokens` tokens in all (roots and whole trees always fit).
    pub fn plan(
        &mut self,
        offers: &[Offer<'_>],
        model: &StepModel,
        extra: usize,
        max_tokens: usize,
    ) -> Result<Plan, PlanError> {
        let mut grants = Vec::with_capacity(offers.len());
        let mut tokens = extra + offers.len();
        let mut expected = offers.len() as f64;
        self.candidates.clear();
        for (s, o) in offers.iter().enumerate() {
            let n = o.tree.len();
            if o.estimates.len() != n {
                return Err(PlanError::EstimatesMismatch {
                    session: s,
                    len: o.estimates.len(),
                    nodes: n,
                });
            }
            let mut keep = vec![false; n];
            keep[0] = true;
            // Non-increasing along every path whatever the caller passed,
            // so a prefix of the sorted order is ancestor-closed.
            let mut p = vec![1.0; n];
            for i in 1..n {
                let parent = o.tree.parent(i).unwrap_or(0);
                p[i] = unit(o.estimates[i]).min(p[parent]);
            }
            let mut g = Grant {
                keep,
                nodes: 0,
                offered: n - 1,
                expected: 0.0,
            };
            if o.whole {
                g.keep.fill(true);
                g.nodes = n - 1;
                g.expected = p[1..].iter().sum();
                tokens += g.nodes;
                expected += g.expected;
            } else {
                self.candidates.extend((1..n).map(|i| Candidate {
                    p: p[i],
                    depth: o.tree.depth(i) as u32,
                    session: s as u32,
                    node: i as u32,
                }));
            }
            grants.push(g);
        }
        // Likeliest first; on ties shallower (so a parent precedes its
        // equally likely child), then by session and node: deterministic.
        self.candidates.sort_unstable_by(|a, b| {
            b.p.partial_cmp(&a.p)
                .unwrap_or(Ordering::Equal)
                .then(a.depth.cmp(&b.depth))
                .then(a.session.cmp(&b.session))
                .then(a.node.cmp(&b.node))
        });
        let plain_seconds = model.step(offers.len() + extra);
        let base_tokens = tokens;
        let base_expected = expected;
        let room = max_tokens
            .saturating_sub(base_tokens)
            .min(self.candidates.len());
        // The time the sessions' tokens are charged: their step without the
        // extra tokens, plus what the nodes add to the forward they share.
        // The extra tokens' work is done either way; charging it to the
        // sessions would make a node look cheap beside it whenever a
        // prefill chunk rides along (on a CPU, whose forward grows linearly
        // past a few tokens, nodes would then be bought that produce
        // tokens dearer than plain decoding does).
        let decode_base = model.step(base_tokens - extra);
        let forward_base = model.step(base_tokens);
        let charged = |tokens: usize| (decode_base + model.step(tokens) - forward_base).max(1e-12);
        // The best prefix: strictly better only, so ties keep the smaller,
        // cheaper plan (and nothing at all when nothing pays).
        let plain = base_expected / charged(base_tokens);
        let mut best = (0usize, plain);
        let mut gain = base_expected;
        for (m, c) in self.candidates[..room].iter().enumerate() {
            gain += c.p;
            let rate = gain / charged(base_tokens + m + 1);
            if rate > best.1 * (1.0 + 1e-12) {
                best = (m + 1, rate);
            }
        }
        if best.1 < plain * (1.0 + MIN_GAIN) {
            best = (0, plain);
        }
        for c in &self.candidates[..best.0] {
            let g = &mut grants[c.session as usize];
            g.keep[c.node as usize] = true;
            g.nodes += 1;
            g.expected += c.p;
            expected += c.p;
        }
        tokens += best.0;
        Ok(Plan {
            grants,
            tokens,
            expected_tokens: expected,
            seconds: model.step(tokens),
            plain_seconds,
        })
    }
}

#[cfg(test)]
mod tests;
