//! Through the real services: bad input gets INVALID_ARGUMENT naming the
//! field, overload RESOURCE_EXHAUSTED, a cancelled client frees its KV
//! cache, a lost verifier loses nothing, and clients that are not ours work
//! from reflection alone.

use std::process::Command;
use std::time::Duration;

use specmesh_e2e::mesh::{Mesh, chat_request};
use specmesh_proto::v1;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tonic::Code;

async fn verifier_stats(url: &str) -> v1::VerifierStats {
    let mut c = VerifierClient::connect(url.to_string()).await.unwrap();
    c.stats(v1::StatsRequest {}).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_message_that_names_the_field() {
    let mesh = Mesh::start();
    let mut client = mesh.client().await;
    let ok = || chat_request("Say hi.", 8);
    let mut cases: Vec<(v1::GenerateRequest, &str)> = Vec::new();
    cases.push((
        v1::GenerateRequest {
            input: Some(v1::generate_request::Input::Prompt(String::new())),
            ..ok()
        },
        "prompt",
    ));
    cases.push((
        v1::GenerateRequest {
            input: None,
            ..ok()
        },
        "prompt",
    ));
    let long = "word ".repeat(9000);
    cases.push((
        v1::GenerateRequest {
            input: Some(v1::generate_request::Input::Prompt(long)),
            ..ok()
        },
        "context",
    ));
    cases.push((
        v1::GenerateRequest {
            max_new_tokens: 1_000_000,
            ..ok()
        },
        "max_new_tokens",
    ));
    for (t, field) in [(-1.0, "temperature"), (f32::NAN, "temperature")] {
        cases.push((
            v1::GenerateRequest {
                sampling: Some(v1::SamplingParams {
                    temperature: t,
                    ..Default::default()
                }),
                ..ok()
            },
            field,
        ));
    }
    for p in [1.5f32, -0.1] {
        cases.push((
            v1::GenerateRequest {
                sampling: Some(v1::SamplingParams {
                    temperature: 1.0,
                    top_p: p,
                    ..Default::default()
                }),
                ..ok()
            },
            "top_p",
        ));
    }
    cases.push((
        v1::GenerateRequest {
            sampling: Some(v1::SamplingParams {
                temperature: 1.0,
                top_k: 10_000_000,
                ..Default::default()
            }),
            ..ok()
        },
        "top_k",
    ));
    cases.push((
        v1::GenerateRequest {
            speculation: Some(v1::SpeculationParams {
                mode: 42,
                max_draft_tokens: 0,
            }),
            ..ok()
        },
        "speculation.mode",
    ));
    cases.push((
        v1::GenerateRequest {
            speculation: Some(v1::SpeculationParams {
                mode: 0,
                max_draft_tokens: 100_000,
            }),
            ..ok()
        },
        "max_draft_tokens",
    ));
    cases.push((
        v1::GenerateRequest {
            stop: vec!["x".into(); 50],
            ..ok()
        },
        "stop",
    ));
    cases.push((
        v1::GenerateRequest {
            stop: vec!["y".repeat(5000)],
            ..ok()
        },
        "stop",
    ));
    cases.push((
        v1::GenerateRequest {
            session_id: "bad id!".into(),
            ..ok()
        },
        "session_id",
    ));
    for (i, (req, field)) in cases.into_iter().enumerate() {
        let err = client
            .generate(req)
            .await
            .expect_err(&format!("case {i} ({field}) was accepted"));
        assert_eq!(err.code(), Code::InvalidArgument, "case {i}: {err:?}");
        assert!(
            err.message().contains(field),
            "case {i}: `{}` does not name `{field}`",
            err.message()
        );
    }
    // A message over the size limit.
    let huge = "z".repeat(5 << 20);
    let err = client
        .generate(v1::GenerateRequest {
            input: Some(v1::generate_request::Input::Prompt(huge)),
            ..ok()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.code(),
            Code::OutOfRange | Code::InvalidArgument | Code::ResourceExhausted
        ),
        "{err:?}"
    );
    // Still serving after all that.
    assert!(
        !client
            .generate(ok())
            .await
            .unwrap()
            .into_inner()
            .token_ids
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_shed_and_a_cancelled_client_frees_its_kv_cache() {
    let mesh = Mesh::start_with(1, 1, &[("SPECMESH_GATEWAY_MAX_CONCURRENT_REQUESTS", "1")]);
    let verifier = mesh.of("specmesh-verifier")[0].url.clone();
    let mut client = mesh.client().await;
    // A long stream holds the only slot.
    let mut stream = client
        .generate_stream(chat_request("Write a long story about a dragon.", 2000))
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().expect("a first chunk");
    let during = verifier_stats(&verifier).await;
    assert_eq!(during.active_sessions, 1);
    assert!(during.kv_bytes > 0);
    let mut other = mesh.client().await;
    let err = other.generate(chat_request("Hi", 4)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("limit"), "{}", err.message());
    // Counted as the capacity refusal autoscaling adds gateways on.
    let metrics = mesh
        .gateway_metrics
        .as_deref()
        .expect("the gateway's /metrics");
    assert_eq!(
        specmesh_e2e::metrics::metric(
            metrics,
            "specmesh_capacity_refusals_total",
            "reason=\"gateway_full\""
        ),
        1.0
    );
    // The client goes away: the verifier must end the session and free it.
    drop(stream);
    let mut freed = None;
    for _ in 0..100 {
        let s = verifier_stats(&verifier).await;
        if s.active_sessions == 0 && s.reserved_bytes == 0 {
            freed = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        freed.is_some(),
        "KV not freed after cancel: {:?}",
        verifier_stats(&verifier).await
    );
    assert!(
        !other
            .generate(chat_request("Hi", 4))
            .await
            .unwrap()
            .into_inner()
            .token_ids
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_verifier_mid_stream_loses_nothing() {
    let mesh = Mesh::start_with(2, 1, &[]);
    let mut client = mesh.client().await;
    let prompt = "Explain how a bicycle works, step by step.";
    let expected = client
        .generate(chat_request(prompt, 120))
        .await
        .unwrap()
        .into_inner();
    let before: Vec<_> = futures_stats(&mesh).await;
    let mut stream = client
        .generate_stream(chat_request(prompt, 120))
        .await
        .unwrap()
        .into_inner();
    let mut ids = Vec::new();
    let mut killed = false;
    while let Some(chunk) = stream.message().await.unwrap() {
        // Every chunk says where it starts: no gap, no repeat, across the
        // re-placement too.
        assert_eq!(chunk.token_offset as usize, ids.len(), "{chunk:?}");
        ids.extend(chunk.token_ids);
        if !killed && ids.len() >= 20 {
            // Kill whichever verifier runs this session, hard.
            let after = futures_stats(&mesh).await;
            let (pid, _) = after
                .iter()
                .zip(&before)
                .find(|(a, b)| a.1 > b.1)
                .map(|(a, _)| a)
                .copied()
                .expect("a verifier running the session");
            Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .unwrap();
            killed = true;
        }
    }
    assert!(killed);
    assert_eq!(
        ids, expected.token_ids,
        "the recovered stream differs from an uninterrupted one"
    );
}

/// (pid, steps run) of each verifier.
async fn futures_stats(mesh: &Mesh) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    for v in mesh.of("specmesh-verifier") {
        let steps = match VerifierClient::connect(v.url.clone()).await {
            Ok(mut c) => c
                .stats(v1::StatsRequest {})
                .await
                .map_or(0, |s| s.into_inner().steps),
            Err(_) => 0,
        };
        out.push((v.pid, steps));
    }
    out
}

/// Python grpcio with only server reflection: no proto files, no generated
/// code. `SPECMESH_TEST_PYTHON` names an interpreter with grpcio and
/// grpcio-reflection (scripts/test.sh makes one).
fn python() -> String {
    std::env::var("SPECMESH_TEST_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/specmesh/venv-grpc/bin/python")
    })
}

fn reflect_call(addr: &str, method: &str, body: &str) -> (bool, String, String) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/reflect_call.py");
    let out = Command::new(python())
        .arg(script)
        .args([addr.trim_start_matches("http://"), method, body])
        .output()
        .unwrap_or_else(|e| panic!("running {} (set SPECMESH_TEST_PYTHON): {e}", python()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_is_not_ours_works_from_reflection_alone() {
    let mesh = Mesh::start();
    let body = r#"{"chat": {"messages": [{"role": "user", "content": "Name three fruits."}]}, "maxNewTokens": 16}"#;
    let (ok, out, err) = reflect_call(&mesh.gateway, "specmesh.v1.Generation/Generate", body);
    assert!(ok, "python client failed: {err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let expected = mesh
        .client()
        .await
        .generate(chat_request("Name three fruits.", 16))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v["text"].as_str().unwrap(), expected.text);
    let (ok, out, _) = reflect_call(&mesh.gateway, "specmesh.v1.Generation/GenerateStream", body);
    assert!(ok && out.lines().count() >= 2, "{out}");
    let (ok, _, err) = reflect_call(
        &mesh.gateway,
        "specmesh.v1.Generation/Generate",
        r#"{"prompt": "", "maxNewTokens": 4}"#,
    );
    assert!(!ok && err.starts_with("INVALID_ARGUMENT"), "{err}");
    // The public port describes the public API alone: the mesh's internal
    // services are described on their own ports only.
    let (ok, _, err) = reflect_call(&mesh.gateway, "specmesh.v1.Verifier/Stats", "{}");
    assert!(!ok, "the gateway described the Verifier service");
    assert!(err.contains("specmesh.v1.Verifier"), "{err}");
    let verifier = mesh.of("specmesh-verifier")[0].url.clone();
    let (ok, out, err) = reflect_call(&verifier, "specmesh.v1.Verifier/Stats", "{}");
    assert!(ok, "{verifier}: {err}");
    assert!(
        serde_json::from_str::<serde_json::Value>(out.trim()).is_ok_and(|v| v.is_object()),
        "{out}"
    );
    // Health and reflection on every service, the gateway included.
    let urls: Vec<String> = mesh.services.iter().map(|s| s.url.clone()).collect();
    assert!(urls.contains(&mesh.gateway), "{urls:?}");
    for url in urls {
        let (ok, out, err) = reflect_call(&url, "grpc.health.v1.Health/Check", "{}");
        assert!(ok, "{url}: {err}");
        assert!(out.contains("SERVING"), "{url}: {out}");
    }
}
