use proptest::prelude::*;
use specmesh_tree::{TokenTree, TreeBuilder, TreeLimits};

use super::*;

/// A chain of drafted nodes with these scores.
fn chain(scores: &[f32]) -> TokenTree {
    let mut b = TreeBuilder::new(1, TreeLimits::new(64, 64, 1000)).unwrap();
    for (i, &s) in scores.iter().enumerate() {
        b.push(i, 10 + i as u32, s).unwrap();
    }
    b.build()
}

fn estimates(t: &TokenTree) -> Vec<f64> {
    (0..t.len()).map(|i| f64::from(t.score(i))).collect()
}

/// A CPU-like curve: extra tokens cost 15% of a step each up to 4, then
/// ~linear (the SmolLM2 curve of docs/performance.md).
fn cpu() -> StepModel {
    StepModel::from_curve(
        0.01,
        &[
            (1, 1.0),
            (2, 1.18),
            (4, 1.47),
            (8, 2.17),
            (16, 3.71),
            (64, 13.6),
        ],
    )
    .unwrap()
}

/// A GPU-like curve: flat to 64 tokens.
fn flat() -> StepModel {
    StepModel::from_curve(0.01, &[(1, 1.0), (64, 1.05), (1024, 2.0)]).unwrap()
}

fn plan(offers: &[Offer<'_>], model: &StepModel) -> Plan {
    Planner::default()
        .plan(offers, model, 0, usize::MAX)
        .unwrap()
}

fn offer<'a>(t: &'a TokenTree, e: &'a [f64]) -> Offer<'a> {
    Offer {
        tree: t,
        estimates: e,
        whole: false,
    }
}

#[test]
fn unlikely_nodes_are_not_verified() {
    let t = chain(&[0.05, 0.01]);
    let e = estimates(&t);
    let p = plan(&[offer(&t, &e)], &cpu());
    assert_eq!(p.granted(), 0);
    assert_eq!(p.grants[0].keep, vec![true, false, false]);
    assert_eq!(p.tokens, 1);
    assert!((p.goodput() - p.plain_goodput()).abs() < 1e-9);
}

#[test]
fn likely_nodes_are_verified_when_the_forward_is_flat() {
    let t = chain(&[0.9, 0.8, 0.7, 0.6]);
    let e = estimates(&t);
    let p = plan(&[offer(&t, &e)], &flat());
    assert_eq!(p.granted(), 4);
    assert!(p.grants[0].is_whole());
    assert!((p.expected_tokens - 4.0).abs() < 1e-6);
}

#[test]
fn the_budget_goes_to_the_better_tree() {
    let good = chain(&[0.95, 0.9, 0.85, 0.8, 0.75, 0.7]);
    let poor = chain(&[0.3, 0.1, 0.05, 0.01, 0.01, 0.01]);
    let (eg, ep) = (estimates(&good), estimates(&poor));
    let p = plan(&[offer(&poor, &ep), offer(&good, &eg)], &cpu());
    assert!(p.grants[1].nodes > p.grants[0].nodes, "{p:?}");
    assert!(p.grants[1].nodes >= 3);
    assert_eq!(p.grants[0].nodes, 0);
}

#[test]
fn under_load_the_batch_drafts_less() {
    let t = chain(&[0.8, 0.6, 0.45, 0.3]);
    let e = estimates(&t);
    let one = plan(&[offer(&t, &e)], &cpu()).granted();
    let offers: Vec<_> = (0..16).map(|_| offer(&t, &e)).collect();
    let sixteen = plan(&offers, &cpu());
    assert!(
        sixteen.granted() < 16 * one,
        "{one} alone, {} in 16",
        sixteen.granted()
    );
    // Identical sessions get the same grant, give or take the last node.
    let (lo, hi) = sixteen.grants.iter().fold((usize::MAX, 0), |(lo, hi), g| {
        (lo.min(g.nodes), hi.max(g.nodes))
    });
    assert!(hi - lo <= 1);
}

#[test]
fn a_plan_that_wins_too_little_is_not_bought() {
    // Ten sessions with nothing drafted and one with a single node. On a
    // flat forward the node's share of the batch's tokens is all it wins:
    // 0.15 of 10 roots is 1.5%, below the least gain; 0.3 is 3%, above.
    let roots: Vec<TokenTree> = (0..10).map(|_| chain(&[])).collect();
    let root_estimates: Vec<Vec<f64>> = roots.iter().map(estimates).collect();
    for (p, granted) in [(0.15, 0), (0.3, 1)] {
        let t = chain(&[p]);
        let e = estimates(&t);
        let mut offers: Vec<_> = roots
            .iter()
            .zip(&root_estimates)
            .map(|(t, e)| offer(t, e))
            .collect();
        offers.push(offer(&t, &e));
        let plan = plan(&offers, &flat());
        assert_eq!(plan.granted(), granted, "p = {p}");
        assert!(plan.goodput() >= plan.plain_goodput() * (1.0 - 1e-9));
    }
}

#[test]
fn fixed_step_cost_makes_speculation_pay_more() {
    let t = chain(&[0.5, 0.25, 0.12]);
    let e = estimates(&t);
    let offers: Vec<_> = (0..8).map(|_| offer(&t, &e)).collect();
    let without = plan(&offers, &cpu()).granted();
    let mut m = cpu();
    for _ in 0..100 {
        m.observe_fixed(0.05);
    }
    let with = plan(&offers, &m).granted();
    assert!(with > without, "{without} -> {with}");
}

#[test]
fn whole_trees_are_granted_whole_and_counted() {
    let t = chain(&[0.01, 0.01, 0.01]);
    let e = estimates(&t);
    let p = plan(
        &[Offer {
            tree: &t,
            estimates: &e,
            whole: true,
        }],
        &cpu(),
    );
    assert_eq!(p.grants[0].nodes, 3);
    assert_eq!(p.tokens, 4);
}

#[test]
fn a_prefill_chunk_alongside_is_not_charged_to_the_nodes() {
    // Four sessions with middling chains on the CPU curve, with and without
    // a 32-token chunk in the forward. Past 8 tokens a node costs the
    // curve's slope; charged the chunk's time too it would look cheap.
    let t = chain(&[0.5, 0.45, 0.4, 0.35]);
    let e = estimates(&t);
    let offers = [offer(&t, &e), offer(&t, &e), offer(&t, &e), offer(&t, &e)];
    let alone = Planner::default()
        .plan(&offers, &cpu(), 0, usize::MAX)
        .unwrap();
    let fused = Planner::default()
        .plan(&offers, &cpu(), 32, usize::MAX)
        .unwrap();
    assert_eq!(fused.tokens, 32 + 4 + fused.granted());
    assert!(fused.seconds > alone.seconds);
    assert!(
        fused.granted() <= alone.granted(),
        "{} granted with the chunk, {} without",
        fused.granted(),
        alone.granted()
    );
    // Nodes that are free beside the chunk (a flat curve) are still bought.
    let free = Planner::default()
        .plan(&offers, &flat(), 32, usize::MAX)
        .unwrap();
    assert_eq!(free.granted(), 16);
}

#[test]
fn the_token_cap_holds() {
    let t = chain(&[0.99; 10]);
    let e = estimates(&t);
    let offers = [offer(&t, &e), offer(&t, &e)];
    let p = Planner::default().plan(&offers, &flat(), 3, 9).unwrap();
    assert_eq!(p.tokens, 9);
    assert_eq!(p.granted(), 4);
}

#[test]
fn bad_estimates_are_clamped_never_propagated() {
    let t = chain(&[0.5, 0.5, 0.5, 0.5]);
    let e = vec![1.0, f64::NAN, -3.0, 7.0, f64::INFINITY];
    let p = plan(&[offer(&t, &e)], &flat());
    // NaN is 0, so nothing below it is likelier: nothing pays.
    assert_eq!(p.granted(), 0);
    assert!(p.expected_tokens.is_finite());
    let e = vec![1.0, 7.0, 0.9, f64::NAN, 0.9];
    let p = plan(&[offer(&t, &e)], &flat());
    assert_eq!(p.grants[0].keep, vec![true, true, true, false, false]);
    assert!((p.expected_tokens - 2.9).abs() < 1e-9);
    let short = vec![1.0];
    assert!(
        Planner::default()
            .plan(&[offer(&t, &short)], &flat(), 0, 64)
            .is_err()
    );
}

#[test]
fn an_empty_batch_plans_nothing() {
    let p = plan(&[], &cpu());
    assert!(p.grants.is_empty());
    assert_eq!(p.tokens, 0);
}

fn arb_tree() -> impl Strategy<Value = (TokenTree, Vec<f64>)> {
    prop::collection::vec((0usize..64, 0.0f32..=1.0, -0.5f64..1.5), 0..24).prop_map(|nodes| {
        let mut b = TreeBuilder::new(1, TreeLimits::new(64, 64, 1000)).unwrap();
        let mut e = vec![1.0];
        for (i, (parent, score, est)) in nodes.into_iter().enumerate() {
            let parent = parent % (i + 1);
            b.push(parent, 10 + i as u32, score).unwrap();
            e.push(est);
        }
        (b.build(), e)
    })
}

proptest! {
    #[test]
    fn plans_are_ancestor_closed_deterministic_and_never_worse_than_plain(
        trees in prop::collection::vec(arb_tree(), 0..12),
        fixed in 0.0f64..0.05,
        cap in 0usize..200,
    ) {
        let mut m = cpu();
        for _ in 0..50 { m.observe_fixed(fixed); }
        let offers: Vec<_> = trees.iter().map(|(t, e)| offer(t, e)).collect();
        let a = Planner::default().plan(&offers, &m, 0, cap.max(offers.len())).unwrap();
        let b = Planner::default().plan(&offers, &m, 0, cap.max(offers.len())).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert!(a.goodput() >= a.plain_goodput() * (1.0 - 1e-9));
        // Nodes are bought only for at least the least gain.
        if a.granted() > 0 {
            prop_assert!(a.goodput() >= a.plain_goodput() * (1.0 + MIN_GAIN) * (1.0 - 1e-9));
        }
        prop_assert!(a.tokens <= cap.max(offers.len()));
        for (g, (t, _)) in a.grants.iter().zip(&trees) {
            prop_assert!(g.keep[0]);
            for i in 1..t.len() {
                if g.keep[i] {
                    prop_assert!(g.keep[t.parent(i).unwrap()]);
                }
            }
            prop_assert_eq!(g.nodes, g.keep.iter().filter(|&&k| k).count() - 1);
            prop_assert!(t.retain(&g.keep).is_ok());
        }
    }
}
