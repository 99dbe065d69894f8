//! A verifier that loses a session's drafter keeps decoding plain and
//! re-attaches the session to another drafter at a step boundary: the new
//! drafter rebuilds its state from the committed context and drafts again.
//! Real verifier, real drafters, the real model; the drafter is killed
//! mid-session.

use specmesh_e2e::service::Service;
use specmesh_e2e::{model_path, tokenize as tokens};
use specmesh_proto::v1;
use specmesh_proto::v1::session_event::Event;
use specmesh_proto::v1::verifier_client::VerifierClient;

/// A verify cost that barely grows, so the session drafts whenever it can.
const FLAT_CURVE: &str = "1:1,2:1.01,4:1.02,8:1.04,16:1.08,32:1.16,64:1.32";

/// Raw text (no chat template) the model goes on repeating for hundreds
/// of tokens, which the prompt-lookup drafter predicts from the start.
fn prompt() -> String {
    "the quick brown fox jumps over the lazy dog.\n".repeat(12)
}

fn request(tokens: &[u32], draft: Option<v1::DraftPlan>) -> v1::RunRequest {
    v1::RunRequest {
        session_id: "reattach".into(),
        epoch: 1,
        tokens: tokens.to_vec(),
        prompt_len: tokens.len() as u32,
        max_new_tokens: 200,
        draft,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_drafter_is_replaced_at_a_step_boundary_and_the_output_is_unchanged() {
    let model = model_path().display().to_string();
    let first = Service::start("specmesh-drafter", &[] as &[&str], &[]);
    let second = Service::start("specmesh-drafter", &[] as &[&str], &[]);
    let gone = empty_address();
    let drafters = format!("{},{},{gone}", first.url, second.url);
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--cost-curve",
            FLAT_CURVE,
            "--threads",
            "2",
            "--drafters",
            &drafters,
        ],
        &[],
    );
    let mut client = VerifierClient::connect(verifier.url.clone()).await.unwrap();
    let tokens = tokens(&prompt());

    // Plain decoding: the output every speculative run must equal.
    let mut plain = Vec::new();
    let mut events = client
        .run(request(&tokens, None))
        .await
        .unwrap()
        .into_inner();
    while let Some(e) = events.message().await.unwrap() {
        if let Some(Event::Committed(c)) = e.event {
            plain.extend(c.tokens);
        }
    }

    let plan = v1::DraftPlan {
        endpoint: first.url.clone(),
        sources: v1::DraftSources::ModelFree as i32,
        fallback_endpoints: vec![second.url.clone()],
        ..Default::default()
    };
    let mut events = client
        .run(request(&tokens, Some(plan)))
        .await
        .unwrap()
        .into_inner();
    let mut first = Some(first);
    let (mut out, mut steps) = (Vec::<u32>::new(), Vec::<(u64, u32)>::new());
    let mut killed_at = None;
    while let Some(e) = events.message().await.unwrap() {
        match e.event {
            Some(Event::Started(s)) => assert!(s.drafting, "the first drafter takes it"),
            Some(Event::Committed(c)) => {
                out.extend(&c.tokens);
                steps.push((c.step, c.drafted));
                if killed_at.is_none() && steps.len() == 2 {
                    // The session's drafter dies (SIGKILL) mid-session.
                    drop(first.take());
                    killed_at = Some(c.step);
                }
            }
            None => {}
        }
    }
    let killed_at = killed_at.expect("the session ran past two steps");
    assert_eq!(out, plain, "speculation changed the output");
    assert!(
        steps[..2].iter().any(|&(_, d)| d > 0),
        "the first drafter drafted: {steps:?}"
    );
    // Steps right after the kill verify the root alone; a later one drafts
    // again, from the second drafter.
    let after: Vec<_> = steps.iter().filter(|&&(s, _)| s > killed_at).collect();
    assert!(
        after.iter().any(|&&(_, d)| d > 0),
        "nothing drafted after the drafter was lost: {steps:?}"
    );
    println!("{} tokens; steps (step, drafted): {steps:?}", out.len());

    // The other way round, and the first drafter's address empty: a
    // session that never reaches its drafter re-attaches too.
    let plan = v1::DraftPlan {
        endpoint: gone,
        sources: v1::DraftSources::ModelFree as i32,
        fallback_endpoints: vec![second.url.clone()],
        ..Default::default()
    };
    let mut events = client
        .run(request(&tokens, Some(plan)))
        .await
        .unwrap()
        .into_inner();
    let (mut out, mut drafted) = (Vec::<u32>::new(), 0);
    while let Some(e) = events.message().await.unwrap() {
        match e.event {
            Some(Event::Started(s)) => assert!(!s.drafting, "no drafter at the address"),
            Some(Event::Committed(c)) => {
                out.extend(&c.tokens);
                drafted += c.drafted;
            }
            None => {}
        }
    }
    assert_eq!(out, plain);
    assert!(drafted > 0, "the fallback drafter never took the session");
}

/// A draft plan may name only the verifier's own `--drafters`: a running
/// drafter outside the list, as the session's drafter or as a fallback, is
/// refused with INVALID_ARGUMENT before anything is dialed, while the
/// same request with listed drafters runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verifier_refuses_a_draft_endpoint_it_was_not_given() {
    let model = model_path().display().to_string();
    let listed = Service::start("specmesh-drafter", &[] as &[&str], &[]);
    let stranger = Service::start("specmesh-drafter", &[] as &[&str], &[]);
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--cost-curve",
            FLAT_CURVE,
            "--threads",
            "2",
            "--drafters",
            &listed.url,
        ],
        &[],
    );
    let mut client = VerifierClient::connect(verifier.url.clone()).await.unwrap();
    let tokens = tokens("def add(a, b):");
    let plan = |endpoint: &str, fallbacks: &[&str]| v1::DraftPlan {
        endpoint: endpoint.to_owned(),
        sources: v1::DraftSources::ModelFree as i32,
        fallback_endpoints: fallbacks.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    };
    for (endpoint, fallbacks) in [
        (stranger.url.as_str(), &[][..]),
        (listed.url.as_str(), &[stranger.url.as_str()][..]),
        ("http://169.254.169.254:80", &[][..]),
    ] {
        let mut r = request(&tokens, Some(plan(endpoint, fallbacks)));
        r.max_new_tokens = 4;
        let status = client.run(r).await.expect_err("an unlisted drafter");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        let unlisted = fallbacks.first().copied().unwrap_or(endpoint);
        assert!(
            status
                .message()
                .contains(&format!("draft endpoint `{unlisted}`"))
                && status.message().contains(&listed.url),
            "the message names the endpoint and the list: {}",
            status.message()
        );
    }
    let mut r = request(&tokens, Some(plan(&listed.url, &[])));
    r.max_new_tokens = 4;
    let mut events = client.run(r).await.unwrap().into_inner();
    let mut drafting = None;
    while let Some(e) = events.message().await.unwrap() {
        if let Some(Event::Started(s)) = e.event {
            drafting = Some(s.drafting);
        }
    }
    assert_eq!(drafting, Some(true), "the listed drafter takes the session");
}

/// A loopback address nothing listens on (bound, then released).
fn empty_address() -> String {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    format!("http://{addr}")
}
