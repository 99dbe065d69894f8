use super::*;

fn chat(body: serde_json::Value) -> Result<v1::GenerateRequest, BadRequest> {
    serde_json::from_value::<ChatRequest>(body)
        .unwrap()
        .to_wire()
}

#[test]
fn a_chat_request_becomes_a_generate_request() {
    let r = chat(serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        ],
        "max_completion_tokens": 12, "max_tokens": 99,
        "temperature": 0, "seed": 5, "stop": "\n\n", "user": "u-1",
        "n": 1, "logprobs": false, "presence_penalty": 0, "tools": [],
        "prediction": {"type": "content", "content": "Hello"},
    }))
    .unwrap();
    let Some(v1::generate_request::Input::Chat(c)) = r.input else {
        panic!("a chat")
    };
    assert_eq!(c.messages[0].role, "system");
    assert_eq!(c.messages[1].content, "Hi there");
    assert_eq!(r.max_new_tokens, 12, "max_completion_tokens wins");
    let s = r.sampling.unwrap();
    assert_eq!((s.temperature, s.seed), (0.0, 5));
    assert_eq!(r.stop, ["\n\n"]);
    assert_eq!(r.prediction, "Hello");
}

#[test]
fn unsupported_parameters_are_refused_by_name() {
    let base = |extra: serde_json::Value| {
        let mut v =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        chat(v)
    };
    for (extra, param) in [
        (serde_json::json!({"n": 2}), "n"),
        (serde_json::json!({"logprobs": 2}), "logprobs"),
        (serde_json::json!({"top_logprobs": 2}), "top_logprobs"),
        (
            serde_json::json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            serde_json::json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema.schema",
        ),
        (
            serde_json::json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (
            serde_json::json!({"tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (serde_json::json!({"tool_choice": "always"}), "tool_choice"),
        (
            serde_json::json!({"functions": [{"name": "f"}]}),
            "functions",
        ),
        (
            serde_json::json!({"frequency_penalty": 0.5}),
            "frequency_penalty",
        ),
        (serde_json::json!({"mystery": 1}), "mystery"),
        (serde_json::json!({"max_tokens": 0}), "max_tokens"),
        (
            serde_json::json!({"stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (
            serde_json::json!({"prediction": {"type": "image", "content": "x"}}),
            "prediction.type",
        ),
    ] {
        let e = base(extra.clone()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e}");
    }
    let e =
        chat(serde_json::json!({"model": "m", "messages": [{"role": "function", "content": "x"}]}))
            .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].role"));
    assert!(e.message.contains("\"tool\""), "{e}");
}

#[test]
fn completions_take_one_prompt_and_openais_defaults() {
    let r: CompletionRequest =
        serde_json::from_value(serde_json::json!({"model": "m", "prompt": ["def f():"]})).unwrap();
    let w = r.to_wire().unwrap();
    assert_eq!(
        w.input,
        Some(v1::generate_request::Input::Prompt("def f():".into()))
    );
    // OpenAI's default temperature is 1, with a fresh seed.
    assert_eq!(w.sampling.unwrap().temperature, 1.0);
    let r: CompletionRequest =
        serde_json::from_value(serde_json::json!({"model": "m", "prompt": ["a", "b"]})).unwrap();
    assert_eq!(r.to_wire().unwrap_err().param.as_deref(), Some("prompt"));
}

#[test]
fn usage_carries_the_prediction_and_cache_counts_under_openais_names() {
    let u = Usage::from(v1::Usage {
        prompt_tokens: 3,
        completion_tokens: 4,
        accepted_prediction_tokens: 2,
        rejected_prediction_tokens: 1,
        cached_tokens: 2,
    });
    let v = serde_json::to_value(u).unwrap();
    assert_eq!(v["total_tokens"], 7);
    assert_eq!(v["prompt_tokens_details"]["cached_tokens"], 2);
    assert_eq!(
        v["completion_tokens_details"]["accepted_prediction_tokens"],
        2
    );
    assert_eq!(
        v["completion_tokens_details"]["rejected_prediction_tokens"],
        1
    );
}

#[test]
fn speculation_and_tenant_are_our_extensions() {
    let base = |extra: serde_json::Value| {
        let mut v =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        chat(v)
    };
    let mode = |r: v1::GenerateRequest| r.speculation.map(|s| s.mode);
    assert_eq!(
        mode(base(serde_json::json!({})).unwrap()),
        None,
        "absent: the gRPC default"
    );
    for (name, want) in [
        ("off", v1::SpeculationMode::Off),
        ("auto", v1::SpeculationMode::Unspecified),
        ("model-free", v1::SpeculationMode::ModelFree),
        ("draft-model", v1::SpeculationMode::DraftModel),
        ("combined", v1::SpeculationMode::Combined),
    ] {
        let r = base(serde_json::json!({"speculation": name})).unwrap();
        assert_eq!(mode(r), Some(want as i32), "{name}");
    }
    for bad in [
        serde_json::json!("fast"),
        serde_json::json!(true),
        serde_json::json!("OFF"),
    ] {
        let e = base(serde_json::json!({"speculation": bad})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("speculation"), "{bad}: {e}");
        for accepted in [
            "`speculation`",
            "\"off\"",
            "\"auto\"",
            "\"model-free\"",
            "\"draft-model\"",
            "\"combined\"",
        ] {
            assert!(e.message.contains(accepted), "{bad}: {e}");
        }
    }
    let r = base(serde_json::json!({"tenant": "team-a"})).unwrap();
    assert_eq!(r.tenant, "team-a");
    assert_eq!(base(serde_json::json!({})).unwrap().tenant, "");
    let e = base(serde_json::json!({"tenant": 7})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tenant"), "{e}");
}

#[test]
fn response_formats_and_logprobs_become_the_grpc_fields() {
    let r = chat(serde_json::json!({
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "strict": true,
            "schema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}},
        "logprobs": true, "top_logprobs": 4, "min_tokens": 3, "ignore_eos": true,
    }))
    .unwrap();
    // The caller's key order is kept (`z` before `a`).
    assert_eq!(
        r.structured.unwrap().kind,
        Some(v1::structured::Kind::JsonSchema(
            r#"{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}"#
                .into()
        ))
    );
    assert_eq!((r.logprobs, r.top_logprobs), (true, 4));
    assert_eq!((r.min_new_tokens, r.ignore_eos), (3, true));
    let r = chat(serde_json::json!({
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_object"},
    }))
    .unwrap();
    assert_eq!(
        r.structured.unwrap().kind,
        Some(v1::structured::Kind::JsonObject(true))
    );
    let r: CompletionRequest =
        serde_json::from_value(serde_json::json!({"model": "m", "prompt": "x", "logprobs": 3}))
            .unwrap();
    let w = r.to_wire().unwrap();
    assert_eq!((w.logprobs, w.top_logprobs), (true, 3));
}

#[test]
fn a_tool_round_trip_becomes_the_chat_s_tools_and_history() {
    let r = chat(serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": false,
    }))
    .unwrap();
    let Some(v1::generate_request::Input::Chat(c)) = r.input else {
        panic!("a chat")
    };
    assert_eq!(c.tools[0].name, "get_weather");
    assert_eq!(c.parallel_tool_calls, Some(false));
    assert_eq!(
        c.tool_choice.unwrap().choice,
        Some(v1::tool_choice::Choice::Function("get_weather".into()))
    );
    assert_eq!(
        c.messages[1].tool_calls[0].arguments,
        "{\"city\": \"Paris\"}"
    );
    assert_eq!(c.messages[1].content, "");
    assert_eq!(
        (
            c.messages[2].role.as_str(),
            c.messages[2].tool_call_id.as_str()
        ),
        ("tool", "call_1")
    );
}
