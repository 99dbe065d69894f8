//! Bad input ends the stream with INVALID_ARGUMENT naming the field; stale
//! and duplicated outcomes are ignored; a full drafter refuses new streams.

use std::time::Duration;

use specmesh_proto::v1;
use tonic::Code;

use crate::common::{
    Drafter, Stream, assert_invalid, config, draft_start, outcome_message, start_message,
};

fn tokens() -> Vec<u32> {
    vec![5, 6, 7, 5, 6, 7, 5, 6]
}

/// The status a stream opened with `first` ends with.
async fn refused(drafter: &Drafter, first: v1::DraftRequest) -> tonic::Status {
    let mut client = drafter.client().await;
    Stream::open(&mut client, first)
        .await
        .expect("the call itself is accepted")
        .error()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_start_is_refused_naming_the_field() {
    let drafter = Drafter::start(config()).await;

    let status = refused(&drafter, outcome_message(v1::StepOutcome::default())).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("must be `start`"), "{status:?}");

    let status = refused(&drafter, start_message(draft_start("", Vec::new(), 8, 4))).await;
    assert_invalid(&status, "start.tokens");

    let mut start = draft_start("", tokens(), 8, 4);
    start.vocab_size = 0;
    assert_invalid(
        &refused(&drafter, start_message(start)).await,
        "start.vocab_size",
    );

    let mut start = draft_start("", tokens(), 8, 4);
    start.tokens[2] = 1000;
    let status = refused(&drafter, start_message(start)).await;
    assert_invalid(&status, "start.tokens[2]");
    assert!(status.message().contains("outside the vocabulary of 1000"));

    let mut start = draft_start("", tokens(), 8, 4);
    start.prompt_len = 99;
    assert_invalid(
        &refused(&drafter, start_message(start)).await,
        "start.prompt_len",
    );

    let status = refused(&drafter, v1::DraftRequest { kind: None }).await;
    assert_eq!(status.code(), Code::InvalidArgument);

    drafter
        .wait_for("the failed streams to close", |s| s.sessions_open == 0)
        .await;
    assert_eq!(drafter.stats.snapshot().sessions_failed, 6);
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_outcome_ends_the_stream_naming_the_field() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;

    let mut stream = Stream::start(&mut client, draft_start("", tokens(), 8, 4)).await;
    let tree = stream.tree().await;
    let out_of_range = tree.nodes.len() as u32 + 1;
    stream
        .outcome(v1::StepOutcome {
            step: 0,
            path: vec![0, out_of_range],
            committed: vec![7],
            ..Default::default()
        })
        .await;
    assert_invalid(&stream.error().await, "outcome.path[1]");

    let mut stream = Stream::start(&mut client, draft_start("", tokens(), 8, 4)).await;
    stream.tree().await;
    stream.outcome(v1::StepOutcome::default()).await;
    assert_invalid(&stream.error().await, "outcome.committed");

    let mut stream = Stream::start(&mut client, draft_start("", tokens(), 8, 4)).await;
    stream.tree().await;
    stream
        .send(start_message(draft_start("", tokens(), 8, 4)))
        .await;
    let status = stream.error().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("`start` may only be the first"),
        "{status:?}"
    );

    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_and_duplicated_outcomes_are_ignored() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;
    let mut stream = Stream::start(&mut client, draft_start("", tokens(), 8, 4)).await;
    assert_eq!(stream.tree().await.step, 0);
    let step0 = v1::StepOutcome {
        step: 0,
        committed: vec![7],
        ..Default::default()
    };
    stream.outcome(step0.clone()).await;
    assert_eq!(stream.tree().await.step, 1);

    // The same outcome again, and an older one: no answer, no harm.
    stream.outcome(step0.clone()).await;
    assert!(stream.quiet_for(Duration::from_millis(200)).await);

    stream
        .outcome(v1::StepOutcome {
            step: 1,
            committed: vec![5],
            ..Default::default()
        })
        .await;
    let tree = stream.tree().await;
    assert_eq!(
        (tree.step, tree.root_token),
        (2, 5),
        "the duplicate changed nothing"
    );
    stream.outcome(step0).await;

    // An outcome from the future means outcomes went missing.
    stream
        .outcome(v1::StepOutcome {
            step: 9,
            committed: vec![5],
            ..Default::default()
        })
        .await;
    assert_invalid(&stream.error().await, "outcome.step");
    assert_eq!(drafter.stats.snapshot().stale_outcomes, 2);
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_over_the_session_limit_are_refused_with_resource_exhausted() {
    let mut cfg = config();
    cfg.max_sessions = 1;
    let drafter = Drafter::start(cfg).await;
    let mut client = drafter.client().await;

    let mut first = Stream::start(&mut client, draft_start("", tokens(), 8, 4)).await;
    first.tree().await;
    let status = Stream::open(&mut client, start_message(draft_start("", tokens(), 8, 4)))
        .await
        .err()
        .expect("the second stream is refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(drafter.stats.snapshot().sessions_refused, 1);

    // Closing the first frees its slot.
    first.close().await;
    let mut again = Stream::start(&mut client, draft_start("", tokens(), 8, 4)).await;
    assert_eq!(again.tree().await.step, 0);
    again.close().await;
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_starts_times_out() {
    let mut cfg = config();
    cfg.start_timeout = Duration::from_millis(300);
    let drafter = Drafter::start(cfg).await;
    let mut client = drafter.client().await;
    let (tx, rx) = tokio::sync::mpsc::channel::<v1::DraftRequest>(1);
    let mut response = client
        .draft(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let status = tokio::time::timeout(Duration::from_secs(10), response.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    drop(tx);
    drafter.shutdown().await.unwrap();
}
