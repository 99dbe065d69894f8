use specmesh_proto::{MAX_TREE_SPAN, v1};

use super::*;
use crate::drafters::DrafterSet;
use crate::validate::Report;

/// Applies `o` as the stream does: read at the edge, then by the session.
fn apply(s: &mut DraftSession, o: v1::StepOutcome) -> Result<Applied, DrafterError> {
    let report = Report::from_wire(o, s.vocab())?;
    s.apply(report)
}

/// A sent tree as its message, for the assertions.
trait Wire {
    fn wire(&self) -> v1::TokenTree;
}

impl Wire for Drafted {
    /// The tree as sent, its drafting times zeroed: they differ from run
    /// to run, what is drafted does not.
    fn wire(&self) -> v1::TokenTree {
        v1::TokenTree {
            draft_micros: 0,
            ahead_micros: 0,
            ..v1::TokenTree::from(&self.tree)
        }
    }
}

/// "a b c d e a b c d e a b c d" over token ids 1..=5: the continuation of
/// the last token is obvious.
fn repetitive() -> Vec<u32> {
    (0..14).map(|i| i % 5 + 1).collect()
}

fn session(tokens: Vec<u32>, max_draft_tokens: u32, max_context: usize) -> DraftSession {
    bounded(tokens, max_draft_tokens, 6, max_context)
}

fn bounded(
    tokens: Vec<u32>,
    max_draft_tokens: u32,
    max_depth: u32,
    max_context: usize,
) -> DraftSession {
    let start = v1::DraftStart {
        session_id: "s".into(),
        epoch: 7,
        tokens,
        prompt_len: 3,
        vocab_size: 100,
        max_draft_tokens,
        max_depth,
        ..Default::default()
    };
    let spec = crate::validate::start(start, 1000).unwrap();
    let drafter = DrafterSet::new(0, None).for_spec(&spec).unwrap();
    DraftSession::new(spec, drafter, max_context, false).unwrap()
}

/// A session over `repetitive()` whose verifier measured `curve`.
fn with_curve(curve: &[(u32, f64)], pipeline: bool, max_context: usize) -> DraftSession {
    let start = v1::DraftStart {
        session_id: "s".into(),
        epoch: 7,
        tokens: repetitive(),
        prompt_len: 3,
        vocab_size: 100,
        max_draft_tokens: 8,
        max_depth: 6,
        cost_curve: curve
            .iter()
            .map(|&(tokens, relative_cost)| v1::CostPoint {
                tokens,
                relative_cost,
            })
            .collect(),
        ..Default::default()
    };
    let spec = crate::validate::start(start, 1000).unwrap();
    assert!(spec.curve_fallback.is_none());
    let drafter = DrafterSet::new(0, None).for_spec(&spec).unwrap();
    DraftSession::new(spec, drafter, max_context, pipeline).unwrap()
}

/// A session under a cost curve on which no tree pays: the policy drafts
/// nothing but a probe every 16th step.
fn not_paying(pipeline: bool, max_context: usize) -> DraftSession {
    with_curve(&[(1, 1.0), (2, 100.0), (64, 1000.0)], pipeline, max_context)
}

/// The outcome of steps `last + 1 - committed.len() ..= last`, each of
/// which verified the root alone, with a top-k row per step (in which the
/// target liked 91 best, whatever it committed).
fn span_outcome(last: u64, committed: Vec<u32>) -> v1::StepOutcome {
    v1::StepOutcome {
        step: last,
        span: committed.len() as u32,
        top_k: committed
            .iter()
            .map(|&t| v1::TopTokens {
                tokens: vec![91, t],
                logprobs: vec![-0.1, -3.0],
            })
            .collect(),
        committed,
        batch_size: 1,
        ..Default::default()
    }
}

/// A text the prompt does not predict: 40, 41, 42, 40, 41, ...
fn fresh(n: usize) -> Vec<u32> {
    (0..n).map(|i| 40 + (i % 3) as u32).collect()
}

fn first_tree(s: &mut DraftSession) -> v1::TokenTree {
    let plan = s.plan_first();
    s.draft(plan).unwrap().wire()
}

fn outcome(step: u64, path: Vec<u32>, committed: Vec<u32>) -> v1::StepOutcome {
    v1::StepOutcome {
        step,
        path,
        committed,
        batch_size: 1,
        ..Default::default()
    }
}

#[test]
fn the_first_tree_is_rooted_at_the_last_token_and_drafts_the_repetition() {
    let mut s = session(repetitive(), 8, 1000);
    let tree = first_tree(&mut s);
    assert_eq!((tree.epoch, tree.step, tree.root_token), (7, 0, 4));
    assert!(!tree.nodes.is_empty() && tree.nodes.len() <= 8);
    assert_eq!(tree.nodes[0].parent, 0);
    assert_eq!(tree.nodes[0].token, 5, "the repetition continues with 5");
}

#[test]
fn an_applied_outcome_extends_the_context_and_moves_to_the_next_step() {
    let mut s = session(repetitive(), 8, 1000);
    let tree = first_tree(&mut s);
    let a = tree.nodes[0].token;
    let applied = apply(&mut s, outcome(0, vec![0, 1], vec![a, 1])).unwrap();
    let Applied::Next { batch, reported } = applied else {
        panic!("{applied:?}");
    };
    assert_eq!((batch, reported.steps, reported.accepted), (1, 1, 1));
    assert!(reported.speculative);
    assert_eq!(s.output().last(), Some(&1));
    let next = s.plan(1);
    assert_eq!(next.step, 1);
    let tree = s.draft(next).unwrap().wire();
    assert_eq!((tree.step, tree.root_token), (1, 1));
}

#[test]
fn stale_outcomes_are_ignored_and_future_ones_refused() {
    let mut s = session(repetitive(), 8, 1000);
    first_tree(&mut s);
    apply(&mut s, outcome(0, vec![], vec![5])).unwrap();
    let plan = s.plan(1);
    s.draft(plan).unwrap();
    let before = s.output().to_vec();
    assert_eq!(
        apply(&mut s, outcome(0, vec![], vec![9])).unwrap(),
        Applied::Ignored
    );
    assert_eq!(s.output(), before, "a duplicate changes nothing");
    let err = apply(&mut s, outcome(3, vec![], vec![9]))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("`outcome.step` is 3"), "{err}");
    // One outcome may report one step only here: no span was sent.
    let mut two = outcome(1, vec![], vec![9, 9]);
    two.span = 2;
    let err = apply(&mut s, two).unwrap_err().to_string();
    assert!(err.starts_with("`outcome.span` is 2"), "{err}");
}

#[test]
fn a_zero_token_budget_sends_the_root_alone_every_step() {
    let mut s = session(repetitive(), 0, 1000);
    let tree = first_tree(&mut s);
    assert!(tree.nodes.is_empty());
    for step in 0..20 {
        let applied = apply(&mut s, outcome(step, vec![], vec![5])).unwrap();
        assert!(
            matches!(applied, Applied::Next { reported, .. } if reported == Reported::plain(1))
        );
        let plan = s.plan(1);
        assert!(plan.budget.is_off());
        let tree = s.draft(plan).unwrap().wire();
        assert_eq!((tree.step, tree.root_token), (step + 1, 5));
        assert!(tree.nodes.is_empty());
    }
}

#[test]
fn the_context_limit_is_enforced() {
    let mut s = session(repetitive(), 8, 15);
    first_tree(&mut s);
    let err = apply(&mut s, outcome(0, vec![], vec![5, 1]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("over the drafter's limit of 15"), "{err}");
}

#[test]
fn budgets_stay_within_the_verifier_bounds() {
    let mut s = session(repetitive(), 3, 1000);
    let mut tree = first_tree(&mut s);
    for step in 0..30 {
        assert!(tree.nodes.len() <= 3);
        // A greedy verifier over the repetition accepts the first chain.
        let mut path = vec![0u32];
        let mut committed = Vec::new();
        let mut want = tree.root_token % 5 + 1;
        loop {
            let here = *path.last().unwrap();
            let Some(j) = tree
                .nodes
                .iter()
                .position(|n| n.parent == here && n.token == want)
            else {
                break;
            };
            path.push(j as u32 + 1);
            committed.push(want);
            want = want % 5 + 1;
        }
        committed.push(want);
        apply(&mut s, outcome(step, path, committed)).unwrap();
        let plan = s.plan(4);
        assert!(plan.budget.max_nodes <= 4 && plan.budget.max_depth <= 6);
        tree = s.draft(plan).unwrap().wire();
    }
}

#[test]
fn a_zero_depth_bound_sends_the_root_alone() {
    let mut s = bounded(repetitive(), 8, 0, 1000);
    assert!(first_tree(&mut s).nodes.is_empty());
    apply(&mut s, outcome(0, vec![], vec![5])).unwrap();
    let plan = s.plan(1);
    assert!(s.draft(plan).unwrap().wire().nodes.is_empty());
}

#[test]
fn a_run_of_plain_steps_is_sent_ahead_as_one_span() {
    let mut s = not_paying(true, 1000);
    let first = first_tree(&mut s);
    assert_eq!(first.step, 0);
    assert!(first.nodes.is_empty());
    // Step 0 was the policy's first "off"; the probe is its 16th decision.
    let ahead = s.plan_ahead(1).expect("a tree sent ahead").wire();
    assert_eq!((ahead.epoch, ahead.step, ahead.span), (7, 1, 14));
    assert!(ahead.nodes.is_empty());
    assert!(s.plan_ahead(1).is_none(), "one tree ahead at a time");

    let c = fresh(15);
    let applied = apply(&mut s, outcome(0, vec![], vec![c[0]])).unwrap();
    assert_eq!(
        applied,
        Applied::Ahead {
            batch: 1,
            reported: Reported::plain(1)
        }
    );
    // The step after the span probes: kept until the span's outcome.
    assert!(s.plan_ahead(1).is_none());
    let applied = apply(&mut s, span_outcome(14, c[1..].to_vec())).unwrap();
    assert_eq!(
        applied,
        Applied::Next {
            batch: 1,
            reported: Reported::plain(14)
        }
    );
    assert!(s.output().ends_with(&c));
    assert_eq!(s.context.len(), repetitive().len() + 15);

    let plan = s.next_plan(1);
    assert_eq!(plan.step, 15);
    assert!(!plan.budget.is_off(), "the probe: {plan:?}");
    let probe = s.draft(plan).unwrap().wire();
    assert_eq!((probe.step, probe.root_token), (15, c[14]));
    let next = s.plan_ahead(1).expect("the next run").wire();
    assert_eq!((next.step, next.span), (16, 15), "probe to probe");
}

#[test]
fn a_span_outcome_teaches_what_its_steps_one_by_one_would() {
    let c = fresh(15);
    // Without pipelining: one tree and one outcome per step.
    let mut each = not_paying(false, 1000);
    first_tree(&mut each);
    let mut probe_each = None;
    for step in 0..15 {
        let applied = apply(&mut each, span_outcome(step, vec![c[step as usize]]));
        assert!(matches!(applied, Ok(Applied::Next { .. })), "{applied:?}");
        let plan = each.plan(1);
        assert_eq!(plan.budget.is_off(), step < 14, "step {step}");
        let tree = each.draft(plan).unwrap().wire();
        if step == 14 {
            probe_each = Some(tree);
        }
    }
    // Pipelined: steps 1..=14 in one span and one outcome.
    let mut span = not_paying(true, 1000);
    first_tree(&mut span);
    span.plan_ahead(1).unwrap();
    apply(&mut span, span_outcome(0, vec![c[0]])).unwrap();
    apply(&mut span, span_outcome(14, c[1..].to_vec())).unwrap();
    let plan = span.next_plan(1);
    let probe = span.draft(plan).unwrap().wire();

    assert_eq!(span.output(), each.output());
    assert_eq!(Some(&probe), probe_each.as_ref());
    // What the drafters learned from the rows shows: the target's 91.
    assert!(probe.nodes.iter().any(|n| n.token == 91), "{probe:?}");
}

#[test]
fn outcomes_inside_a_span_are_applied_in_order_or_ignored() {
    let mut s = not_paying(true, 1000);
    first_tree(&mut s);
    s.plan_ahead(1).unwrap();
    let c = fresh(15);
    assert!(matches!(
        apply(&mut s, outcome(0, vec![], vec![c[0]])),
        Ok(Applied::Ahead { .. })
    ));
    // A duplicate of step 0's outcome.
    assert_eq!(
        apply(&mut s, outcome(0, vec![], vec![c[0]])).unwrap(),
        Applied::Ignored
    );
    // A verifier that got the span's tree late reports its first steps on
    // their own, then the rest.
    assert_eq!(
        apply(&mut s, span_outcome(1, vec![c[1]])).unwrap(),
        Applied::Within(Reported::plain(1))
    );
    assert_eq!(
        apply(&mut s, span_outcome(3, c[2..4].to_vec())).unwrap(),
        Applied::Within(Reported::plain(2))
    );
    let before = s.output().to_vec();
    // Stale or duplicated reports of steps inside the span change nothing.
    assert_eq!(
        apply(&mut s, span_outcome(3, c[2..4].to_vec())).unwrap(),
        Applied::Ignored
    );
    assert_eq!(
        apply(&mut s, span_outcome(2, vec![c[2]])).unwrap(),
        Applied::Ignored
    );
    assert_eq!(s.output(), before);
    // Reporting steps twice, or skipping some, is refused and changes
    // nothing either.
    let err = apply(&mut s, span_outcome(5, c[1..6].to_vec())).unwrap_err();
    assert!(
        err.to_string().starts_with("`outcome.span` is 5")
            && err.to_string().contains("reported already"),
        "{err}"
    );
    let err = apply(&mut s, span_outcome(14, c[6..].to_vec())).unwrap_err();
    assert!(err.to_string().contains("but not steps 4..=5"), "{err}");
    let mut short = span_outcome(14, c[4..].to_vec());
    short.committed.pop();
    let err = apply(&mut s, short).unwrap_err().to_string();
    assert!(
        err.starts_with("`outcome.committed` has 10 tokens"),
        "{err}"
    );
    assert_eq!(s.output(), before);

    assert_eq!(
        apply(&mut s, span_outcome(14, c[4..].to_vec())).unwrap(),
        Applied::Next {
            batch: 1,
            reported: Reported::plain(11)
        }
    );
    assert!(s.output().ends_with(&c));
}

#[test]
fn an_outcome_past_the_span_is_refused() {
    let mut s = not_paying(true, 1000);
    first_tree(&mut s);
    s.plan_ahead(1).unwrap();
    apply(&mut s, outcome(0, vec![], vec![40])).unwrap();
    let err = apply(&mut s, span_outcome(15, fresh(15))).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.to_string()
            .starts_with("`outcome.step` is 15, but the outcome due reports steps 1..=14"),
        "{err}"
    );
    // Before step 0's outcome, the span's is from the future as well.
    let mut s = not_paying(true, 1000);
    first_tree(&mut s);
    s.plan_ahead(1).unwrap();
    let err = apply(&mut s, span_outcome(14, fresh(14)))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("`outcome.step` is 14"), "{err}");
}

#[test]
fn a_session_that_never_speculates_sends_spans_of_the_maximum() {
    let mut s = session(repetitive(), 0, 1000);
    s.ledger.pipeline = true;
    first_tree(&mut s);
    let max = u64::from(MAX_TREE_SPAN);
    let ahead = s.plan_ahead(1).unwrap().wire();
    assert_eq!((ahead.step, u64::from(ahead.span)), (1, max));
    apply(&mut s, outcome(0, vec![], vec![40])).unwrap();
    // Nothing to wait for: the next run goes at once, a span ahead.
    let next = s.plan_ahead(1).unwrap().wire();
    assert_eq!((next.step, u64::from(next.span)), (max + 1, max));
    let applied = apply(&mut s, span_outcome(max, fresh(max as usize))).unwrap();
    assert!(matches!(applied, Applied::Ahead { .. }), "{applied:?}");
    let third = s.plan_ahead(1).unwrap().wire();
    assert_eq!(third.step, 2 * max + 1);
}

#[test]
fn a_span_outcome_is_held_to_the_context_limit() {
    let mut s = not_paying(true, repetitive().len() + 10);
    first_tree(&mut s);
    s.plan_ahead(1).unwrap();
    apply(&mut s, outcome(0, vec![], vec![40])).unwrap();
    let err = apply(&mut s, span_outcome(14, fresh(14)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("over the drafter's limit of 24"), "{err}");
}

#[test]
fn the_first_tree_is_sized_for_the_verifiers_load_at_start() {
    let start = |batch_size| {
        let spec = crate::validate::start(
            v1::DraftStart {
                session_id: "s".into(),
                tokens: repetitive(),
                prompt_len: 3,
                vocab_size: 100,
                max_draft_tokens: 8,
                max_depth: 6,
                batch_size,
                ..Default::default()
            },
            1000,
        )
        .unwrap();
        let drafter = DrafterSet::new(0, None).for_spec(&spec).unwrap();
        DraftSession::new(spec, drafter, 1000, false).unwrap()
    };
    // Alone on the verifier (or unknown): the prior says a small tree pays.
    for batch in [0, 1] {
        let mut s = start(batch);
        assert_eq!(s.first_batch(), 1);
        assert!(!s.plan_first().budget.is_off(), "batch {batch}");
    }
    // In a batch of 64 the forward is compute-bound: no tree pays.
    let mut s = start(64);
    assert_eq!(s.first_batch(), 64);
    assert!(s.plan_first().budget.is_off());
}

#[test]
fn the_verifiers_node_budget_caps_the_next_tree_and_prices_it_alone() {
    // In a batch of 64 the session would draft nothing by itself; with a
    // budget the verifier prices the batch, and the session proposes up to
    // the budget.
    let mut s = session(repetitive(), 8, 1000);
    let tree = first_tree(&mut s);
    let a = tree.nodes[0].token;
    let mut o = outcome(0, vec![0, 1], vec![a, 1]);
    o.batch_size = 64;
    o.node_budget = Some(2);
    let Applied::Next { batch, .. } = apply(&mut s, o).unwrap() else {
        panic!("a next tree is due");
    };
    let plan = s.next_plan(batch);
    assert!(!plan.budget.is_off(), "the budget is the verifier's to cut");
    assert!(plan.budget.drafted() <= 2, "{:?}", plan.budget);
    let tree = s.draft(plan).unwrap().wire();
    assert!(!tree.nodes.is_empty() && tree.nodes.len() <= 2);
    // A zero budget: nothing drafted (but probes).
    let mut o = outcome(1, vec![0], vec![2]);
    o.node_budget = Some(0);
    o.pruned = true;
    let Applied::Next { batch, .. } = apply(&mut s, o).unwrap() else {
        panic!("a next tree is due");
    };
    assert!(s.next_plan(batch).budget.is_off());
}

#[test]
fn nodes_the_verifier_left_out_are_not_learned_as_rejected() {
    // A flat cost curve: every budget pays, so the first tree is a chain.
    let flat = || with_curve(&[(1, 1.0), (2, 1.0), (64, 1.01)], false, 1000);
    let (mut pruned, mut whole) = (flat(), flat());
    let tree = first_tree(&mut pruned);
    assert_eq!(first_tree(&mut whole), tree);
    assert!(
        tree.nodes.iter().any(|n| n.parent == 1),
        "a node below the first to cut: {tree:?}"
    );
    // The target accepted the first node and not what follows it; in one
    // session what follows was never verified.
    let a = tree.nodes[0].token;
    let mut o = outcome(0, vec![0, 1], vec![a, 99]);
    o.pruned = true;
    o.granted = vec![1];
    apply(&mut pruned, o).unwrap();
    apply(&mut whole, outcome(0, vec![0, 1], vec![a, 99])).unwrap();
    let depth_2 = |s: &DraftSession| {
        let arm = s.arms.arms().next().expect("an arm");
        s.arms.policy(arm).expect("its policy").stats().rate(2)
    };
    assert!(
        depth_2(&pruned) > depth_2(&whole),
        "{} vs {}",
        depth_2(&pruned),
        depth_2(&whole)
    );
}

mod arbitrary_outcomes;
mod guesses;
