//! Fuzzing the gateway's wire edge: arbitrary `GenerateRequest`s (any
//! Unicode as prompt or chat, any roles, sampling with non-finite floats,
//! stop strings, ids) are validated (tokenized through the real tokenizer)
//! or refused with INVALID_ARGUMENT and a message; none panics, and what
//! passes keeps the limits. `PROPTEST_CASES` raises the count.

use crate::auth::Caller;
use proptest::prelude::*;
use specmesh_proto::v1::{self, GenerateRequest};
use specmesh_testing::fuzz;

use super::*;
use crate::error::GatewayError;
use crate::testing;

const LIMITS: Limits = Limits {
    max_context: 64,
    max_new_tokens: 48,
    default_max_new_tokens: 256,
    max_draft_tokens: 16,
};

fn any_text() -> impl Strategy<Value = String> {
    fuzz::any_text("[a-zA-Z ]{1,40}")
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
        .prop_map(|(role, content)| v1::ChatMessage {
            role,
            content,
            ..Default::default()
        });
    let input = prop_oneof![
        Just(None),
        any_text().prop_map(|p| Some(Input::Prompt(p))),
        prop::collection::vec(message, 0..4).prop_map(|messages| Some(Input::Chat(v1::Chat {
            messages,
            ..Default::default()
        }))),
    ];
    let speculation =
        (any::<i32>(), any::<u32>()).prop_map(|(mode, max_draft_tokens)| v1::SpeculationParams {
            mode,
            max_draft_tokens,
        });
    use v1::structured::Kind;
    let structured = prop_oneof![
        Just(None),
        any::<bool>().prop_map(|b| Some(Kind::JsonObject(b))),
        prop_oneof![
            any_text(),
            Just(r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#.to_string()),
        ]
        .prop_map(|t| Some(Kind::JsonSchema(t))),
        any_text().prop_map(|t| Some(Kind::Regex(t))),
        any_text().prop_map(|t| Some(Kind::Lark(t))),
    ]
    .prop_map(|kind| kind.map(|kind| v1::Structured { kind: Some(kind) }));
    (
        input,
        fuzz::any_u32(100),
        prop::option::of(fuzz::any_sampling()),
        prop::collection::vec(any_text(), 0..5),
        prop::option::of(speculation),
        (any_text(), any_text(), any::<bool>(), any_text()),
        (structured, any::<bool>(), fuzz::any_u32(25)),
    )
        .prop_map(
            |(
                input,
                max_new_tokens,
                sampling,
                stop,
                speculation,
                (session_id, tenant, end_session, prediction),
                (structured, logprobs, top_logprobs),
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
                    cache_salt: String::new(),
                    structured,
                    logprobs,
                    top_logprobs,
                    min_new_tokens: top_logprobs * 3,
                    ignore_eos: logprobs,
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
            Err(e) => fuzz::refused_with_a_reason(&GatewayError::from(e).to_status("fuzz"))?,
        }
    }
}
