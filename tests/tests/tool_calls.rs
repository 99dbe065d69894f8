//! Tool calling end to end on Qwen2.5-Coder-0.5B (whose template renders
//! tools and shows Hermes' `<tool_call>` format): the official `openai`
//! package (tests/python/openai_tools.py) and the gRPC API against a
//! running mesh. A forced call is made, parses and follows its tool's
//! schema, the same with speculation on and off, its frame forced by the
//! grammar; streamed calls join to the same; a tool result goes back into
//! the history and the model answers. (SmolLM2, whose template declares
//! no tools, refuses them by name: tests/tests/structured_outputs.rs.)

use serde_json::Value;
use specmesh_e2e::front::Front;
use specmesh_e2e::mesh::{chat_request, with_mode};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;

const MODEL: &str = "qwen2.5-coder-0.5b";

fn check_weather(call: &Value) {
    assert_eq!(call["name"], "get_weather", "{call}");
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    let keys: Vec<&str> = args
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["city", "unit"], "{call}");
    assert!(args["city"].is_string(), "{call}");
    assert!(
        ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
        "{call}"
    );
}

/// A call without its id (generated per response).
fn without_id(call: &Value) -> Value {
    let mut c = call.clone();
    c.as_object_mut().unwrap().remove("id");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_through_the_openai_client_and_grpc() {
    let front = Front::start_model(std::path::Path::new(MODEL), &[]);
    let seen = front.run_client("openai_tools.py");

    // `required`: at least one call, parsed and on schema; identical with
    // speculation off; the frame was forced.
    let (auto, off) = (&seen["required"]["auto"], &seen["required"]["off"]);
    for r in [auto, off] {
        assert_eq!(r["finish_reason"], "tool_calls", "{r}");
        assert!(r["content"].is_null(), "{r}");
        let calls = r["calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{r}");
        check_weather(&calls[0]);
        assert!(r["specmesh"]["forced_tokens"].as_u64().unwrap() >= 5, "{r}");
    }
    let strip = |r: &Value| {
        r["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(without_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(auto), strip(off), "speculation changed the calls");
    assert_eq!(off["specmesh"]["drafted_tokens"], 0);

    // Streamed, the SDK's helper joins the deltas into the same calls.
    let streamed = &seen["required_stream"];
    assert_eq!(streamed["finish_reason"], "tool_calls", "{streamed}");
    assert_eq!(strip(streamed), strip(auto));

    // A named tool is the one called; one call when parallel calls are off.
    let named = &seen["named"];
    assert_eq!(named["finish_reason"], "tool_calls", "{named}");
    let calls = named["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{named}");
    assert_eq!(calls[0]["name"], "get_time");
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["zone"].is_string(), "{named}");
    let single = &seen["single"];
    assert_eq!(single["calls"].as_array().unwrap().len(), 1, "{single}");

    // The round trip: with the result in the history, the model answers in
    // text (streamed the same).
    let answer = &seen["answer"];
    assert_eq!(answer["finish_reason"], "stop", "{answer}");
    let text = answer["content"].as_str().unwrap();
    assert!(
        !text.is_empty() && answer["calls"].as_array().unwrap().is_empty(),
        "{answer}"
    );
    assert!(
        text.contains("21") || text.to_lowercase().contains("sunny"),
        "{answer}"
    );
    assert_eq!(seen["answer_stream"]["content"], answer["content"]);
    assert_eq!(seen["answer_stream"]["finish_reason"], "stop");

    // `auto`: whatever the model calls is an offered tool on its schema.
    let chose = &seen["auto"];
    for call in chose["calls"].as_array().unwrap() {
        check_weather(call);
    }
    if !chose["calls"].as_array().unwrap().is_empty() {
        assert_eq!(chose["finish_reason"], "tool_calls", "{chose}");
    }
    // `none`: the tools are not offered, so nothing is called.
    assert!(seen["none"]["calls"].as_array().unwrap().is_empty());
    assert_eq!(seen["none"]["finish_reason"], "stop");

    let refused = &seen["unknown_tool"];
    assert_eq!(refused["status"], 400, "{refused}");
    assert_eq!(refused["param"], "tool_choice", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("get_stock"),
        "{refused}"
    );

    // gRPC: the same forced call, as `tool_calls` of the response.
    let mut client = GenerationClient::connect(front.gateway.url.clone())
        .await
        .unwrap();
    let request = |mode| {
        let mut r = with_mode(
            chat_request(
                "What is the weather like in Paris right now, in celsius?",
                80,
            ),
            mode,
        );
        let Some(v1::generate_request::Input::Chat(chat)) = r.input.as_mut() else {
            unreachable!()
        };
        chat.tools = vec![v1::Tool {
            name: "get_weather".into(),
            description: "Current weather in a city.".into(),
            parameters: r#"{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}"#.into(),
        }];
        chat.tool_choice = Some(v1::ToolChoice {
            choice: Some(v1::tool_choice::Choice::Mode(
                v1::ToolChoiceMode::Required as i32,
            )),
        });
        r
    };
    let spec = client
        .generate(request(v1::SpeculationMode::Unspecified))
        .await
        .unwrap()
        .into_inner();
    let plain = client
        .generate(request(v1::SpeculationMode::Off))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        spec.token_ids, plain.token_ids,
        "speculation changed the output"
    );
    assert_eq!(spec.finish_reason, v1::FinishReason::ToolCalls as i32);
    assert!(spec.text.is_empty(), "{:?}", spec.text);
    let call = &spec.tool_calls[0];
    check_weather(&serde_json::json!({
        "id": call.id, "name": call.name, "arguments": call.arguments,
    }));
    assert!(spec.speculation.unwrap().forced_tokens >= 5);
}
