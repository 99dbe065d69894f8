//! Predicted outputs (`GenerateRequest.prediction`) through the whole mesh:
//! the caller's expected text drafts for the session, the output stays
//! exactly the greedy output, and `usage` says how much of the prediction
//! the output used. Real processes, the real model.

use specmesh_e2e::mesh::{Mesh, chat_request, without_speculation};
use specmesh_proto::v1;

/// A verify cost that barely grows, so sessions draft whenever they can.
const FLAT_CURVE: &str = "1:1,2:1.01,4:1.02,8:1.04,16:1.08,32:1.16,64:1.32";

fn ask(tenant: &str, prediction: &str) -> v1::GenerateRequest {
    let mut r = chat_request(
        "Write a short poem about a lighthouse keeper, in six lines.",
        96,
    );
    // Each run its own tenant: no run drafts from another's indexed output.
    r.tenant = tenant.to_owned();
    r.prediction = prediction.to_owned();
    r
}

/// `text` with its middle third replaced by other words (on character
/// boundaries): an edit the output does not follow.
fn edited(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let (a, b) = (chars.len() / 3, 2 * chars.len() / 3);
    let head: String = chars[..a].iter().collect();
    let tail: String = chars[b..].iter().collect();
    format!("{head} and then the quick brown fox jumped over it all {tail}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prediction_changes_no_output_and_is_accepted_where_it_holds() {
    let mesh = Mesh::start_with(1, 1, &[("SPECMESH_VERIFIER_COST_CURVE", FLAT_CURVE)]);
    let mut client = mesh.client().await;
    let plain = client
        .generate(without_speculation(ask("plain", "")))
        .await
        .unwrap()
        .into_inner();
    assert!(
        plain.token_ids.len() > 40,
        "a long enough answer: {plain:?}"
    );

    let run = |tenant: &'static str, prediction: String| {
        let mut client = client.clone();
        async move {
            client
                .generate(ask(tenant, &prediction))
                .await
                .unwrap()
                .into_inner()
        }
    };
    let none = run("none", String::new()).await;
    let exact = run("exact", plain.text.clone()).await;
    let edit = edited(&plain.text);
    let partial = run("edit", edit.clone()).await;

    // Lossless: the same tokens every time.
    for r in [&none, &exact, &partial] {
        assert_eq!(r.token_ids, plain.token_ids);
        assert_eq!(r.text, plain.text);
    }
    let accepted = |r: &v1::GenerateResponse| r.speculation.as_ref().unwrap().accepted_tokens;
    let steps = |r: &v1::GenerateResponse| r.speculation.as_ref().unwrap().verify_steps;
    let usage = |r: &v1::GenerateResponse| r.usage.unwrap();
    println!(
        "{} tokens; accepted / steps: none {}/{}, exact {}/{}, edited {}/{}; \
         prediction used: exact {:?}, edited {:?}",
        plain.token_ids.len(),
        accepted(&none),
        steps(&none),
        accepted(&exact),
        steps(&exact),
        accepted(&partial),
        steps(&partial),
        usage(&exact),
        usage(&partial),
    );

    // The exact prediction is taken nearly whole: most tokens come from it,
    // in a fraction of the steps.
    let n = plain.token_ids.len() as u32;
    assert!(
        accepted(&exact) * 10 >= n * 7,
        "exact: {:?}",
        exact.speculation
    );
    assert!(
        steps(&exact) * 2 < steps(&none),
        "{} vs {}",
        steps(&exact),
        steps(&none)
    );
    // The edited one still helps where the output follows it, and less of
    // it is used. (Its steps against the exact one's are not compared: how
    // deep each tree may go is sized by measured step times, so a few steps
    // either way are the machine's, not the prediction's.)
    assert!(steps(&partial) < steps(&none), "{:?}", partial.speculation);
    assert!(
        usage(&partial).accepted_prediction_tokens < usage(&exact).accepted_prediction_tokens,
        "{:?} vs {:?}",
        usage(&partial),
        usage(&exact)
    );

    // OpenAI's accounting: the prediction's tokens the output used, and the rest.
    let u = usage(&exact);
    let total = u.accepted_prediction_tokens + u.rejected_prediction_tokens;
    assert!(
        total >= n - 2 && total <= n + 2,
        "the prediction is the output: {u:?}"
    );
    assert!(u.accepted_prediction_tokens * 10 >= total * 9, "{u:?}");
    let u = usage(&partial);
    assert!(
        u.rejected_prediction_tokens > 5,
        "the inserted words are rejected: {u:?}"
    );
    assert!(u.accepted_prediction_tokens > n / 3, "{u:?}");
    assert_eq!(usage(&none).accepted_prediction_tokens, 0);
    assert_eq!(usage(&none).rejected_prediction_tokens, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prediction_longer_than_the_context_is_refused_by_name() {
    let mesh = Mesh::start();
    let mut client = mesh.client().await;
    let status = client
        .generate(ask("long", &"word ".repeat(9000)))
        .await
        .expect_err("a prediction over SmolLM2's 8192-token context");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("`prediction` is")
            && status
                .message()
                .contains("over the model's context of 8192 tokens"),
        "{}",
        status.message()
    );
}
