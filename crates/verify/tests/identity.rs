//! Speculation changes nothing but speed: greedy speculative decoding emits
//! exactly plain greedy decoding's tokens, and seeded sampling with
//! probability-free trees exactly plain seeded sampling's, whatever the
//! drafter proposed.

// Each test binary uses part of the shared helpers.
#[allow(dead_code)]
mod common;

use common::{Grower, Toy, plain, speculative};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use specmesh_sampling::{SamplingParams, sample};
use specmesh_tree::{TokenTree, TreeLimits};

/// What shape of random trees a case drafts.
#[derive(Clone, Debug)]
struct Drafting {
    seed: u64,
    max_nodes: usize,
    max_depth: usize,
    /// Chance that a proposal is the token plain decoding would emit there.
    right: f64,
    /// Chance that a node with children gets a draft distribution.
    with_q: f64,
}

fn drafting() -> impl Strategy<Value = Drafting> {
    (
        any::<u64>(),
        1usize..24,
        1usize..7,
        0.0..1.0f64,
        0.0..1.0f64,
    )
        .prop_map(|(seed, max_nodes, max_depth, right, with_q)| Drafting {
            seed,
            max_nodes,
            max_depth,
            right,
            with_q,
        })
}

/// A random tree: proposals under random parents, each either the token
/// plain decoding emits at that node (the target's argmax, or its sampled
/// token at that position) or a random one; some nodes get a draft
/// distribution covering their children.
fn random_tree(
    model: &Toy,
    context: &[u32],
    position: u64,
    params: &SamplingParams,
    d: &Drafting,
    rng: &mut StdRng,
) -> TokenTree {
    let limits = TreeLimits::new(d.max_nodes, d.max_depth, model.vocab);
    let mut g = Grower::new(context, limits).unwrap();
    for _ in 0..2 * d.max_nodes {
        if g.builder.is_full() {
            break;
        }
        let parent = rng.random_range(0..g.builder.len());
        let depth = g.builder.depth(parent);
        if depth >= d.max_depth {
            continue;
        }
        let token = if rng.random_bool(d.right) {
            let row = model.logits(&g.contexts[parent]);
            sample(&row, params, position + depth as u64)
        } else {
            rng.random_range(0..model.vocab)
        };
        g.push(parent, token).unwrap();
    }
    let mut tree = g.builder.clone();
    for node in 0..g.builder.len() {
        if rng.random_bool(d.with_q) {
            // Uniform over the whole vocabulary: covers any children.
            let q = (0..model.vocab)
                .map(|t| (t, 1.0 / model.vocab as f32))
                .collect();
            tree.set_draft_dist(node, q).unwrap();
        }
    }
    tree.build()
}

fn toy(vocab: u32, salt: u64) -> Toy {
    Toy {
        vocab,
        salt,
        scale: 3.0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn greedy_speculative_is_greedy_plain(
        vocab in 2u32..16,
        salt in any::<u64>(),
        prompt in prop::collection::vec(0u32..2, 1..4),
        n in 1usize..40,
        d in drafting(),
    ) {
        let model = toy(vocab, salt);
        let params = SamplingParams::greedy();
        let want = plain(&model, &prompt, n, &params);
        let mut rng = StdRng::seed_from_u64(d.seed);
        // Greedy ignores draft distributions, so trees carry them too.
        let got = speculative(&model, &prompt, n, &params,
            |c, pos| random_tree(&model, c, pos, &params, &d, &mut rng), |_, _| {});
        prop_assert_eq!(got, want);
    }

    #[test]
    fn seeded_speculative_sampling_is_seeded_plain_sampling(
        vocab in 2u32..16,
        salt in any::<u64>(),
        seed in any::<u64>(),
        temperature in 0.3f32..2.0,
        top_p in 0.5f32..=1.0,
        top_k in 0usize..6,
        prompt in prop::collection::vec(0u32..2, 1..4),
        n in 1usize..40,
        d in drafting(),
    ) {
        let model = toy(vocab, salt);
        let params = SamplingParams::new(temperature, top_p, top_k, seed).unwrap();
        let want = plain(&model, &prompt, n, &params);
        let mut rng = StdRng::seed_from_u64(d.seed);
        // Probability-free trees: the identity is rule 2's promise.
        let d = Drafting { with_q: 0.0, ..d };
        let got = speculative(&model, &prompt, n, &params,
            |c, pos| random_tree(&model, c, pos, &params, &d, &mut rng), |_, _| {});
        prop_assert_eq!(got, want);
    }
}

/// Trees that always contain the right answer accept it every time: the
/// walk is not merely falling back to the bonus.
#[test]
fn right_proposals_are_accepted_in_both_modes() {
    let model = toy(12, 7);
    let prompt = [1, 0];
    for params in [
        SamplingParams::greedy(),
        SamplingParams::new(0.9, 0.95, 0, 42).unwrap(),
    ] {
        let want = plain(&model, &prompt, 40, &params);
        let d = Drafting {
            seed: 0,
            max_nodes: 16,
            max_depth: 4,
            right: 1.0,
            with_q: 0.0,
        };
        let mut rng = StdRng::seed_from_u64(1);
        let mut rounds = 0;
        let got = speculative(
            &model,
            &prompt,
            40,
            &params,
            |c, pos| random_tree(&model, c, pos, &params, &d, &mut rng),
            |t, v| {
                rounds += 1;
                // Every proposal is right, so the walk goes to the deepest
                // node of the right chain, which is the tree's maximum depth.
                assert_eq!(v.accepted_len(), t.max_depth());
            },
        );
        assert_eq!(got, want);
        assert!(rounds < 40, "{rounds} rounds for 40 tokens");
    }
}
