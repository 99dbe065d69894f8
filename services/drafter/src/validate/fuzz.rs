//! Fuzzing the drafter's wire edge: arbitrary `DraftStart`s and
//! `StepOutcome`s (paths, committed tokens, top-k rows with non-finite
//! log-probabilities) are accepted or refused with INVALID_ARGUMENT and a
//! message; none panics. `PROPTEST_CASES` raises the count.

use proptest::prelude::*;
use specmesh_draft::TreeLimits;
use specmesh_proto::v1;
use specmesh_testing::fuzz;
use specmesh_tree::TreeBuilder;

use super::{Outcome, Report, SpanOutcome, start};
use crate::error::DrafterError;

/// A log-probability a verifier may send: ordinary ones, NaN, ±∞, any.
fn any_float() -> impl Strategy<Value = f32> {
    fuzz::any_float(-5.0..1.0)
}

fn any_token() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..12, any::<u32>()]
}

fn any_start() -> impl Strategy<Value = v1::DraftStart> {
    let curve = prop::collection::vec(
        (
            any::<u32>(),
            prop_oneof![0.5f64..40.0, Just(f64::NAN), any::<f64>()],
        )
            .prop_map(|(tokens, relative_cost)| v1::CostPoint {
                tokens,
                relative_cost,
            }),
        0..8,
    );
    (
        (
            any::<String>(),
            any::<u64>(),
            any::<String>(),
            any::<String>(),
        ),
        (
            prop::collection::vec(any_token(), 0..200),
            any::<u32>(),
            prop_oneof![0u32..20, any::<u32>()],
        ),
        (
            any::<u32>(),
            any::<u32>(),
            curve,
            prop::option::of(fuzz::any_sampling()),
            any::<i32>(),
        ),
        (
            any::<String>(),
            any::<u64>(),
            any::<f64>(),
            any::<u32>(),
            any::<u64>(),
        ),
        prop::collection::vec(prop_oneof![0u32..300, any::<u32>()], 0..40),
        any::<u32>(),
    )
        .prop_map(
            |(ids, context, drafting, target, prediction, max_new_tokens)| {
                let (session_id, epoch, tenant, cache_salt) = ids;
                let (tokens, prompt_len, vocab_size) = context;
                let (max_draft_tokens, max_depth, cost_curve, sampling, sources) = drafting;
                let (
                    target_model,
                    target_vocab_fingerprint,
                    target_step_seconds,
                    batch_size,
                    first_step,
                ) = target;
                v1::DraftStart {
                    session_id,
                    epoch,
                    tenant,
                    tokens,
                    prompt_len,
                    vocab_size,
                    max_draft_tokens,
                    max_depth,
                    cost_curve,
                    sampling,
                    sources,
                    target_model,
                    target_vocab_fingerprint,
                    target_step_seconds,
                    batch_size,
                    first_step,
                    prediction,
                    max_new_tokens,
                    cache_salt,
                }
            },
        )
}

fn any_outcome() -> impl Strategy<Value = v1::StepOutcome> {
    let row = (
        prop::collection::vec(any_token(), 0..6),
        prop::collection::vec(any_float(), 0..6),
    )
        .prop_map(|(tokens, logprobs)| v1::TopTokens { tokens, logprobs });
    (
        any::<u64>(),
        prop::collection::vec(prop_oneof![0u32..6, any::<u32>()], 0..6),
        prop::collection::vec(any_token(), 0..6),
        prop::collection::vec(row, 0..6),
        any::<u32>(),
        prop_oneof![0u32..4, any::<u32>()],
        any::<u64>(),
        (
            any::<bool>(),
            prop::collection::vec(prop_oneof![0u32..6, any::<u32>()], 0..6),
            prop::option::of(any::<u32>()),
        ),
        (any::<u32>(), any::<u32>()),
    )
        .prop_map(
            |(step, path, committed, top_k, batch_size, span, tree_wait_us, planned, timed)| {
                let (pruned, granted, node_budget) = planned;
                let (forward_us, tree_deadline_us) = timed;
                v1::StepOutcome {
                    step,
                    path,
                    committed,
                    top_k,
                    batch_size,
                    span,
                    tree_wait_us,
                    node_budget,
                    pruned,
                    granted,
                    forward_us,
                    // Derived, to stay within proptest's tuple arity: small
                    // counts mostly, and any.
                    forced: if tree_deadline_us % 3 == 0 {
                        tree_deadline_us
                    } else {
                        forward_us % 4
                    },
                    tree_deadline_us,
                }
            },
        )
}

fn refused_with_a_reason(e: DrafterError) -> Result<(), TestCaseError> {
    fuzz::refused_with_a_reason(&tonic::Status::from(e))
}

proptest! {
    #[test]
    fn any_start_is_valid_or_refused_with_a_reason(s in any_start()) {
        match start(s, 128) {
            Ok(spec) => prop_assert!(!spec.tokens.is_empty() && spec.tokens.len() <= 128),
            Err(e) => refused_with_a_reason(e)?,
        }
    }

    #[test]
    fn any_outcome_is_valid_or_refused_with_a_reason(o in any_outcome(), steps in 1usize..4) {
        let mut b = TreeBuilder::new(5, TreeLimits::new(8, 4, 10)).unwrap();
        let a = b.push(0, 6, 0.9).unwrap();
        b.push(a, 7, 0.8).unwrap();
        b.push(0, 8, 0.3).unwrap();
        let tree = b.build();
        match Report::from_wire(o, 10) {
            Ok(report) => {
                if let Err(e) = Outcome::from_report(report.clone(), &tree) {
                    refused_with_a_reason(e)?;
                }
                if let Err(e) = SpanOutcome::from_report(report, steps) {
                    refused_with_a_reason(e)?;
                }
            }
            Err(e) => refused_with_a_reason(e)?,
        }
    }
}
