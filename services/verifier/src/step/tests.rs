//! The step core, driven in-process as the session shell drives it.

use specmesh_engine::{Finish, Step};
use specmesh_proto::{tree_to_wire, v1};
use specmesh_tree::{TreeBuilder, TreeLimits};
use specmesh_verify::Verification;

use super::*;

fn grant(offered: usize) -> StepGrant {
    StepGrant {
        offered,
        ..StepGrant::default()
    }
}

const BOUNDS: TreeBounds = TreeBounds {
    vocab: 100,
    max_draft: 8,
    max_depth: 4,
    recycle_top_k: 2,
};

/// `wire` as the wire edge reads it within `BOUNDS`.
fn drafted(wire: v1::TokenTree) -> Answer {
    crate::validate::drafted(
        wire,
        TreeLimits::new(BOUNDS.max_draft + 1, BOUNDS.max_depth, BOUNDS.vocab),
    )
}

/// root ─┬─ 11 ── 12
///       └─ 13
fn wire_tree(root: u32, step: u64) -> v1::TokenTree {
    let mut b = TreeBuilder::new(root, TreeLimits::new(9, 4, 100)).unwrap();
    let a = b.push(0, 11, 0.9).unwrap();
    b.push(a, 12, 0.8).unwrap();
    b.push(0, 13, 0.1).unwrap();
    tree_to_wire(&b.build(), 0, step)
}

fn nothing(step: u64, span: u32) -> v1::TokenTree {
    v1::TokenTree {
        step,
        span,
        ..Default::default()
    }
}

/// A step that accepted the nodes of `path` (tokens `accepted`), then
/// `bonus`.
fn step(path: Vec<usize>, accepted: Vec<u32>, bonus: u32, drafted: usize) -> Step {
    let mut committed = accepted.clone();
    committed.push(bonus);
    Step {
        committed,
        drafted,
        accepted: accepted.len(),
        verification: Verification {
            top_k: vec![vec![(bonus, -0.1)]; path.len()],
            path,
            accepted,
            bonus,
            logprobs: Vec::new(),
        },
        forced: 0,
        logprobs: Vec::new(),
        finish: None,
    }
}

#[test]
fn without_a_drafter_every_step_is_the_root_alone_and_owes_nothing() {
    let mut s = Steps::new(3, BOUNDS, false);
    assert!(!s.wants_tree());
    let p = s.plan(None, 7, 100).unwrap();
    assert_eq!((p.tree.len(), p.top_k), (1, 0));
    assert!(p.dropped.is_none());
    let v = s.verified(&step(vec![0], vec![], 8, 0), grant(0), 1);
    assert_eq!(v.committed.tokens, [8]);
    assert_eq!(v.committed.step, 0);
    assert!(v.outcome.is_none() && !v.finished);
    assert_eq!(s.step(), 1);
}

#[test]
fn a_drafted_tree_is_verified_and_its_outcome_reports_the_path() {
    let mut s = Steps::new(0, BOUNDS, true);
    assert!(s.wants_tree());
    let p = s.plan(Some(drafted(wire_tree(7, 0))), 7, 100).unwrap();
    assert_eq!((p.tree.len(), p.tree.draft_len(), p.top_k), (4, 3, 2));
    let v = s.verified(&step(vec![0, 1, 2], vec![11, 12], 40, 3), grant(3), 2);
    assert_eq!(v.committed.tokens, [11, 12, 40]);
    assert_eq!((v.committed.drafted, v.committed.accepted), (3, 2));
    let o = v.outcome.expect("the outcome is due after its step");
    assert_eq!((o.step, o.span, o.batch_size), (0, 1, 2));
    assert_eq!(o.path, [0, 1, 2]);
    assert_eq!(o.committed, [11, 12, 40]);
    assert_eq!(o.top_k.len(), 3);
    assert!(s.wants_tree(), "the next step asks again");
}

#[test]
fn a_span_covers_its_steps_without_asking_and_is_reported_once() {
    let mut s = Steps::new(0, BOUNDS, true);
    let p = s.plan(Some(drafted(nothing(0, 3))), 7, 100).unwrap();
    assert_eq!(p.tree.len(), 1);
    let mut outcomes = Vec::new();
    for (i, t) in [(0u64, 8u32), (1, 9), (2, 10)] {
        if i > 0 {
            assert!(!s.wants_tree(), "step {i} is inside the span");
            s.plan(None, t - 1, 100).unwrap();
        }
        let v = s.verified(&step(vec![0], vec![], t, 0), grant(0), 1);
        outcomes.extend(v.outcome);
    }
    assert_eq!(outcomes.len(), 1);
    let o = &outcomes[0];
    assert_eq!((o.step, o.span), (2, 3));
    assert_eq!(o.committed, [8, 9, 10]);
    assert!(o.path.is_empty());
    assert!(s.wants_tree());
}

#[test]
fn a_span_that_began_earlier_covers_the_rest_of_itself() {
    let mut s = Steps::new(0, BOUNDS, true);
    s.plan(Some(Answer::Late), 7, 100).unwrap();
    s.verified(&step(vec![0], vec![], 8, 0), grant(0), 1);
    // Sent for step 0 with a span of 3, arriving at step 1: covers 1..=2.
    s.plan(Some(drafted(nothing(0, 3))), 8, 100).unwrap();
    assert!(
        s.verified(&step(vec![0], vec![], 9, 0), grant(0), 1)
            .outcome
            .is_none()
    );
    s.plan(None, 9, 100).unwrap();
    let o = s
        .verified(&step(vec![0], vec![], 10, 0), grant(0), 1)
        .outcome
        .unwrap();
    assert_eq!((o.step, o.span), (2, 2));
}

#[test]
fn a_late_tree_verifies_the_root_and_still_reports_the_step() {
    let mut s = Steps::new(0, BOUNDS, true);
    let p = s.plan(Some(Answer::Late), 7, 100).unwrap();
    assert_eq!(p.tree.len(), 1);
    assert!(p.dropped.is_none() && s.drafting());
    let o = s
        .verified(&step(vec![0], vec![], 8, 0), grant(0), 1)
        .outcome
        .unwrap();
    assert_eq!((o.step, o.committed.as_slice()), (0, &[8][..]));
}

#[test]
fn a_bad_tree_or_a_lost_stream_drops_the_drafter_for_good() {
    let cases: Vec<(Answer, &str)> = vec![
        (drafted(wire_tree(6, 0)), "root 6"),
        (
            drafted(v1::TokenTree {
                span: 2,
                ..wire_tree(7, 0)
            }),
            "span 2",
        ),
        (drafted(nothing(0, 65)), "over the limit"),
        (Answer::Lost("reset".into()), "lost: reset"),
    ];
    for (answer, why) in cases {
        let mut s = Steps::new(0, BOUNDS, true);
        let p = s.plan(Some(answer), 7, 100).unwrap();
        assert_eq!(p.tree.len(), 1);
        assert_eq!(p.top_k, 0);
        let dropped = p.dropped.expect("dropped");
        assert!(dropped.contains(why), "{dropped} should say {why}");
        assert!(!s.drafting() && !s.wants_tree());
        assert!(
            s.verified(&step(vec![0], vec![], 8, 0), grant(0), 1)
                .outcome
                .is_none()
        );
    }
}

#[test]
fn a_tree_over_the_room_left_keeps_its_best_part() {
    let mut s = Steps::new(0, BOUNDS, true);
    let p = s.plan(Some(drafted(wire_tree(7, 0))), 7, 1).unwrap();
    assert_eq!(p.tree.len(), 2, "the root and one node fit");
    assert_eq!(p.tree.draft_len(), 1);
}

#[test]
fn the_last_step_owes_the_drafter_nothing() {
    let mut s = Steps::new(0, BOUNDS, true);
    s.plan(Some(drafted(wire_tree(7, 0))), 7, 100).unwrap();
    let mut last = step(vec![0, 1], vec![11], 2, 3);
    last.finish = Some(Finish::Eos);
    let v = s.verified(&last, grant(3), 1);
    assert!(v.finished && v.committed.finished && v.committed.eos);
    assert!(v.outcome.is_none());
}

#[test]
fn a_refusal_fails_the_run_with_the_drafters_reason() {
    let mut s = Steps::new(0, BOUNDS, true);
    let why = "the draft model a cannot draft for the target b";
    let e = s
        .plan(Some(Answer::Refused(why.into())), 7, 100)
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.to_string().contains(why), "{e}");
}

#[test]
fn the_wait_for_a_tree_and_a_tree_drafted_ahead_are_reported() {
    let mut s = Steps::new(0, BOUNDS, true);
    s.waited(std::time::Duration::from_micros(2500));
    let mut ahead = wire_tree(7, 0);
    ahead.drafted_ahead = true;
    s.plan(Some(drafted(ahead)), 7, 100).unwrap();
    let v = s.verified(&step(vec![0, 1], vec![11], 12, 3), grant(3), 1);
    assert_eq!(v.committed.tree_wait_us, 2500);
    assert!(v.committed.drafted_ahead);
    assert_eq!(v.outcome.expect("due").tree_wait_us, 2500);

    // The next step waited for nothing and its tree was drafted after
    // the outcome: neither carries over.
    s.plan(Some(drafted(wire_tree(12, 1))), 12, 100).unwrap();
    let v = s.verified(&step(vec![0], vec![], 5, 3), grant(3), 1);
    assert_eq!(v.committed.tree_wait_us, 0);
    assert!(!v.committed.drafted_ahead);
    assert_eq!(v.outcome.expect("due").tree_wait_us, 0);
}

#[test]
fn the_way_a_tree_was_drafted_reaches_the_planner() {
    let mut s = Steps::new(0, BOUNDS, true);
    let mut by_model = wire_tree(7, 0);
    by_model.drafted_by = v1::DraftSources::DraftModel as i32;
    by_model.draft_micros = 1500;
    by_model.ahead_micros = 500;
    let p = s.plan(Some(drafted(by_model)), 7, 100).unwrap();
    assert_eq!(p.drafted_by, Some(Sources::DraftModel));
    // What drafting it took, for the planner's price of drafting.
    assert!((p.drafting.unwrap() - 0.002).abs() < 1e-12);
    s.verified(&step(vec![0, 1], vec![11], 12, 3), grant(3), 1);

    // Unset, or a value this verifier does not know (a newer drafter's):
    // the session's own sources.
    for by in [v1::DraftSources::Auto as i32, 42] {
        let mut tree = wire_tree(12, s.step());
        tree.drafted_by = by;
        let p = s.plan(Some(drafted(tree)), 12, 100).unwrap();
        assert_eq!(p.drafted_by, None, "drafted_by {by}");
        assert_eq!(p.drafting, None, "an older drafter says nothing of it");
        assert_eq!(p.tree.draft_len(), 3, "the tree itself is verified");
        s.verified(&step(vec![0], vec![], 12, 3), grant(3), 1);
    }
}

#[test]
fn the_forward_that_verified_a_step_is_reported_to_the_drafter() {
    let mut s = Steps::new(0, BOUNDS, true);
    s.plan(Some(drafted(wire_tree(7, 0))), 7, 100).unwrap();
    let timed = StepGrant {
        forward_us: 84_000,
        tree_deadline_us: 8_400,
        ..grant(3)
    };
    let v = s.verified(&step(vec![0, 1], vec![11], 12, 3), timed, 2);
    let outcome = v.outcome.expect("due");
    assert_eq!(outcome.forward_us, 84_000);
    assert_eq!(outcome.tree_deadline_us, 8_400);
    assert_eq!(outcome.batch_size, 2);
}

#[test]
fn a_reattached_drafter_drafts_from_the_step_it_took_and_its_refusal_only_drops_it() {
    let mut s = Steps::new(0, BOUNDS, true);
    let p = s.plan(Some(Answer::Lost("reset".into())), 7, 100).unwrap();
    assert!(p.dropped.is_some() && !s.wants_tree());
    s.verified(&step(vec![0], vec![], 8, 0), grant(0), 1);
    // Two plain steps, then another drafter takes the session at step 3.
    s.plan(None, 8, 100).unwrap();
    s.verified(&step(vec![0], vec![], 9, 0), grant(0), 1);
    s.plan(None, 9, 100).unwrap();
    s.verified(&step(vec![0], vec![], 10, 0), grant(0), 1);
    s.reattached();
    assert!(s.wants_tree());
    let p = s.plan(Some(drafted(wire_tree(10, 3))), 10, 100).unwrap();
    assert_eq!((p.tree.draft_len(), p.top_k), (3, 2));
    let v = s.verified(&step(vec![0, 1], vec![11], 40, 3), grant(3), 1);
    assert_eq!(v.committed.step, 3);
    assert_eq!(v.outcome.expect("due").step, 3);
    // A refusal from a re-attached drafter drops it; the session goes on.
    let p = s
        .plan(Some(Answer::Refused("no draft model".into())), 40, 100)
        .unwrap();
    assert!(p.dropped.unwrap().contains("no draft model"));
    assert!(!s.wants_tree());
    // Without the re-attach, a refusal fails the run (the caller's to fix).
    let mut fresh = Steps::new(0, BOUNDS, true);
    assert!(
        fresh
            .plan(Some(Answer::Refused("no".into())), 7, 100)
            .is_err()
    );
}
