//! The decode loop against scripted verifiers on 127.0.0.1:0: output,
//! finish reasons, stop-string cancellation, recovery after losing a
//! verifier, and which verifier errors end a request.

use std::time::Duration;

use specmesh_proto::v1::{FinishReason, SpeculationMode};
use specmesh_sampling::SamplingParams;
use tokio::sync::mpsc;

use super::*;
use crate::testing::{self, Proxy, Step, committed, committed_ids, ids, spawn_verifier, started};
use crate::validate::ValidSpeculation;

const PROMPT: &str = "Q: ";

fn decode_loop(verifiers: &[&str], drafters: &[&str], max_replacements: u32) -> DecodeLoop {
    let members = Members::new(crate::members::ClientSettings::plaintext(
        Duration::from_secs(1),
        4 << 20,
    ));
    let list = |l: &[&str]| l.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>();
    members.set(crate::health::Role::Verifier, &list(verifiers));
    members.set(crate::health::Role::Drafter, &list(drafters));
    DecodeLoop::new(Arc::new(members), testing::tokenizer(), max_replacements)
}

fn request(max_new_tokens: u32, stop: &[&str]) -> ValidGenerateRequest {
    ValidGenerateRequest {
        prompt_tokens: ids(PROMPT),
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        stop: stop.iter().map(|s| (*s).to_owned()).collect(),
        speculation: ValidSpeculation {
            mode: SpeculationMode::Unspecified,
            max_draft_tokens: 16,
        },
        session_id: None,
        end_session: false,
        tenant: "acme".into(),
        prediction: Vec::new(),
        cache_salt: String::new(),
        structured: None,
        logprobs: None,
        min_new_tokens: 0,
        ignore_eos: false,
        tools: None,
    }
}

fn ctx() -> RequestContext {
    let now = Instant::now();
    RequestContext {
        request_id: "req-1".into(),
        arrived: now,
        deadline: now + Duration::from_secs(30),
        timeout: Duration::from_secs(30),
    }
}

/// Collects deltas, optionally reporting each on a channel.
#[derive(Debug, Default)]
struct TestSink {
    deltas: Vec<Delta>,
    notify: Option<mpsc::UnboundedSender<Delta>>,
}

impl DeltaSink for TestSink {
    async fn send(&mut self, delta: Delta) -> Result<(), ClientGone> {
        if let Some(tx) = &self.notify {
            let _ = tx.send(delta.clone());
        }
        self.deltas.push(delta);
        Ok(())
    }
}

impl TestSink {
    /// Everything delivered plus the summary's last delta.
    fn all(&self, summary: &Summary) -> (String, Vec<u32>) {
        let mut text = String::new();
        let mut tokens = Vec::new();
        for d in self.deltas.iter().chain(std::iter::once(&summary.last)) {
            text.push_str(&d.text);
            tokens.extend_from_slice(&d.token_ids);
        }
        (text, tokens)
    }
}

fn finished(step: u64, text: &str) -> Step {
    committed_ids(step, ids(text), 4, 2, true, false)
}

#[tokio::test]
async fn committed_steps_become_the_output_and_the_run_request_is_complete() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed(0, "ab", 3, 1),
        committed(1, "cd", 4, 2),
        finished(2, "ef"),
    ]])
    .await;
    let dl = decode_loop(&[&v.endpoint], &["http://drafter-0:50061"], 2);
    let mut sink = TestSink::default();
    let req = request(6, &[]);
    let summary = dl.run(&req, &ctx(), &mut sink).await.unwrap();
    assert_eq!(sink.all(&summary), ("abcdef".to_owned(), ids("abcdef")));
    assert_eq!(summary.finish_reason, FinishReason::Length);
    assert_eq!(summary.usage.prompt_tokens, 3);
    assert_eq!(summary.usage.completion_tokens, 6);
    let s = summary.speculation;
    assert_eq!(
        (s.verify_steps, s.drafted_tokens, s.accepted_tokens),
        (3, 11, 5)
    );
    assert_eq!(s.mean_accepted_per_step, 2.0);
    assert!(summary.time_to_first_token.is_some());

    let run = &v.log.requests()[0];
    assert_eq!(run.session_id, "req-1");
    assert_eq!(run.epoch, 1);
    assert_eq!(run.tokens, ids(PROMPT));
    assert_eq!((run.prompt_len, run.max_new_tokens), (3, 6));
    assert_eq!(run.cache_key, "");
    let sampling = run.sampling.unwrap();
    assert_eq!(
        (sampling.temperature, sampling.top_p, sampling.top_k),
        (0.0, 1.0, 0)
    );
    let plan = run.draft.clone().unwrap();
    assert_eq!(plan.endpoint, "http://drafter-0:50061");
    assert_eq!((plan.max_draft_tokens, plan.tenant.as_str()), (16, "acme"));
}

#[tokio::test]
async fn a_session_keeps_its_kv_and_speculation_off_sends_no_plan() {
    let v = spawn_verifier(vec![vec![started(), finished(0, "x")]]).await;
    let dl = decode_loop(&[&v.endpoint], &["http://drafter-0:50061"], 2);
    let mut req = request(1, &[]);
    req.session_id = Some("chat-42".into());
    req.cache_salt = "user-7".into();
    req.speculation.mode = SpeculationMode::Off;
    dl.run(&req, &ctx(), &mut TestSink::default())
        .await
        .unwrap();
    let run = &v.log.requests()[0];
    assert_eq!(
        (
            run.session_id.as_str(),
            run.cache_key.as_str(),
            run.cache_salt.as_str()
        ),
        ("chat-42", "chat-42", "user-7")
    );
    assert_eq!(run.draft, None);
}

#[tokio::test]
async fn eos_ends_the_generation() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed(0, "o", 0, 0),
        committed(1, "k", 0, 0),
        committed_ids(2, vec![], 0, 0, true, true),
    ]])
    .await;
    let dl = decode_loop(&[&v.endpoint], &[], 2);
    let mut sink = TestSink::default();
    let summary = dl.run(&request(10, &[]), &ctx(), &mut sink).await.unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Eos);
    assert_eq!(sink.all(&summary).0, "ok");
    // Plain decoding: the EOS step counts as one token.
    assert_eq!(summary.speculation.mean_accepted_per_step, 1.0);
}

#[tokio::test]
async fn a_stop_string_cuts_the_text_and_cancels_the_verifier_call() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed(0, "Hello wor", 8, 7),
        committed(1, "ld! EN", 8, 5),
        committed(2, "D and more", 8, 9),
        Step::Hang,
    ]])
    .await;
    let dl = decode_loop(&[&v.endpoint], &[], 2);
    let mut sink = TestSink::default();
    let summary = dl
        .run(&request(50, &["END"]), &ctx(), &mut sink)
        .await
        .unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Stop);
    let (text, tokens) = sink.all(&summary);
    assert_eq!(text, "Hello world! ");
    // Byte tokens: exactly the tokens of the returned text.
    assert_eq!(tokens, ids("Hello world! "));
    assert_eq!(summary.usage.completion_tokens, 13);
    // "EN" was held back while it could still become "END".
    assert_eq!(sink.deltas[1].text, "ld! ");
    v.log.wait_cancelled().await;
}

#[tokio::test]
async fn losing_the_verifier_resumes_the_session_on_another_with_the_committed_context() {
    let a = spawn_verifier(vec![vec![
        started(),
        committed(0, "abc", 4, 2),
        committed(1, "de", 4, 1),
        Step::Fail(Status::unavailable("pod evicted")),
    ]])
    .await;
    let b = spawn_verifier(vec![vec![started(), finished(0, "fgh")]]).await;
    let dl = decode_loop(&[&a.endpoint, &b.endpoint], &[], 2);
    let mut sink = TestSink::default();
    let summary = dl.run(&request(8, &[]), &ctx(), &mut sink).await.unwrap();
    assert_eq!(sink.all(&summary), ("abcdefgh".to_owned(), ids("abcdefgh")));
    assert_eq!(summary.finish_reason, FinishReason::Length);
    assert_eq!(summary.speculation.verify_steps, 3);

    let first = &a.log.requests()[0];
    let resumed = &b.log.requests()[0];
    assert_eq!(first.epoch, 1);
    assert_eq!(resumed.epoch, 2);
    assert_eq!(resumed.session_id, first.session_id);
    assert_eq!(resumed.tokens, ids("Q: abcde"));
    assert_eq!(resumed.prompt_len, 3);
    assert_eq!(resumed.max_new_tokens, 3);
}

#[tokio::test]
async fn a_connection_cut_mid_stream_is_recovered() {
    let a = spawn_verifier(vec![vec![started(), committed(0, "abc", 0, 0), Step::Hang]]).await;
    let proxy = Proxy::start(a.addr).await;
    let b = spawn_verifier(vec![vec![started(), finished(0, "def")]]).await;
    let dl = Arc::new(decode_loop(&[&proxy.endpoint, &b.endpoint], &[], 2));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task = {
        let dl = dl.clone();
        tokio::spawn(async move {
            let mut sink = TestSink {
                deltas: Vec::new(),
                notify: Some(tx),
            };
            let summary = dl.run(&request(6, &[]), &ctx(), &mut sink).await;
            (summary, sink)
        })
    };
    assert_eq!(rx.recv().await.unwrap().text, "abc");
    proxy.cut();
    let (summary, sink) = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    let summary = summary.unwrap();
    assert_eq!(sink.all(&summary).0, "abcdef");
    let resumed = &b.log.requests()[0];
    assert_eq!((resumed.epoch, resumed.tokens.clone()), (2, ids("Q: abc")));
}

#[tokio::test]
async fn a_stream_ending_without_a_finished_step_is_resumed() {
    let a = spawn_verifier(vec![vec![started(), committed(0, "ab", 0, 0)]]).await;
    let b = spawn_verifier(vec![vec![started(), finished(0, "c")]]).await;
    let dl = decode_loop(&[&a.endpoint, &b.endpoint], &[], 2);
    let mut sink = TestSink::default();
    let summary = dl.run(&request(3, &[]), &ctx(), &mut sink).await.unwrap();
    assert_eq!(sink.all(&summary).0, "abc");
}

#[tokio::test]
async fn a_refused_connection_moves_to_the_next_verifier() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let b = spawn_verifier(vec![vec![started(), finished(0, "hi")]]).await;
    let dl = decode_loop(&[&closed, &b.endpoint], &[], 2);
    let mut sink = TestSink::default();
    let summary = dl.run(&request(2, &[]), &ctx(), &mut sink).await.unwrap();
    assert_eq!(sink.all(&summary).0, "hi");
    let run = &b.log.requests()[0];
    assert_eq!((run.epoch, run.tokens.clone()), (2, ids(PROMPT)));
}

#[tokio::test]
async fn re_placements_are_bounded() {
    let lost = || vec![vec![started(), Step::Fail(Status::unavailable("gone"))]];
    let vs = [
        spawn_verifier(lost()).await,
        spawn_verifier(lost()).await,
        spawn_verifier(lost()).await,
        spawn_verifier(lost()).await,
    ];
    let endpoints: Vec<&str> = vs.iter().map(|v| v.endpoint.as_str()).collect();
    let dl = decode_loop(&endpoints, &[], 2);
    let err = dl
        .run(&request(4, &[]), &ctx(), &mut TestSink::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, GatewayError::NoVerifier { attempts: 3 }),
        "{err:?}"
    );
    let calls: usize = vs.iter().map(|v| v.log.requests().len()).sum();
    assert_eq!(calls, 3, "the first try and two re-placements");
}

/// With every verifier down, a request waits (up to the placement wait)
/// for one to come back instead of failing; without a wait it fails at
/// once.
#[tokio::test]
async fn a_request_waits_for_a_verifier_to_come_back() {
    let v = spawn_verifier(vec![vec![started(), finished(0, "ok")]]).await;
    let dl = decode_loop(&[&v.endpoint], &[], 2);
    let member = dl.members.placer().verifiers()[0].clone();
    member.set_healthy(false);
    let err = dl
        .run(&request(4, &[]), &ctx(), &mut TestSink::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, GatewayError::NoVerifier { attempts: 0 }),
        "{err:?}"
    );
    assert!(v.log.requests().is_empty());

    let dl = dl.with_placement_wait(Duration::from_secs(20));
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        member.set_healthy(true);
    });
    let mut sink = TestSink::default();
    let summary = dl.run(&request(4, &[]), &ctx(), &mut sink).await.unwrap();
    assert_eq!(sink.all(&summary).0, "ok");
    assert_eq!(v.log.requests().len(), 1);
    back.await.unwrap();
}

#[tokio::test]
async fn a_lone_lost_verifier_is_unavailable() {
    let v = spawn_verifier(vec![vec![Step::Fail(Status::unavailable("draining"))]]).await;
    let dl = decode_loop(&[&v.endpoint], &[], 2);
    let err = dl
        .run(&request(4, &[]), &ctx(), &mut TestSink::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, GatewayError::NoVerifier { attempts: 1 }),
        "{err:?}"
    );
    assert_eq!(err.code(), Code::Unavailable);
}

#[tokio::test]
async fn verifier_refusals_end_the_request_without_moving_it() {
    for (status, code) in [
        (
            Status::invalid_argument("context too long"),
            Code::InvalidArgument,
        ),
        (Status::internal("bug"), Code::Internal),
        (Status::deadline_exceeded("late"), Code::DeadlineExceeded),
    ] {
        let a = spawn_verifier(vec![vec![Step::Fail(status)]]).await;
        let b = spawn_verifier(vec![vec![started(), finished(0, "x")]]).await;
        let dl = decode_loop(&[&a.endpoint, &b.endpoint], &[], 2);
        let err = dl
            .run(&request(1, &[]), &ctx(), &mut TestSink::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        assert!(b.log.requests().is_empty());
    }
}

#[tokio::test]
async fn a_verifier_out_of_capacity_sends_the_request_to_another() {
    let full = || Step::Fail(Status::resource_exhausted("kv budget full"));
    // Placement without a session id starts anywhere; whichever verifier is
    // full, the other serves the request, and neither counts as lost.
    let a = spawn_verifier(vec![vec![full()]]).await;
    let b = spawn_verifier(vec![vec![started(), finished(0, "x")]]).await;
    let dl = decode_loop(&[&a.endpoint, &b.endpoint], &[], 0);
    let mut sink = TestSink::default();
    let summary = dl.run(&request(1, &[]), &ctx(), &mut sink).await.unwrap();
    assert_eq!(sink.all(&summary).0, "x");
    assert_eq!(b.log.requests().len(), 1);

    // Every verifier full: RESOURCE_EXHAUSTED, saying so.
    let a = spawn_verifier(vec![vec![full()]]).await;
    let b = spawn_verifier(vec![vec![full()]]).await;
    let dl = decode_loop(&[&a.endpoint, &b.endpoint], &[], 2);
    let err = dl
        .run(&request(1, &[]), &ctx(), &mut TestSink::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(
        err.to_string(),
        "the verifier is out of capacity: kv budget full (2 verifiers tried)"
    );
    assert_eq!(
        (a.log.requests().len(), b.log.requests().len()),
        (1, 1),
        "each was asked once"
    );
}

#[tokio::test]
async fn a_token_outside_the_vocabulary_is_a_protocol_error() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed_ids(0, vec![1_000_000], 0, 0, false, false),
        Step::Hang,
    ]])
    .await;
    let dl = decode_loop(&[&v.endpoint], &[], 2);
    let err = dl
        .run(&request(4, &[]), &ctx(), &mut TestSink::default())
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Protocol(_)), "{err:?}");
    v.log.wait_cancelled().await;
}

#[tokio::test]
async fn a_verifier_committing_past_the_budget_is_cut_at_it() {
    let v = spawn_verifier(vec![vec![
        started(),
        committed_ids(0, ids("abcdef"), 6, 5, false, true),
        Step::Hang,
    ]])
    .await;
    let dl = decode_loop(&[&v.endpoint], &[], 2);
    let mut sink = TestSink::default();
    let summary = dl.run(&request(4, &[]), &ctx(), &mut sink).await.unwrap();
    assert_eq!(sink.all(&summary).0, "abcd");
    // The EOS came after the budget ran out: the answer ended on length.
    assert_eq!(summary.finish_reason, FinishReason::Length);
    v.log.wait_cancelled().await;
}

#[tokio::test]
async fn a_closed_sink_cancels_the_generation() {
    #[derive(Debug)]
    struct Gone;
    impl DeltaSink for Gone {
        async fn send(&mut self, _: Delta) -> Result<(), ClientGone> {
            Err(ClientGone)
        }
    }
    let v = spawn_verifier(vec![vec![started(), committed(0, "a", 0, 0), Step::Hang]]).await;
    let dl = decode_loop(&[&v.endpoint], &[], 2);
    let err = dl
        .run(&request(4, &[]), &ctx(), &mut Gone)
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Cancelled));
    v.log.wait_cancelled().await;
}
