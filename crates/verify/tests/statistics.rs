//! Rejection sampling is lossless: with draft distributions attached, the
//! tokens speculative sampling emits follow the target's distribution
//! exactly, whatever the drafter, and the first candidate is accepted with
//! probability Σ min(p, q).
//!
//! Every test runs 100,000 seeded generations of the first 3 tokens and
//! compares their joint distribution with the target's by Pearson's
//! chi-square at its 1 − 1e-4 quantile (or a 3.72-sigma binomial bound for
//! acceptance rates): with the fixed seeds each test is deterministic, and a
//! correct verifier fails one by chance about once in 10,000 seed choices.

// Each test binary uses part of the shared helpers.
#[allow(dead_code)]
mod common;

use common::{
    Grower, Toy, Z_1E4, chi_square, chi2_quantile, sequence_index, sequence_probs, speculative,
    with_replacement, without_replacement,
};
use std::collections::HashMap;

use rand::SeedableRng;
use rand::rngs::StdRng;
use specmesh_sampling::{SamplingParams, argmax};
use specmesh_tree::{TokenTree, TreeLimits};
use specmesh_verify::verify;

const TRIALS: u64 = 100_000;
const LEN: usize = 3;
const VOCAB: u32 = 5;
const PROMPT: [u32; 2] = [0, 1];

const TARGET: Toy = Toy {
    vocab: VOCAB,
    salt: 11,
    scale: 2.0,
};
const DRAFTER: Toy = Toy {
    vocab: VOCAB,
    salt: 99,
    scale: 2.0,
};

fn limits() -> TreeLimits {
    TreeLimits::new(64, 8, VOCAB)
}

fn params(temperature: f32, top_p: f32, top_k: usize) -> SamplingParams {
    SamplingParams::new(temperature, top_p, top_k, 0).unwrap()
}

/// Generates `TRIALS` sequences of `LEN` tokens with speculation (request
/// seed = trial number) and checks their joint distribution against the
/// target's. Returns the number of accepted draft tokens.
fn assert_lossless(
    base: &SamplingParams,
    mut draft: impl FnMut(&[u32], &mut StdRng) -> TokenTree,
) -> usize {
    let mut rng = StdRng::seed_from_u64(2024);
    let mut counts = vec![0u64; (VOCAB as usize).pow(LEN as u32)];
    let mut accepted = 0;
    for seed in 0..TRIALS {
        let params = SamplingParams {
            seed,
            ..base.clone()
        };
        let tokens = speculative(
            &TARGET,
            &PROMPT,
            LEN,
            &params,
            |c, _| draft(c, &mut rng),
            |_, v| accepted += v.accepted_len(),
        );
        counts[sequence_index(&tokens, VOCAB)] += 1;
    }
    let probs = sequence_probs(&TARGET, &PROMPT, LEN, base);
    let (stat, df) = chi_square(&counts, &probs);
    let limit = chi2_quantile(df, Z_1E4);
    assert!(
        stat < limit,
        "chi-square {stat:.1} over {limit:.1} (df {df})"
    );
    accepted
}

/// A tree whose nodes at depth `d` get `widths[d]` children drawn from the
/// drafter's `q` without replacement; `q` is attached at the depths for
/// which `attach` says so (elsewhere the probability-free rule applies).
fn sampled_tree(
    context: &[u32],
    q: &mut Drafter,
    widths: &[usize],
    attach: impl Fn(usize) -> bool,
    rng: &mut StdRng,
) -> TokenTree {
    let mut g = Grower::new(context, limits()).unwrap();
    let mut frontier = vec![0];
    for (level, &width) in widths.iter().enumerate() {
        let mut next = Vec::new();
        for &node in &frontier {
            let q = q.dist(&g.contexts[node]);
            for t in without_replacement(q, width, rng) {
                next.push(g.push(node, t).unwrap());
            }
            if attach(level) {
                g.builder.set_draft_dist(node, q.to_vec()).unwrap();
            }
        }
        frontier = next;
    }
    g.builder.build()
}

/// The drafter's distributions, memoised: a test revisits the same few
/// thousand contexts 100,000 times, and recomputing them dominated its
/// run time.
struct Drafter {
    params: SamplingParams,
    memo: HashMap<Vec<u32>, Vec<(u32, f32)>>,
}

impl Drafter {
    fn new(params: SamplingParams) -> Drafter {
        Drafter {
            params,
            memo: HashMap::new(),
        }
    }

    fn dist(&mut self, context: &[u32]) -> &[(u32, f32)] {
        if !self.memo.contains_key(context) {
            let q = DRAFTER.dist(context, &self.params);
            self.memo.insert(context.to_vec(), q);
        }
        &self.memo[context]
    }
}

/// A chain of `depth` tokens chosen by `pick` from the target's row, each
/// with a one-hot draft distribution on itself.
fn one_hot_chain(context: &[u32], depth: usize, pick: impl Fn(&[f32]) -> u32) -> TokenTree {
    let mut g = Grower::new(context, limits()).unwrap();
    let mut node = 0;
    for _ in 0..depth {
        let t = pick(&TARGET.logits(&g.contexts[node]));
        let child = g.push(node, t).unwrap();
        g.builder.set_draft_dist(node, vec![(t, 1.0)]).unwrap();
        node = child;
    }
    g.builder.build()
}

#[test]
fn always_wrong_drafts_are_never_accepted_and_cost_nothing() {
    // The target's least likely token is outside its top-3: q's whole mass
    // lies outside p's support.
    let argmin = |row: &[f32]| {
        let neg: Vec<f32> = row.iter().map(|v| -v).collect();
        argmax(&neg)
    };
    let accepted = assert_lossless(&params(1.0, 1.0, 3), |c, _| one_hot_chain(c, 3, argmin));
    assert_eq!(accepted, 0);
}

#[test]
fn the_target_mode_as_draft_is_lossless() {
    let accepted = assert_lossless(&params(1.0, 0.9, 0), |c, _| one_hot_chain(c, 3, argmax));
    assert!(accepted > 0);
}

#[test]
fn a_different_drafter_sampled_without_replacement_is_lossless() {
    // Truncated target (temperature, top-k and top-p) against a sparse
    // drafter (its top 3): mass on both sides lies outside the other's
    // support. q at every depth.
    let mut q = Drafter::new(params(1.0, 1.0, 3));
    assert_lossless(&params(0.8, 0.95, 4), |c, rng| {
        sampled_tree(c, &mut q, &[2, 2, 1], |_| true, rng)
    });
}

#[test]
fn draft_distributions_at_some_depths_only_are_lossless() {
    // Full-vocabulary q at depths 0 and 2, the probability-free rule at
    // depth 1.
    let mut q = Drafter::new(params(1.3, 1.0, 0));
    assert_lossless(&params(1.0, 1.0, 0), |c, rng| {
        sampled_tree(c, &mut q, &[3, 1, 2], |level| level != 1, rng)
    });
}

#[test]
fn duplicate_proposals_collapse_and_stay_lossless() {
    // Four draws with replacement per node: duplicates collapse in the
    // builder, and the distinct tokens in order of first appearance are a
    // sample without replacement, so q may stay attached.
    let mut q = Drafter::new(params(0.7, 1.0, 0));
    let mut collapsed = 0;
    assert_lossless(&params(1.0, 1.0, 0), |c, rng| {
        let mut g = Grower::new(c, limits()).unwrap();
        let mut frontier = vec![0];
        for _ in 0..2 {
            let mut next = Vec::new();
            for &node in &frontier {
                let q = q.dist(&g.contexts[node]);
                let draws = with_replacement(q, 4, rng);
                let mut distinct: Vec<u32> = Vec::new();
                for &t in &draws {
                    let child = g.push(node, t).unwrap();
                    if !distinct.contains(&t) {
                        distinct.push(t);
                        next.push(child);
                    }
                }
                collapsed += draws.len() - distinct.len();
                g.builder.set_draft_dist(node, q.to_vec()).unwrap();
                let tree_children: Vec<u32> = next[next.len() - distinct.len()..]
                    .iter()
                    .map(|&n| g.builder.token(n))
                    .collect();
                assert_eq!(tree_children, distinct);
            }
            frontier = next;
        }
        let tree = g.builder.build();
        for node in 0..tree.len() {
            let mut kids: Vec<u32> = tree
                .children(node)
                .iter()
                .map(|&k| tree.token(k as usize))
                .collect();
            let n = kids.len();
            kids.sort_unstable();
            kids.dedup();
            assert_eq!(kids.len(), n, "node {node} has duplicate children");
        }
        tree
    });
    assert!(collapsed > 0);
}

/// The fraction of trials whose first candidate at the root is accepted,
/// against Σ min(p, q) at a 3.72-sigma binomial bound.
fn assert_first_acceptance(params: &SamplingParams, q: &[(u32, f32)], width: usize) {
    let context = PROMPT.to_vec();
    let row = TARGET.logits(&context);
    let p = params.distribution(&row);
    let expected: f64 = p
        .iter()
        .map(|&(t, pt)| {
            let qt = q.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1 as f64);
            pt.min(qt)
        })
        .sum();
    let mut rng = StdRng::seed_from_u64(7);
    let mut hits = 0u64;
    for seed in 0..TRIALS {
        let mut g = Grower::new(&context, limits()).unwrap();
        for t in without_replacement(q, width, &mut rng) {
            g.push(0, t).unwrap();
        }
        g.builder.set_draft_dist(0, q.to_vec()).unwrap();
        let tree = g.builder.build();
        let rows = vec![row.clone(); tree.len()];
        let params = SamplingParams {
            seed,
            ..params.clone()
        };
        let v = verify(&tree, &rows, &params, 0, 0).unwrap();
        if v.path.get(1) == tree.children(0).first().map(|&c| c as usize).as_ref() {
            hits += 1;
        }
    }
    let n = TRIALS as f64;
    let rate = hits as f64 / n;
    let sd = (expected * (1.0 - expected) / n).sqrt().max(1.0 / n);
    assert!(
        (rate - expected).abs() < Z_1E4 * sd,
        "first candidate accepted {rate:.4}, Σ min(p, q) = {expected:.4}"
    );
}

#[test]
fn first_candidate_acceptance_is_the_overlap_of_p_and_q() {
    let q_full = DRAFTER.dist(&PROMPT, &params(1.0, 1.0, 0));
    let q_sparse = DRAFTER.dist(&PROMPT, &params(1.0, 1.0, 2));
    assert_first_acceptance(&params(1.0, 1.0, 0), &q_full, 1);
    assert_first_acceptance(&params(1.0, 1.0, 0), &q_full, 3);
    assert_first_acceptance(&params(0.7, 0.9, 3), &q_sparse, 2);
}
