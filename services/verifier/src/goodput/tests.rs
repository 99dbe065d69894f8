use super::*;
use specmesh_tree::{TreeBuilder, TreeLimits};

fn chain(scores: &[f32]) -> TokenTree {
    let mut b = TreeBuilder::new(1, TreeLimits::new(32, 32, 100)).unwrap();
    for (i, &s) in scores.iter().enumerate() {
        b.push(i, 10 + i as u32, s).unwrap();
    }
    b.build()
}

/// A grant of a whole tree of `offered` nodes, expected to gain
/// `expected` accepted tokens.
fn whole(offered: usize, expected: f64) -> Granted {
    Granted {
        offered,
        expected,
        kept: None,
    }
}

fn plan_for(g: &mut Goodput, trees: &mut [TokenTree], s: &[&SessionPlanning]) -> BatchPlan {
    let mut refs: Vec<&mut TokenTree> = trees.iter_mut().collect();
    g.plan(&mut refs, s, 0)
}

fn cpu() -> StepModel {
    StepModel::from_curve(0.01, &[(1, 1.0), (2, 1.2), (4, 1.5), (16, 3.7), (64, 13.6)]).unwrap()
}

#[test]
fn prunes_to_the_grant_and_maps_back() {
    let mut g = Goodput::new(true, 512, cpu());
    let s = SessionPlanning::new(Sources::Auto, 16);
    let mut trees = vec![chain(&[0.95, 0.9, 0.05, 0.01])];
    let plan = plan_for(&mut g, &mut trees, &[&s]);
    assert_eq!(plan.proposed, 4);
    assert_eq!(trees[0].draft_len(), plan.granted);
    assert!(plan.granted >= 1 && plan.granted < 4, "{plan:?}");
    let grant = &plan.grants[0];
    assert_eq!(grant.original(0), 0);
    assert_eq!(grant.granted_wire().unwrap().len(), plan.granted);
}

#[test]
fn a_session_whose_gain_does_not_pay_its_overhead_is_told_to_stop() {
    let mut g = Goodput::new(true, 512, cpu());
    // Each speculating session adds 2 ms to the step.
    for i in 0..200 {
        g.observe_gap(i % 5, 0.001 + 0.002 * (i % 5) as f64);
    }
    assert!((g.overhead_per_session() - 0.002).abs() < 1e-4);
    let mut trees = vec![chain(&[0.95]), chain(&[0.95])];
    let (a, b) = (
        SessionPlanning::new(Sources::Auto, 16),
        SessionPlanning::new(Sources::Auto, 16),
    );
    plan_for(&mut g, &mut trees, &[&a, &b]);
    let mut s = SessionPlanning::new(Sources::Auto, 16);
    let poor = whole(4, 0.01);
    for _ in 0..30 {
        g.learn(&mut s, &chain(&[0.1]), &[0], &poor);
    }
    assert_eq!(s.node_budget(), 0);
    let good = whole(4, 3.0);
    for _ in 0..30 {
        g.learn(&mut s, &chain(&[0.9, 0.9, 0.9]), &[0, 1, 2, 3], &good);
    }
    assert!(s.node_budget() > 0);
}

#[test]
fn a_prefill_chunk_in_the_forward_counts_in_its_tokens_and_cost() {
    let mut g = Goodput::new(true, 512, cpu());
    let s = SessionPlanning::new(Sources::Auto, 16);
    let scores = [0.3; 8];
    let mut alone = vec![chain(&scores)];
    let alone = plan_for(&mut g, &mut alone, &[&s]);
    let mut fused = [chain(&scores)];
    let fused = {
        let mut refs: Vec<&mut TokenTree> = fused.iter_mut().collect();
        g.plan(&mut refs, &[&s], 32)
    };
    assert_eq!(fused.tokens, 32 + 1 + fused.granted);
    assert_eq!(alone.tokens, 1 + alone.granted);
    assert!(fused.predicted_seconds > alone.predicted_seconds);
    // Past the flat part of the curve a node costs the slope there;
    // the chunk's own time is not charged to the session's tokens, so
    // riding with it never makes a node pay that would not alone.
    assert!(fused.granted <= alone.granted, "{alone:?} {fused:?}");
    // The token cap counts the chunk too.
    let mut capped = Goodput::new(true, 36, cpu());
    let mut trees = [chain(&scores)];
    let mut refs: Vec<&mut TokenTree> = trees.iter_mut().collect();
    assert!(capped.plan(&mut refs, &[&s], 32).tokens <= 36);
}

#[test]
fn drafting_that_slows_the_forward_is_priced_in() {
    use crate::drafting::SETTLE;
    use std::time::Duration;
    // Forwards of 4 tokens taking what the model says (15 ms) plus
    // `slowdown` seconds per second of drafting during them; a session
    // gaining 0.3 tokens a step whose drafter computes 6 ms a tree.
    let told_to_draft = |slowdown: f64| {
        let mut g = Goodput::new(true, 512, cpu());
        let log = DraftingLog::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for i in 0..300u64 {
            let start = at(40 * i);
            let overlap = 0.002 * (i % 4) as f64;
            let d = Duration::from_secs_f64(overlap);
            log.record(start + d, None, d, Duration::ZERO);
            g.forward_done(1, 4, start, 0.015 + slowdown * overlap);
            g.settle(&log, start);
        }
        g.settle(&log, at(40 * 300) + SETTLE);
        for _ in 0..50 {
            let mut trees = vec![chain(&[0.5])];
            let p = SessionPlanning::new(Sources::ModelFree, 16);
            plan_for(&mut g, &mut trees, &[&p]);
        }
        let mut s = SessionPlanning::new(Sources::ModelFree, 16);
        let grant = whole(2, 0.3);
        for _ in 0..40 {
            s.drafted(None, Some(0.006));
            g.learn(&mut s, &chain(&[0.5, 0.5]), &[0, 1], &grant);
        }
        (g.contention.slowdown(), s.node_budget() > 0)
    };
    let (slowdown, drafts) = told_to_draft(1.0);
    assert!((slowdown - 1.0).abs() < 0.05, "{slowdown}");
    assert!(
        !drafts,
        "on shared cores its drafting costs more than it gains"
    );
    // A drafter on another host: the forward does not slow down.
    let (slowdown, drafts) = told_to_draft(0.0);
    assert!(slowdown < 0.05, "{slowdown}");
    assert!(drafts);
}

#[test]
fn what_the_planner_expects_is_what_the_target_accepts() {
    // Two sibling drafts scored 0.6: the target takes the first two
    // steps in three, the second never. Each bin's rate alone expects
    // 1.2 tokens a step where 0.67 come.
    let siblings = || {
        let mut b = TreeBuilder::new(1, TreeLimits::new(8, 8, 100)).unwrap();
        b.push(0, 10, 0.6).unwrap();
        b.push(0, 11, 0.6).unwrap();
        b.build()
    };
    let mut g = Goodput::new(true, 512, cpu());
    let mut s = SessionPlanning::new(Sources::ModelFree, 16);
    let (mut expected, mut accepted) = (0.0, 0.0);
    for i in 0..1500 {
        let mut trees = vec![siblings()];
        let plan = plan_for(&mut g, &mut trees, &[&s]);
        let t = &trees[0];
        let path = match t.child_with(0, 10) {
            Some(c) if i % 3 != 0 => vec![0, c],
            _ => vec![0],
        };
        if i >= 1000 {
            expected += plan.expected;
            accepted += (path.len() - 1) as f64;
        }
        g.learn(&mut s, t, &path, &plan.grants[0]);
    }
    assert!(accepted > 100.0, "the drafts are still verified");
    assert!(
        (expected / accepted - 1.0).abs() < 0.05,
        "expected {expected}, accepted {accepted}"
    );
}

#[test]
fn disabled_verifies_whole_trees() {
    let mut g = Goodput::new(false, 512, cpu());
    let s = SessionPlanning::new(Sources::Auto, 16);
    let mut trees = vec![chain(&[0.01, 0.01])];
    let plan = plan_for(&mut g, &mut trees, &[&s]);
    assert_eq!(plan.granted, 2);
    assert_eq!(trees[0].draft_len(), 2);
    assert!(plan.grants[0].kept.is_none());
}

#[test]
fn each_kind_of_drafting_is_calibrated_apart() {
    // An auto session whose model-free trees of score 0.15 were always
    // accepted and whose draft-model trees of that score never were.
    let mut g = Goodput::new(true, 512, cpu());
    let mut s = SessionPlanning::new(Sources::Auto, 16);
    let grant = whole(2, 1.0);
    for _ in 0..40 {
        s.drafted(Some(Sources::ModelFree), None);
        g.learn(&mut s, &chain(&[0.15, 0.15]), &[0, 1, 2], &grant);
        s.drafted(Some(Sources::DraftModel), None);
        g.learn(&mut s, &chain(&[0.15, 0.15]), &[0], &grant);
    }
    let granted = |g: &mut Goodput, s: &mut SessionPlanning, by| {
        s.drafted(by, None);
        let mut trees = vec![chain(&[0.15, 0.15])];
        plan_for(g, &mut trees, &[&*s]).granted
    };
    assert_eq!(granted(&mut g, &mut s, Some(Sources::ModelFree)), 2);
    assert_eq!(granted(&mut g, &mut s, Some(Sources::DraftModel)), 0);
    // A new model-free session starts from the model-free trees of
    // the auto one; a new auto session's draft-model trees from its
    // draft-model trees.
    let mut fresh = SessionPlanning::new(Sources::ModelFree, 16);
    assert_eq!(granted(&mut g, &mut fresh, None), 2);
    let mut fresh = SessionPlanning::new(Sources::Auto, 16);
    assert_eq!(granted(&mut g, &mut fresh, Some(Sources::ModelFree)), 2);
    assert_eq!(granted(&mut g, &mut fresh, Some(Sources::DraftModel)), 0);
}

#[test]
fn learning_moves_the_forecast_and_the_calibration() {
    let mut g = Goodput::new(true, 512, cpu());
    let mut s = SessionPlanning::new(Sources::ModelFree, 16);
    let tree = chain(&[0.15, 0.15]);
    let grant = whole(8, 1.0);
    for _ in 0..40 {
        g.learn(&mut s, &tree, &[0, 1, 2], &grant);
    }
    assert!(s.node_budget() <= 2);
    // Scores of 0.15 were always accepted: such trees now pay.
    let mut trees = vec![chain(&[0.15, 0.15])];
    let plan = plan_for(&mut g, &mut trees, &[&s]);
    assert_eq!(plan.granted, 2, "{plan:?}");
    // A new session of the same kind starts from what was learned.
    let fresh = SessionPlanning::new(Sources::ModelFree, 16);
    let mut trees = vec![chain(&[0.15, 0.15])];
    assert_eq!(plan_for(&mut g, &mut trees, &[&fresh]).granted, 2);
    // Of another kind it does not.
    let other = SessionPlanning::new(Sources::Auto, 16);
    let mut trees = vec![chain(&[0.15, 0.15])];
    assert_eq!(plan_for(&mut g, &mut trees, &[&other]).granted, 0);
}
