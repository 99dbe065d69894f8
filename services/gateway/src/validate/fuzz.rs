//! Fuzzing the gateway's wire edge: arbitrary `GenerateRequest`s (any
//! Unicode as prompt or chat, any roles, sampling with non-finite floats,
//! stop strings, ids) are validated (tokenized through the real tokenizer)
//! or refused with INVALID_ARGUMENT and a message; none panics, and what
//! passes keeps the limits. `PROPTEST_CASES` raises the count.

use crate::auth::Caller;
use proptest::prelude::*;
use specmesh_proto::v1::{self, GenerateRequest};
use tonic::Code;

use super::*;
use crate::error::GatewayError;
use crate::testing;

const LIMITS: Limits = Limits {
    max_context: 64,
    max_new_tokens: 48,
    default_max_new_tokens: 256,
    max_draft_tokens: 16,
};

fn any_float() -> impl Strategy<Value = f32> {
    prop_oneof![
        0.0f32..2.0,
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(-1.0f32),
        any::<f32>()
    ]
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-zA-Z ]{1,40}",
        any::<String>(),
        "\\PC{0,200}"
    ]
}

fn any_request() -> impl Strategy<Value = GenerateRequest> {
    let message = (
        prop_oneof![
            Just("user".to_string()),
            Just("system".to_string()),
            any_text()
        ],
        any_text(),
    )
        .prop_map(|(role, content)| v1::ChatMessage { role, content });
    let input = prop_oneof![
        Just(None),
        any_text().prop_map(|p| Some(Input::Prompt(p))),
        prop::collection::vec(message, 0..4)
            .prop_map(|messages| Some(Input::Chat(v1::Chat { messages }))),
    ];
    let sampling = (
        any_float(),
        any_float(),
        prop_oneof![0u32..64, any::<u32>()],
        any::<u64>(),
    )
        .prop_map(|(temperature, top_p, top_k, seed)| v1::SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
        });
    let speculation =
        (any::<i32>(), any::<u32>()).prop_map(|(mode, max_draft_tokens)| v1::SpeculationParams {
            mode,
            max_draft_tokens,
        });
    (
        input,
        prop_oneof![0u32..100, any::<u32>()],
        prop::option::of(sampling),
        prop::collection::vec(any_text(), 0..5),
        prop::option::of(speculation),
        (any_text(), any_text(), any::<bool>(), any_text()),
    )
        .prop_map(
            |(
                input,
                max_new_tokens,
                sampling,
                stop,
                speculation,
                (session_id, tenant, end_session, prediction),
            )| {
                GenerateRequest {
                    input,
                    max_new_tokens,
                    sampling,
                    stop,
                    speculation,
                    session_id,
                    tenant,
                    end_session,
                    prediction,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn any_generate_request_is_valid_or_refused_with_a_reason(request in any_request()) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let validator = Validator::new(testing::tokenizer(), LIMITS);
        match rt.block_on(validator.validate(request, &Caller::keyless())) {
            Ok(valid) => {
                prop_assert!(!valid.prompt_tokens.is_empty());
                prop_assert!(valid.prompt_tokens.len() + valid.max_new_tokens as usize <= LIMITS.max_context as usize);
            }
            Err(e) => {
                let e = GatewayError::from(e);
                prop_assert_eq!(e.code(), Code::InvalidArgument, "{}", e);
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
