//! Every way a request can be refused, and the message the caller reads.

use crate::auth::Caller;
use specmesh_proto::v1::{
    Chat, ChatMessage as WireMessage, GenerateRequest, SamplingParams as WireSampling,
    SpeculationParams,
};

use super::*;
use crate::testing;

fn validator() -> Validator {
    Validator::new(
        testing::tokenizer(),
        Limits {
            max_context: 64,
            max_new_tokens: 48,
            default_max_new_tokens: 256,
            max_draft_tokens: 16,
        },
    )
}

fn prompt(text: &str) -> GenerateRequest {
    GenerateRequest {
        input: Some(Input::Prompt(text.to_owned())),
        ..Default::default()
    }
}

fn chat(messages: &[(&str, &str)]) -> GenerateRequest {
    GenerateRequest {
        input: Some(Input::Chat(Chat {
            messages: messages
                .iter()
                .map(|(role, content)| WireMessage {
                    role: (*role).to_owned(),
                    content: (*content).to_owned(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn sampling(temperature: f32, top_p: f32, top_k: u32) -> Option<WireSampling> {
    Some(WireSampling {
        temperature,
        top_p,
        top_k,
        seed: 7,
    })
}

async fn refused(request: GenerateRequest) -> String {
    let err = validator()
        .validate(request, &Caller::keyless())
        .await
        .unwrap_err();
    assert!(!err.is_internal(), "{err}");
    err.to_string()
}

#[tokio::test]
async fn a_plain_prompt_gets_the_defaults() {
    let valid = validator()
        .validate(prompt("abc"), &Caller::keyless())
        .await
        .unwrap();
    assert_eq!(valid.prompt_tokens, testing::ids("abc"));
    assert_eq!(valid.prompt_len(), 3);
    // The default 256 is capped by the server limit (48), which fits.
    assert_eq!(valid.max_new_tokens, 48);
    assert_eq!(valid.sampling, SamplingParams::greedy());
    assert_eq!(
        valid.speculation,
        ValidSpeculation {
            mode: SpeculationMode::Unspecified,
            max_draft_tokens: 16
        }
    );
    assert_eq!((valid.session_id, valid.tenant.as_str()), (None, ""));
}

#[tokio::test]
async fn the_default_budget_shrinks_to_the_room_left() {
    let long = "x".repeat(60);
    let valid = validator()
        .validate(prompt(&long), &Caller::keyless())
        .await
        .unwrap();
    assert_eq!(valid.max_new_tokens, 4);
}

#[tokio::test]
async fn chat_is_rendered_with_the_template() {
    let valid = validator()
        .validate(
            chat(&[("system", "be brief"), ("user", "hi")]),
            &Caller::keyless(),
        )
        .await
        .unwrap();
    let text = testing::tokenizer()
        .decode(&valid.prompt_tokens, false)
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[tokio::test]
async fn the_input_must_be_present_and_non_empty() {
    assert_eq!(
        refused(GenerateRequest::default()).await,
        "exactly one of `prompt` or `chat` must be set, got neither"
    );
    assert_eq!(refused(prompt("")).await, "`prompt` must not be empty");
    assert_eq!(
        refused(chat(&[])).await,
        "`chat.messages` must hold at least one message"
    );
    assert_eq!(
        refused(chat(&[("user", "hi"), ("function", "{}")])).await,
        "`chat.messages[1].role` must be \"system\", \"user\", \"assistant\" or \"tool\", got \"function\""
    );
}

/// A chat offering `tools` with `choice`.
fn with_tools(tools: Vec<v1::Tool>, choice: Option<v1::tool_choice::Choice>) -> GenerateRequest {
    let mut r = chat(&[("user", "hi")]);
    let Some(Input::Chat(c)) = r.input.as_mut() else {
        unreachable!()
    };
    c.tools = tools;
    c.tool_choice = choice.map(|choice| v1::ToolChoice {
        choice: Some(choice),
    });
    r
}

fn tool(name: &str, parameters: &str) -> v1::Tool {
    v1::Tool {
        name: name.into(),
        description: String::new(),
        parameters: parameters.into(),
    }
}

#[tokio::test]
async fn tools_are_checked_then_refused_by_a_template_that_declares_none() {
    use v1::tool_choice::Choice;
    let cases = [
        (
            with_tools(vec![tool("a b", "")], None),
            "`tools[0].name` must be 1 to 64",
        ),
        (
            with_tools(vec![tool("f", ""), tool("f", "")], None),
            "`tools[1].name` \"f\" is offered twice",
        ),
        (
            with_tools(vec![tool("f", "[1]")], None),
            "`tools[0].parameters` must be a JSON schema object: got an array",
        ),
        (
            with_tools(vec![tool("f", "")], Some(Choice::Function("g".into()))),
            "`tool_choice` names \"g\", which is not among the tools",
        ),
        (
            with_tools(
                Vec::new(),
                Some(Choice::Mode(v1::ToolChoiceMode::Required as i32)),
            ),
            "`tool_choice` asks for a call but no tools are offered",
        ),
        (
            with_tools(vec![tool("f", "")], Some(Choice::Mode(9))),
            "`tool_choice` must be 0 (auto), 1 (none) or 2 (required), got 9",
        ),
        // The test model's template reads no `tools`.
        (
            with_tools(vec![tool("f", "")], None),
            "the model's chat template declares no tools",
        ),
    ];
    for (request, expected) in cases {
        let err = refused(request).await;
        assert!(err.starts_with(expected), "{err}");
    }
    // `none` hides them: nothing to refuse.
    let hidden = with_tools(
        vec![tool("f", "")],
        Some(Choice::Mode(v1::ToolChoiceMode::None as i32)),
    );
    let valid = validator()
        .validate(hidden, &Caller::keyless())
        .await
        .unwrap();
    assert_eq!(valid.tools, None);
}

#[tokio::test]
async fn history_calls_need_an_assistant_and_json_object_arguments() {
    let mut r = chat(&[("user", "hi"), ("assistant", ""), ("tool", "42")]);
    let Some(Input::Chat(c)) = r.input.as_mut() else {
        unreachable!()
    };
    c.messages[1].tool_calls = vec![v1::ToolCall {
        id: "call_1".into(),
        name: "f".into(),
        arguments: "not json".into(),
    }];
    let mut user_calls = r.clone();
    assert_eq!(
        refused(r).await,
        "`messages[1].tool_calls[0].arguments` must be a JSON object, got \"not json\""
    );
    let Some(Input::Chat(c)) = user_calls.input.as_mut() else {
        unreachable!()
    };
    c.messages[1].role = "user".into();
    assert!(refused(user_calls).await.contains("are an assistant's"));
}

#[tokio::test]
async fn the_context_bounds_report_both_numbers() {
    let mut r = prompt(&"x".repeat(40));
    r.max_new_tokens = 30;
    assert_eq!(
        refused(r).await,
        "the prompt (40 tokens) + `max_new_tokens` (30) must be at most the model's context of 64 tokens"
    );
    assert_eq!(
        refused(prompt(&"x".repeat(64))).await,
        "the prompt is 64 tokens, which leaves no room to generate within the model's context of 64 tokens"
    );
    let mut r = prompt("abc");
    r.max_new_tokens = 49;
    assert_eq!(
        refused(r).await,
        "`max_new_tokens` must be at most 48, got 49"
    );
    let mut r = prompt(&"x".repeat(40));
    r.max_new_tokens = 24;
    assert_eq!(
        validator()
            .validate(r, &Caller::keyless())
            .await
            .unwrap()
            .max_new_tokens,
        24
    );
}

#[tokio::test]
async fn sampling_bounds_name_the_field() {
    let with = |s| GenerateRequest {
        sampling: s,
        ..prompt("abc")
    };
    assert_eq!(
        refused(with(sampling(-0.5, 1.0, 0))).await,
        "`sampling.temperature` must be a finite number >= 0, got -0.5"
    );
    assert_eq!(
        refused(with(sampling(f32::NAN, 1.0, 0))).await,
        "`sampling.temperature` must be a finite number >= 0, got NaN"
    );
    assert_eq!(
        refused(with(sampling(f32::INFINITY, 1.0, 0))).await,
        "`sampling.temperature` must be a finite number >= 0, got inf"
    );
    assert_eq!(
        refused(with(sampling(1.0, 1.5, 0))).await,
        "`sampling.top_p` must be in (0, 1], got 1.5"
    );
    assert_eq!(
        refused(with(sampling(1.0, -0.1, 0))).await,
        "`sampling.top_p` must be in (0, 1], got -0.1"
    );
    assert_eq!(
        refused(with(sampling(1.0, f32::NAN, 0))).await,
        "`sampling.top_p` must be in (0, 1], got NaN"
    );
    assert_eq!(
        refused(with(sampling(1.0, 1.0, 260))).await,
        "`sampling.top_k` must be at most the vocabulary size (259), got 260"
    );
    // top_p 0 is proto3's "unset": keep everything.
    let valid = validator()
        .validate(with(sampling(0.7, 0.0, 259)), &Caller::keyless())
        .await
        .unwrap();
    assert_eq!(
        valid.sampling,
        SamplingParams::new(0.7, 1.0, 259, 7).unwrap()
    );
}

#[tokio::test]
async fn speculation_settings_are_checked() {
    let with = |mode, max_draft_tokens| GenerateRequest {
        speculation: Some(SpeculationParams {
            mode,
            max_draft_tokens,
        }),
        ..prompt("abc")
    };
    assert_eq!(
        refused(with(7, 0)).await,
        "`speculation.mode` must be 0 (unspecified), 1 (off), 2 (model-free), 3 (draft model) or 4 (combined), got 7"
    );
    assert_eq!(
        refused(with(-1, 0)).await,
        "`speculation.mode` must be 0 (unspecified), 1 (off), 2 (model-free), 3 (draft model) or 4 (combined), got -1"
    );
    assert_eq!(
        refused(with(2, 17)).await,
        "`speculation.max_draft_tokens` must be at most 16, got 17"
    );
    let valid = validator()
        .validate(with(1, 5), &Caller::keyless())
        .await
        .unwrap();
    assert_eq!(
        valid.speculation,
        ValidSpeculation {
            mode: SpeculationMode::Off,
            max_draft_tokens: 5
        }
    );
    assert!(!valid.speculation.speculates());
    // Each mode reaches the drafter as its sources.
    for (mode, sources) in [
        (0, v1::DraftSources::Auto),
        (2, v1::DraftSources::ModelFree),
        (3, v1::DraftSources::DraftModel),
        (4, v1::DraftSources::Combined),
    ] {
        let valid = validator()
            .validate(with(mode, 0), &Caller::keyless())
            .await
            .unwrap();
        assert!(valid.speculation.speculates());
        assert_eq!(valid.speculation.sources(), sources, "mode {mode}");
    }
}

#[tokio::test]
async fn stop_strings_are_bounded() {
    let with = |stop: Vec<String>| GenerateRequest {
        stop,
        ..prompt("abc")
    };
    assert_eq!(
        refused(with(vec!["a".into(); 9])).await,
        "`stop` must hold at most 8 strings, got 9"
    );
    assert_eq!(
        refused(with(vec!["a".into(), String::new()])).await,
        "`stop[1]` must not be empty"
    );
    assert_eq!(
        refused(with(vec!["é".repeat(129)])).await,
        "`stop[0]` must be at most 256 bytes, got 258"
    );
    let valid = validator()
        .validate(with(vec!["x".repeat(256); 8]), &Caller::keyless())
        .await
        .unwrap();
    assert_eq!(valid.stop.len(), 8);
}

#[tokio::test]
async fn session_and_tenant_ids_are_short_and_plain() {
    let with = |session_id: &str, tenant: &str| GenerateRequest {
        session_id: session_id.to_owned(),
        tenant: tenant.to_owned(),
        ..prompt("abc")
    };
    assert_eq!(
        refused(with(&"s".repeat(129), "")).await,
        "`session_id` must be at most 128 bytes, got 129"
    );
    assert_eq!(
        refused(with("", &"t".repeat(200))).await,
        "`tenant` must be at most 128 bytes, got 200"
    );
    assert_eq!(
        refused(with("abc/def", "")).await,
        "`session_id` may only hold A-Z, a-z, 0-9, '.', '_', ':' and '-', got '/' at byte 3"
    );
    assert_eq!(
        refused(with("", "acmé")).await,
        "`tenant` may only hold A-Z, a-z, 0-9, '.', '_', ':' and '-', got 'é' at byte 3"
    );
    let valid = validator()
        .validate(
            with(&"s".repeat(128), "team-a.prod:1_x"),
            &Caller::keyless(),
        )
        .await
        .unwrap();
    assert_eq!(valid.session_id.as_deref(), Some("s".repeat(128).as_str()));
    assert_eq!(valid.tenant, "team-a.prod:1_x");
    assert!(!valid.end_session);
    let end = |session_id: &str| GenerateRequest {
        end_session: true,
        ..with(session_id, "")
    };
    assert_eq!(
        refused(end("")).await,
        "`end_session` needs the `session_id` of the session to end"
    );
    assert!(
        validator()
            .validate(end("chat-1"), &Caller::keyless())
            .await
            .unwrap()
            .end_session
    );
}
