use super::*;
use crate::drafters::DrafterSet;

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
    let spec = SessionSpec::from_wire(start, 1000).unwrap();
    let drafter = DrafterSet::new(0, None).for_session(&spec.tenant, spec.vocab);
    DraftSession::new(spec, drafter, max_context, false).unwrap()
}

fn first_tree(s: &mut DraftSession) -> v1::TokenTree {
    let plan = s.plan_first();
    s.draft(plan).unwrap().tree
}

fn outcome(step: u64, path: Vec<u32>, committed: Vec<u32>) -> v1::StepOutcome {
    v1::StepOutcome {
        step,
        path,
        committed,
        top_k: Vec::new(),
        batch_size: 1,
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
    let applied = s.apply(outcome(0, vec![0, 1], vec![a, 1])).unwrap();
    assert_eq!(
        applied,
        Applied::Next {
            batch: 1,
            accepted: 1
        }
    );
    assert_eq!(s.output().last(), Some(&1));
    let next = s.plan(1);
    assert_eq!(next.step, 1);
    let tree = s.draft(next).unwrap().tree;
    assert_eq!((tree.step, tree.root_token), (1, 1));
}

#[test]
fn stale_outcomes_are_ignored_and_future_ones_refused() {
    let mut s = session(repetitive(), 8, 1000);
    first_tree(&mut s);
    s.apply(outcome(0, vec![], vec![5])).unwrap();
    let plan = s.plan(1);
    s.draft(plan).unwrap();
    let before = s.output().to_vec();
    assert_eq!(
        s.apply(outcome(0, vec![], vec![9])).unwrap(),
        Applied::Ignored
    );
    assert_eq!(s.output(), before, "a duplicate changes nothing");
    let err = s
        .apply(outcome(3, vec![], vec![9]))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("`outcome.step` is 3"), "{err}");
}

#[test]
fn a_zero_token_budget_sends_the_root_alone_every_step() {
    let mut s = session(repetitive(), 0, 1000);
    let tree = first_tree(&mut s);
    assert!(tree.nodes.is_empty());
    for step in 0..20 {
        let applied = s.apply(outcome(step, vec![], vec![5])).unwrap();
        assert!(matches!(applied, Applied::Next { accepted: 0, .. }));
        let plan = s.plan(1);
        assert!(plan.budget.is_off());
        let tree = s.draft(plan).unwrap().tree;
        assert_eq!((tree.step, tree.root_token), (step + 1, 5));
        assert!(tree.nodes.is_empty());
    }
}

#[test]
fn the_context_limit_is_enforced() {
    let mut s = session(repetitive(), 8, 15);
    first_tree(&mut s);
    let err = s
        .apply(outcome(0, vec![], vec![5, 1]))
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
        s.apply(outcome(step, path, committed)).unwrap();
        let plan = s.plan(4);
        assert!(plan.budget.max_nodes <= 4 && plan.budget.max_depth <= 6);
        tree = s.draft(plan).unwrap().tree;
    }
}

#[test]
fn a_zero_depth_bound_sends_the_root_alone() {
    let mut s = bounded(repetitive(), 8, 0, 1000);
    assert!(first_tree(&mut s).nodes.is_empty());
    s.apply(outcome(0, vec![], vec![5])).unwrap();
    let plan = s.plan(1);
    assert!(s.draft(plan).unwrap().tree.nodes.is_empty());
}

mod arbitrary_outcomes {
    use proptest::prelude::*;

    use super::*;

    fn any_outcome() -> impl Strategy<Value = v1::StepOutcome> {
        (
            0u64..4,
            prop::collection::vec(0u32..12, 0..6),
            prop::collection::vec(0u32..110, 0..6),
            prop::collection::vec(
                (
                    prop::collection::vec(0u32..110, 0..4),
                    prop::collection::vec(prop::num::f32::ANY, 0..4),
                ),
                0..3,
            ),
            any::<u32>(),
        )
            .prop_map(
                |(step, path, committed, top_k, batch_size)| v1::StepOutcome {
                    step,
                    path,
                    committed,
                    top_k: top_k
                        .into_iter()
                        .map(|(tokens, logprobs)| v1::TopTokens { tokens, logprobs })
                        .collect(),
                    batch_size,
                },
            )
    }

    proptest! {
        /// Whatever a verifier sends, the session never panics, refuses
        /// with a named field or ignores, and every tree it drafts stays
        /// within the bounds and is rooted at the last committed token.
        #[test]
        fn any_outcome_is_refused_ignored_or_answered_within_bounds(
            outcomes in prop::collection::vec(any_outcome(), 1..12),
            max_draft in 0u32..10,
            max_depth in 0u32..5,
        ) {
            let mut s = bounded(repetitive(), max_draft, max_depth, 60);
            let mut tree = first_tree(&mut s);
            for o in outcomes {
                let step = o.step;
                match s.apply(o) {
                    Err(SessionError::Invalid { field, .. }) => {
                        prop_assert!(field.starts_with("outcome."));
                        break;
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                    Ok(Applied::Ignored) => prop_assert!(step < tree.step),
                    Ok(Applied::Next { batch, .. }) => {
                        prop_assert_eq!(step, tree.step);
                        let plan = s.plan(batch);
                        tree = s.draft(plan).unwrap().tree;
                        prop_assert_eq!(tree.step, step + 1);
                        prop_assert_eq!(Some(&tree.root_token), s.context.last());
                        prop_assert!(tree.nodes.len() <= max_draft as usize);
                        prop_assert!(tree.nodes.iter().all(|n| n.token < 100));
                    }
                    Ok(Applied::Ahead { .. }) => prop_assert!(false, "pipelining is off here"),
                }
            }
        }
    }
}
