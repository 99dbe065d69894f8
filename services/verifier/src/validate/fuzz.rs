//! Fuzzing the verifier's wire edge: arbitrary `RunRequest`s (tokens,
//! sampling with non-finite floats, draft plans, ids) are validated or
//! refused with INVALID_ARGUMENT and a message; none panics, and what
//! passes keeps the limits. `PROPTEST_CASES` raises the count.

use proptest::prelude::*;
use specmesh_proto::v1;
use specmesh_testing::fuzz;

use super::{RunLimits, ValidRun};

fn any_text() -> impl Strategy<Value = String> {
    fuzz::any_text("[a-z0-9:._-]{1,40}")
}

fn any_request() -> impl Strategy<Value = v1::RunRequest> {
    let plan = (
        any_text(),
        prop_oneof![0u32..128, any::<u32>()],
        any_text(),
        any::<i32>(),
        prop::collection::vec(any_text(), 0..4),
        prop::collection::vec(prop_oneof![0u32..300, any::<u32>()], 0..40),
    )
        .prop_map(
            |(endpoint, max_draft_tokens, tenant, sources, fallback_endpoints, prediction)| {
                v1::DraftPlan {
                    endpoint,
                    max_draft_tokens,
                    tenant,
                    sources,
                    fallback_endpoints,
                    prediction,
                }
            },
        );
    (
        (
            any_text(),
            any::<u64>(),
            prop::collection::vec(prop_oneof![0u32..300, any::<u32>()], 0..300),
        ),
        (
            prop_oneof![0u32..300, any::<u32>()],
            prop_oneof![0u32..300, any::<u32>()],
        ),
        (
            prop::option::of(fuzz::any_sampling()),
            prop::option::of(plan),
            any_text(),
            any_text(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (session_id, epoch, tokens),
                (prompt_len, max_new_tokens),
                (sampling, draft, cache_key, tenant, release_cache),
            )| {
                v1::RunRequest {
                    session_id,
                    epoch,
                    tokens,
                    prompt_len,
                    max_new_tokens,
                    sampling,
                    draft,
                    cache_key,
                    release_cache,
                    cache_salt: tenant.chars().rev().collect(),
                    logprobs: release_cache,
                    min_new_tokens: (max_new_tokens / 2)
                        .saturating_add((epoch % 2) as u32 * max_new_tokens),
                    ignore_eos: epoch % 5 == 0,
                    top_logprobs: epoch as u32 % 24,
                    structured: (epoch % 3 == 0).then(|| v1::Structured {
                        kind: Some(v1::structured::Kind::Regex(tenant.clone())),
                    }),
                    tenant,
                }
            },
        )
}

const LIMITS: RunLimits = RunLimits {
    vocab: 256,
    max_context: 512,
    max_draft_tokens: 64,
};

proptest! {
    #[test]
    fn any_run_request_is_valid_or_refused_with_a_reason(request in any_request()) {
        match ValidRun::from_wire(request, LIMITS) {
            Ok(run) => {
                prop_assert!(run.tokens.len() + run.max_new_tokens <= LIMITS.max_context);
                prop_assert!(run.tokens.iter().all(|&t| t < LIMITS.vocab));
                if let Some(plan) = &run.draft {
                    prop_assert!((1..=LIMITS.max_draft_tokens).contains(&plan.max_draft_tokens));
                }
            }
            Err(e) => fuzz::refused_with_a_reason(&tonic::Status::from(e))?,
        }
    }
}
