//! The served gateway end to end (a real listener on 127.0.0.1:0, a model
//! header on disk, scripted verifiers): both RPCs, admission, deadlines,
//! client cancellation, health and graceful shutdown.

use std::time::{Duration, Instant};

use specmesh_proto::v1::generate_request::Input;
use specmesh_proto::v1::generation_client::GenerationClient;
use specmesh_proto::v1::{FinishReason, Usage};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;

use super::*;
use crate::testing::{
    self, ScriptedServer, Step, committed, committed_ids, ids, spawn_verifier, started,
};

/// A gateway served in-process.
struct Gateway {
    client: GenerationClient<Channel>,
    endpoint: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Gateway {
    async fn start(verifiers: &[&ScriptedServer], tweak: impl FnOnce(&mut Config)) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let model = testing::write_gguf(dir.path(), 64);
        let mut config = Config::new(
            verifiers.iter().map(|v| v.endpoint.clone()).collect(),
            model,
        );
        config.endpoints.listen = "127.0.0.1:0".parse().unwrap();
        tweak(&mut config);
        let started = specmesh_server::start::<crate::Gateway>(config)
            .await
            .expect("starting the gateway");
        let endpoint = format!("http://{}", started.local_addr());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(started.serve(async {
            let _ = rx.await;
        }));
        let client = GenerationClient::connect(endpoint.clone()).await.unwrap();
        Gateway {
            client,
            endpoint,
            shutdown: Some(tx),
            task,
            _dir: dir,
        }
    }

    /// Signals shutdown and waits for `serve` to return.
    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the gateway did not stop")
            .unwrap()
    }
}

fn prompt(text: &str, max_new_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        input: Some(Input::Prompt(text.to_owned())),
        max_new_tokens,
        ..Default::default()
    }
}

fn finished(step: u64, text: &str) -> Step {
    committed_ids(step, ids(text), 2, 1, true, false)
}

#[tokio::test]
async fn generate_returns_the_whole_completion() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed(0, "Hi th", 4, 4),
        finished(1, "ere"),
    ]])
    .await;
    let mut gw = Gateway::start(&[&v], |_| {}).await;
    let response = gw.client.generate(prompt("Q: ", 8)).await.unwrap();
    let id = response
        .metadata()
        .get("x-request-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(id.len(), 36, "{id}");
    let r = response.into_inner();
    assert_eq!(r.text, "Hi there");
    assert_eq!(r.token_ids, ids("Hi there"));
    assert_eq!(r.finish_reason(), FinishReason::Length);
    assert_eq!(
        r.usage,
        Some(Usage {
            prompt_tokens: 3,
            completion_tokens: 8,
            ..Usage::default()
        })
    );
    let s = r.speculation.unwrap();
    assert_eq!(
        (s.verify_steps, s.drafted_tokens, s.accepted_tokens),
        (2, 6, 5)
    );
    assert_eq!(s.mean_accepted_per_step, 4.0);
    assert!(
        r.time_to_first_token_seconds > 0.0 && r.time_to_first_token_seconds <= r.total_seconds
    );
    // The verifier got the request id as session id, and the full budget.
    let run = &v.log.requests()[0];
    assert_eq!(
        (run.session_id.as_str(), run.max_new_tokens),
        (id.as_str(), 8)
    );
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn generate_stream_sends_chunks_and_a_final_summary() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed(0, "one ", 0, 0),
        committed(1, "two <", 0, 0),
        committed(2, "/s> three", 0, 0),
        Step::Hang,
    ]])
    .await;
    let mut gw = Gateway::start(&[&v], |_| {}).await;
    let mut request = prompt("Q: ", 20);
    request.stop = vec!["</s>".into()];
    let mut stream = gw
        .client
        .generate_stream(request)
        .await
        .unwrap()
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        chunks.push(chunk);
    }
    let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(texts, ["one ", "two ", ""]);
    let last = chunks.last().unwrap();
    assert_eq!(last.finish_reason(), FinishReason::Stop);
    assert_eq!(last.usage.unwrap().completion_tokens, 8);
    assert!(last.speculation.is_some());
    assert!(
        chunks[..2]
            .iter()
            .all(|c| c.usage.is_none() && c.finish_reason == 0)
    );
    let tokens: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
    assert_eq!(tokens, ids("one two "));
    // Each chunk starts where the earlier ones' token ids end.
    let mut at = 0;
    for c in &chunks {
        assert_eq!(c.token_offset, at, "{c:?}");
        at += c.token_ids.len() as u32;
    }
    v.log.wait_cancelled().await;
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn invalid_requests_are_refused_with_the_field_named() {
    let v = spawn_verifier(vec![]).await;
    let mut gw = Gateway::start(&[&v], |_| {}).await;
    let mut request = prompt("Q: ", 0);
    request.sampling = Some(specmesh_proto::v1::SamplingParams {
        top_p: 1.5,
        ..Default::default()
    });
    let status = gw.client.generate(request.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "`sampling.top_p` must be in (0, 1], got 1.5"
    );
    assert!(status.metadata().get("x-request-id").is_some());
    let status = gw.client.generate_stream(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    // The model's context is 64 tokens.
    let status = gw
        .client
        .generate(prompt(&"x".repeat(60), 10))
        .await
        .unwrap_err();
    assert_eq!(
        status.message(),
        "the prompt (60 tokens) + `max_new_tokens` (10) must be at most the model's context of 64 tokens"
    );
    assert!(v.log.requests().is_empty());
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn over_the_concurrency_limit_is_resource_exhausted_until_a_permit_frees() {
    let v = spawn_verifier(vec![
        vec![started(), committed(0, "a", 0, 0), Step::Hang],
        vec![started(), finished(0, "b")],
    ])
    .await;
    let mut gw = Gateway::start(&[&v], |c| c.max_concurrent_requests = 1).await;
    let mut busy = gw
        .client
        .generate_stream(prompt("Q: ", 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.message().await.unwrap().unwrap().text, "a");

    let status = gw.client.generate(prompt("Q: ", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "the gateway is at its limit of 1 concurrent requests; retry later"
    );
    let status = gw
        .client
        .generate_stream(prompt("Q: ", 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    // Dropping the stream cancels the verifier call and frees the permit.
    drop(busy);
    v.log.wait_cancelled().await;
    let mut answer = None;
    for _ in 0..100 {
        match gw.client.generate(prompt("Q: ", 1)).await {
            Ok(r) => {
                answer = Some(r.into_inner().text);
                break;
            }
            Err(s) if s.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(s) => panic!("{s}"),
        }
    }
    assert_eq!(answer.as_deref(), Some("b"));
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn a_client_abandoning_generate_cancels_the_verifier_call() {
    let v = spawn_verifier(vec![vec![started(), committed(0, "a", 0, 0), Step::Hang]]).await;
    let mut gw = Gateway::start(&[&v], |_| {}).await;
    let call = gw.client.generate(prompt("Q: ", 5));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    v.log.wait_cancelled().await;
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn the_callers_deadline_ends_the_request_with_deadline_exceeded() {
    let v = spawn_verifier(vec![
        vec![started(), committed(0, "a", 0, 0), Step::Hang],
        vec![started(), committed(0, "a", 0, 0), Step::Hang],
    ])
    .await;
    let mut gw = Gateway::start(&[&v], |_| {}).await;
    let mut request = tonic::Request::new(prompt("Q: ", 5));
    request.set_timeout(Duration::from_millis(400));
    let status = gw.client.generate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(
        status.message(),
        "the request did not finish within its deadline of 0.400s"
    );
    v.log.wait_cancelled().await;

    // A stream gets the status as its last item.
    let mut request = tonic::Request::new(prompt("Q: ", 5));
    request.set_timeout(Duration::from_millis(400));
    let mut stream = gw
        .client
        .generate_stream(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().text, "a");
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn the_default_deadline_applies_without_a_client_one() {
    let v = spawn_verifier(vec![vec![started(), Step::Hang]]).await;
    let mut gw = Gateway::start(&[&v], |c| c.request_timeout = Duration::from_millis(300)).await;
    let status = gw.client.generate(prompt("Q: ", 5)).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    v.log.wait_cancelled().await;
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn no_reachable_verifier_is_unavailable() {
    let v = spawn_verifier(vec![]).await;
    let endpoint = v.endpoint.clone();
    drop(v);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let dir = tempfile::tempdir().unwrap();
    let model = testing::write_gguf(dir.path(), 64);
    let mut config = Config::new(vec![endpoint], model);
    // Fail at once rather than wait for the verifier to come back.
    config.placement_wait = Duration::ZERO;
    config.endpoints.listen = "127.0.0.1:0".parse().unwrap();
    let started = specmesh_server::start::<crate::Gateway>(config)
        .await
        .expect("starting the gateway");
    let addr = started.local_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(started.serve(async {
        let _ = rx.await;
    }));
    let mut client = GenerationClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let status = client.generate(prompt("Q: ", 2)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    // 1 attempted, or none when the health watch found it down first.
    let msg = status.message();
    assert!(
        [0, 1].iter().any(|n| msg
            == format!("no verifier is available for the request ({n} attempted); retry later")),
        "{msg}"
    );
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn health_reports_generation_serving_then_not_serving_on_shutdown() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let v = spawn_verifier(vec![]).await;
    // A Watch stream never ends by itself: only the grace period ends it.
    let gw = Gateway::start(&[&v], |c| {
        c.endpoints.shutdown_grace = Duration::from_millis(300)
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(gw.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    for service in ["specmesh.v1.Generation", ""] {
        let r = health.check(check(service)).await.unwrap().into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let mut watch = health
        .watch(check("specmesh.v1.Generation"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        watch.message().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );
    gw.stop().await.unwrap();
    // The watcher saw NOT_SERVING before the server went away.
    let next = watch.message().await;
    if let Ok(Some(r)) = next {
        assert_eq!(r.status(), ServingStatus::NotServing);
    }
}

#[tokio::test]
async fn shutdown_lets_a_running_stream_finish() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed(0, "a", 0, 0),
        Step::Sleep(Duration::from_millis(300)),
        finished(1, "b"),
    ]])
    .await;
    let mut gw = Gateway::start(&[&v], |_| {}).await;
    let mut stream = gw
        .client
        .generate_stream(prompt("Q: ", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().text, "a");
    let shutdown = gw.shutdown.take().unwrap();
    let _ = shutdown.send(());
    let last = stream.message().await.unwrap().unwrap();
    assert_eq!(
        (last.text.as_str(), last.finish_reason()),
        ("b", FinishReason::Length)
    );
    assert!(stream.message().await.unwrap().is_none());
    gw.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_cuts_what_outlives_the_grace_period() {
    let v = spawn_verifier(vec![vec![started(), committed(0, "a", 0, 0), Step::Hang]]).await;
    let mut gw = Gateway::start(&[&v], |c| {
        c.endpoints.shutdown_grace = Duration::from_millis(200)
    })
    .await;
    let mut stream = gw
        .client
        .generate_stream(prompt("Q: ", 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().text, "a");
    let started_at = Instant::now();
    let stopped = tokio::spawn(gw.stop());
    // The caller reads why its stream ended, not a reset.
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("shut down before the request finished"),
        "{status:?}"
    );
    drop(stream);
    stopped.await.unwrap().unwrap();
    assert!(started_at.elapsed() < Duration::from_secs(5));
}

/// A verifier that does not say it serves structured outputs (an older
/// one, which would drop the field and answer unconstrained) never gets a
/// constrained request, nor one asking for logprobs: the caller hears why.
#[tokio::test]
async fn constrained_requests_fail_closed_on_verifiers_that_do_not_serve_them() {
    let v = spawn_verifier(vec![vec![started(), finished(0, "ok")]]).await;
    let mut gw = Gateway::start(&[&v], |c| {
        c.placement_wait = Duration::from_millis(300);
    })
    .await;
    for request in [
        GenerateRequest {
            structured: Some(specmesh_proto::v1::Structured {
                kind: Some(specmesh_proto::v1::structured::Kind::JsonObject(true)),
            }),
            ..prompt("Q: ", 5)
        },
        GenerateRequest {
            logprobs: true,
            ..prompt("Q: ", 5)
        },
    ] {
        let status = gw.client.generate(request).await.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(
            status.message().contains("upgrade them"),
            "{}",
            status.message()
        );
    }
    assert!(v.log.requests().is_empty());
    // The same request unconstrained runs.
    let done = gw
        .client
        .generate(prompt("Q: ", 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.text, "ok");
    gw.stop().await.unwrap();
}
