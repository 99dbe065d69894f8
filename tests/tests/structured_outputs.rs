//! Structured outputs and logprobs end to end: the official `openai`
//! package (tests/python/openai_structured.py) and the gRPC API against a
//! running mesh. Every answer that finished with `stop` parses and follows
//! its schema; greedy answers and their log-probabilities are the same with
//! speculation on and off; what the grammar forces is counted; bad and
//! hostile schemas are refused with 400 / INVALID_ARGUMENT naming what to
//! fix.

use serde_json::Value;
use specmesh_e2e::front::Front;
use specmesh_e2e::mesh::{chat_request, with_mode};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;

fn check_trip(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["city", "days", "mode"], "{text}");
    assert!(v["city"].is_string() && v["days"].is_i64(), "{text}");
    assert!(
        ["train", "plane", "car"].contains(&v["mode"].as_str().unwrap()),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs_and_logprobs_through_the_openai_client() {
    let front = Front::start(&[]);
    let seen = front.run_client("openai_structured.py");

    // `parse` with a pydantic model: every answer that stopped parses and
    // follows the schema, the same with speculation on and off, and the
    // grammar's keys and punctuation were forced.
    let mut stopped = 0;
    for row in seen["parsed"].as_array().unwrap() {
        let (auto, off) = (&row["auto"], &row["off"]);
        assert_eq!(auto["text"], off["text"], "{row}");
        if auto["finish_reason"] == "stop" {
            stopped += 1;
            check_trip(auto["text"].as_str().unwrap());
            assert!(auto["parsed"].is_object(), "{row}");
        }
        for r in [auto, off] {
            assert!(
                r["specmesh"]["forced_tokens"].as_u64().unwrap() > 3,
                "{row}"
            );
        }
        assert_eq!(off["specmesh"]["drafted_tokens"], 0, "{row}");
    }
    assert!(stopped >= 3, "most answers complete within 80 tokens");

    let j = &seen["json_object"];
    if j["finish_reason"] == "stop" {
        let v: Value = serde_json::from_str(j["text"].as_str().unwrap()).unwrap();
        assert!(v.is_object(), "{j}");
    }
    assert!(j["text"].as_str().unwrap().starts_with('{'), "{j}");

    // Logprobs: the target's, identical with and without speculation.
    let (auto, off) = (&seen["logprobs"]["auto"], &seen["logprobs"]["off"]);
    assert_eq!(auto, off);
    let content = auto["content"].as_array().unwrap();
    assert!(!content.is_empty());
    let joined: String = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(joined, auto["text"].as_str().unwrap());
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{t}");
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{t}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], t["token"], "{t}");
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-6);
    }
    // Streamed: the same tokens and log-probabilities, chunk by chunk.
    let streamed = seen["logprobs_stream"].as_array().unwrap();
    assert_eq!(streamed.len(), content.len());
    for (s, t) in streamed.iter().zip(content) {
        assert_eq!((&s["token"], &s["logprob"]), (&t["token"], &t["logprob"]));
        assert_eq!(s["top_logprobs"].as_array().unwrap().len(), 2);
    }
    // Completions' legacy shape.
    let c = &seen["completion_logprobs"];
    let lp = &c["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, c["text"].as_str().unwrap());
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0);
    for alts in lp["top_logprobs"].as_array().unwrap() {
        assert_eq!(alts.as_object().unwrap().len(), 2, "{alts}");
    }

    // What benchmark clients read.
    assert_eq!(seen["model"]["root"], front.model_id.as_str());
    assert!(seen["model"]["max_model_len"].as_u64().unwrap() >= 2048);
    let tok = &seen["tokenize"];
    assert_eq!(
        tok["count"].as_u64().unwrap() as usize,
        tok["tokens"].as_array().unwrap().len()
    );
    assert!(
        seen["detokenize"]["prompt"]
            .as_str()
            .unwrap()
            .ends_with("Hello world, hello mesh.")
    );
    assert!(seen["tokenize_chat"]["count"].as_u64().unwrap() > 3);
    let sd = &seen["stream_metrics"]["speculative_decoding"];
    assert!(sd["num_drafts"].as_u64().unwrap() > 0, "{sd}");
    assert!(
        sd["mean_acceptance_length"].as_f64().unwrap() >= 1.0,
        "{sd}"
    );
    assert!(
        sd["num_draft_tokens"].as_u64().unwrap()
            >= sd["num_accepted_draft_tokens"].as_u64().unwrap()
    );

    // Refusals name the parameter and what to fix.
    let r = &seen["refusals"];
    for name in ["unknown_type", "not_satisfiable", "huge"] {
        assert_eq!(r[name]["status"], 400, "{name}: {r}");
        assert_eq!(r[name]["param"], "response_format", "{name}: {r}");
    }
    // SmolLM2's template declares no tools: they are refused by name.
    assert_eq!(r["tools"]["status"], 400, "{r}");
    assert_eq!(r["tools"]["param"], "tools", "{r}");
    assert!(
        r["tools"]["message"]
            .as_str()
            .unwrap()
            .contains("declares no tools"),
        "{r}"
    );
    assert!(
        r["unknown_type"]["message"]
            .as_str()
            .unwrap()
            .contains("strnig"),
        "{r}"
    );
    assert!(
        r["huge"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 131072"),
        "{r}"
    );
}

fn structured(kind: v1::structured::Kind) -> Option<v1::Structured> {
    Some(v1::Structured { kind: Some(kind) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_constraints_are_exact_with_speculation_and_refused_when_bad() {
    use v1::structured::Kind;
    let front = Front::start(&[]);
    let mut grpc = GenerationClient::connect(front.gateway.url.clone())
        .await
        .unwrap();
    let cases = [
        (
            "Is the sky blue? Answer yes or no, then why.",
            Kind::Regex("(yes|no)\\. Because [a-z ,]{10,80}\\.".into()),
        ),
        (
            "List three fruits.",
            Kind::Lark(
                "start: item \", \" item \", \" item\nitem: \"apple\" | \"banana\" | \"cherry\" | \"mango\" | \"pear\""
                    .into(),
            ),
        ),
        (
            "Describe a dog as JSON.",
            Kind::JsonSchema(
                r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}, "good": {"type": "boolean"}}, "required": ["name", "age", "good"], "additionalProperties": false}"#
                    .into(),
            ),
        ),
    ];
    for (ask, kind) in cases {
        let mut request = chat_request(ask, 64);
        request.structured = structured(kind.clone());
        request.logprobs = true;
        let auto = grpc.generate(request.clone()).await.unwrap().into_inner();
        let off = grpc
            .generate(with_mode(request, v1::SpeculationMode::Off))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(auto.token_ids, off.token_ids, "{kind:?}");
        assert_eq!(auto.logprobs, off.logprobs, "{kind:?}");
        assert_eq!(auto.logprobs.len(), auto.token_ids.len());
        let stats = auto.speculation.unwrap();
        assert!(stats.forced_tokens > 0, "{kind:?}: {stats:?}");
        println!("{kind:?}: {:?} {stats:?}", auto.text);
        if auto.finish_reason == v1::FinishReason::Eos as i32 {
            match &kind {
                Kind::Regex(_) => assert!(
                    auto.text.starts_with("yes. Because ") || auto.text.starts_with("no. Because "),
                    "{}",
                    auto.text
                ),
                Kind::Lark(_) => assert_eq!(auto.text.split(", ").count(), 3, "{}", auto.text),
                _ => {
                    let v: Value = serde_json::from_str(&auto.text).unwrap();
                    assert!(v["name"].is_string() && v["age"].is_i64() && v["good"].is_boolean());
                }
            }
        }
    }
    let bad = |kind: Kind| {
        let mut request = chat_request("hi", 8);
        request.structured = structured(kind);
        request
    };
    for (kind, says) in [
        (
            Kind::Lark("start: foo".into()),
            "Lark grammar cannot be compiled",
        ),
        (Kind::JsonSchema("{\"type\": ".into()), "not JSON"),
        (Kind::Regex("x".repeat(200_000)), "at most 131072"),
    ] {
        let e = grpc.generate(bad(kind)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("`structured`"), "{}", e.message());
        assert!(e.message().contains(says), "{}", e.message());
    }
    // `min_new_tokens` holds the end back; `ignore_eos` ignores it.
    let plain = grpc
        .generate(chat_request("Say hi.", 200))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.finish_reason, v1::FinishReason::Eos as i32);
    let n = plain.token_ids.len() as u32;
    let short = chat_request("Say hi.", n + 24);
    for mode in [v1::SpeculationMode::Unspecified, v1::SpeculationMode::Off] {
        let mut r = with_mode(short.clone(), mode);
        r.min_new_tokens = n + 8;
        let held = grpc.generate(r).await.unwrap().into_inner();
        assert!(held.token_ids.len() as u32 >= n + 8, "{}", held.text);
        let mut r = with_mode(short.clone(), mode);
        r.ignore_eos = true;
        let all = grpc.generate(r).await.unwrap().into_inner();
        assert_eq!(all.token_ids.len() as u32, n + 24, "{}", all.text);
        assert_eq!(all.finish_reason, v1::FinishReason::Length as i32);
    }
    let mut r = chat_request("hi", 8);
    r.min_new_tokens = 9;
    let e = grpc.generate(r).await.unwrap_err();
    assert!(
        e.message().contains("`min_new_tokens` must be at most"),
        "{}",
        e.message()
    );
    let mut r = chat_request("hi", 8);
    r.logprobs = true;
    r.top_logprobs = 21;
    let e = grpc.generate(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("`top_logprobs` must be at most 20"),
        "{}",
        e.message()
    );
}
