//! Drafting ahead and late trees: what a guess becomes once its outcome
//! is applied, and what the policy learns from a tree the verifier never
//! verified.

use super::*;
use crate::session::ledger::Awaited;

/// The guess of a session that drafted its first tree from `repetitive()`
/// (root 4, drafting 5 1 2 …): the target accepts 5, then (guessed) 1
/// under which 2 3 follow, or 7 with nothing under it.
fn guessed(s: &mut DraftSession) -> Plan {
    let plan = Plan {
        step: 1,
        arm: Arm::ModelFree,
        budget: Budget {
            max_nodes: 9,
            max_depth: 6,
        },
    };
    let limits = specmesh_draft::TreeLimits::new(8, 4, 100);
    let mut b = specmesh_tree::TreeBuilder::new(5, limits).unwrap();
    let one = b.push(0, 1, 0.9).unwrap();
    b.push(0, 7, 0.05).unwrap();
    let two = b.push(one, 2, 0.8).unwrap();
    b.push(two, 3, 0.7).unwrap();
    s.guesses.pending = Some(crate::session::guess::Guess {
        base: s.context.len(),
        assumed: vec![5],
        tree: b.build(),
        plan,
    });
    plan
}

#[test]
fn a_guess_that_held_is_the_next_tree_and_any_other_is_dropped() {
    // Held: 5 accepted, then 1, under which the guess drafted 2 3.
    let mut s = session(repetitive(), 8, 1000);
    first_tree(&mut s);
    let plan = guessed(&mut s);
    apply(&mut s, outcome(0, vec![0, 1], vec![5, 1])).unwrap();
    assert!(!s.blocks(&plan) && s.has_ready(&plan));
    let sent = s.draft(plan).unwrap();
    assert!(sent.wire().drafted_ahead);
    assert_eq!(sent.wire().root_token, 1);
    let tokens: Vec<u32> = sent.wire().nodes.iter().map(|n| n.token).collect();
    assert_eq!(tokens, [2, 3]);
    assert_eq!(s.guess_stats().hits, 1);
    assert!(
        s.exposed_drafting() == 1.0,
        "drafting ahead is off: nothing hidden"
    );

    // The target's own token was 7, a guess with nothing under it.
    let mut s = session(repetitive(), 8, 1000);
    first_tree(&mut s);
    let plan = guessed(&mut s);
    apply(&mut s, outcome(0, vec![0, 1], vec![5, 7])).unwrap();
    assert!(!s.has_ready(&plan));
    assert!(!s.draft(plan).unwrap().wire().drafted_ahead);

    // The path was not accepted: the guess's context is not the session's.
    let mut s = session(repetitive(), 8, 1000);
    first_tree(&mut s);
    let plan = guessed(&mut s);
    apply(&mut s, outcome(0, vec![0], vec![1])).unwrap();
    assert!(!s.has_ready(&plan) && s.guesses.pending.is_none());

    // A guess for another plan is not sent for this one.
    let mut s = session(repetitive(), 8, 1000).with_draft_ahead(true);
    first_tree(&mut s);
    let plan = guessed(&mut s);
    apply(&mut s, outcome(0, vec![0, 1], vec![5, 1])).unwrap();
    let other = Plan {
        budget: Budget {
            max_nodes: plan.budget.max_nodes + 1,
            ..plan.budget
        },
        ..plan
    };
    assert!(!s.has_ready(&other));
    assert!(!s.draft(other).unwrap().wire().drafted_ahead);
    assert!(
        s.exposed_drafting() < 1.0,
        "the guess held: less of drafting is seen"
    );
}

#[test]
fn a_tree_the_verifier_did_not_verify_counts_as_rejected() {
    let rate = |s: &DraftSession| s.arms.policy(Arm::ModelFree).unwrap().stats().rate(1);
    let mut s = session(repetitive(), 8, 1000);
    let before = rate(&s);
    let tree = first_tree(&mut s);
    assert!(!tree.nodes.is_empty());
    // An empty path: the tree came too late and the root was verified alone.
    apply(&mut s, outcome(0, vec![], vec![5])).unwrap();
    assert!(rate(&s) < before, "{} then {}", before, rate(&s));
    assert_eq!(s.output().last(), Some(&5));
}

#[test]
fn outcomes_teach_the_verifiers_forward_and_the_links_round_trip() {
    let mut s = session(repetitive(), 8, 1000);
    assert_eq!(s.live_times(), (None, None));
    first_tree(&mut s);
    let mut o = outcome(0, vec![0, 1], vec![5, 1]);
    o.forward_us = 84_000;
    o.tree_wait_us = 6_000;
    apply(&mut s, o).unwrap();
    let (verify, link) = s.live_times();
    assert!((verify.unwrap() - 0.084).abs() < 1e-9, "{verify:?}");
    // The wait less the (microseconds of) model-free drafting.
    assert!(link.unwrap() > 0.005 && link.unwrap() <= 0.006, "{link:?}");

    // While a guess was running, the wait is not the link's.
    let plan = s.plan(1);
    s.draft(plan).unwrap();
    let _ = guessed(&mut s);
    let mut o = outcome(1, vec![0], vec![9]);
    o.forward_us = 84_000;
    o.tree_wait_us = 90_000;
    apply(&mut s, o).unwrap();
    assert_eq!(s.live_times().1, link);
}

#[test]
fn model_forwards_that_drafted_nothing_teach_a_refusal() {
    // Step 0's tree came back empty: through text, the model's one path
    // may end inside a target token and be dropped.
    let run = |forwards: u64| {
        let mut s = session(repetitive(), 8, 1000);
        first_tree(&mut s);
        let root = *s.context.last().unwrap();
        let limits = specmesh_draft::TreeLimits::new(8, 4, 100);
        s.ledger.awaited = Some(Awaited::Tree {
            step: 0,
            tree: TokenTree::root_only(root, limits).unwrap(),
            arm: Arm::ModelFree,
        });
        s.clock.last_draft = (0.02, forwards, 0);
        let before = s.arms.policy(Arm::ModelFree).unwrap().stats().rate(1);
        apply(&mut s, outcome(0, vec![], vec![5])).unwrap();
        let after = s.arms.policy(Arm::ModelFree).unwrap().stats().rate(1);
        (before, after)
    };
    // Forwards paid for nothing: depth 1 counts as offered and refused.
    let (before, after) = run(2);
    assert!(after < before, "{before} -> {after}");
    // A plain step that ran no forward teaches nothing.
    let (before, after) = run(0);
    assert_eq!(after, before);
}
