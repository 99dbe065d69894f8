//! Arbitrary outcomes, as a broken verifier might send them: the session
//! refuses each naming the field, ignores it, or answers within bounds.

use proptest::prelude::*;

use super::*;

fn any_outcome() -> impl Strategy<Value = v1::StepOutcome> {
    (
        (0u64..4, 0u32..3),
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
            |((step, span), path, committed, top_k, batch_size)| v1::StepOutcome {
                step,
                span,
                path,
                committed,
                top_k: top_k
                    .into_iter()
                    .map(|(tokens, logprobs)| v1::TopTokens { tokens, logprobs })
                    .collect(),
                batch_size,
                tree_wait_us: 0,
                ..Default::default()
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
            match apply(&mut s, o) {
                Err(DrafterError::Invalid { field, .. }) => {
                    prop_assert!(field.starts_with("outcome."));
                    break;
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
                Ok(Applied::Ignored) => prop_assert!(step < tree.step),
                Ok(Applied::Next { batch, .. }) => {
                    prop_assert_eq!(step, tree.step);
                    let plan = s.plan(batch);
                    tree = s.draft(plan).unwrap().wire();
                    prop_assert_eq!(tree.step, step + 1);
                    prop_assert_eq!(Some(&tree.root_token), s.context.last());
                    prop_assert!(tree.nodes.len() <= max_draft as usize);
                    prop_assert!(tree.nodes.iter().all(|n| n.token < 100));
                }
                Ok(Applied::Ahead { .. } | Applied::Within(_)) => {
                    prop_assert!(false, "pipelining is off here")
                }
            }
        }
    }
}
