//! The global suffix index through the service: a finished session's
//! output is drafted for its tenant's later sessions, and only theirs.

use specmesh_proto::v1;

use crate::common::{Drafter, Stream, config, draft_start, root_child};

/// A distinctive output no prompt below contains.
fn output() -> Vec<u32> {
    (0..40).map(|i| 500 + (i * 37) % 400).collect()
}

/// An unrelated prompt of `n` tokens.
fn prompt(seed: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| (seed + i * 13) % 97 + 1).collect()
}

/// Runs a session of `tenant` that commits `output()` and closes.
async fn finish_session(drafter: &Drafter, tenant: &str) {
    let mut client = drafter.client().await;
    let mut stream = Stream::start(&mut client, draft_start(tenant, prompt(1, 20), 8, 6)).await;
    stream.tree().await;
    for (step, chunk) in output().chunks(5).enumerate() {
        // The verifier decoded without our trees: empty path, its tokens.
        stream
            .verified(step as u64, Vec::new(), chunk.to_vec(), 1)
            .await;
    }
    stream.close().await;
}

/// The first tree of a session of `tenant` whose context ends with the
/// first 6 tokens of `output()` after an unrelated prompt.
async fn first_tree(drafter: &Drafter, tenant: &str) -> v1::TokenTree {
    let mut client = drafter.client().await;
    let mut tokens = prompt(40, 25);
    tokens.extend_from_slice(&output()[..6]);
    let mut stream = Stream::start(&mut client, draft_start(tenant, tokens, 8, 6)).await;
    let tree = stream.tree().await;
    stream.close().await;
    tree
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_output_is_drafted_for_its_tenant_only() {
    let drafter = Drafter::start(config()).await;
    let next = output()[6];

    let before = first_tree(&drafter, "a").await;
    assert!(
        !root_child(&before, next),
        "nothing indexed yet: {before:?}"
    );

    finish_session(&drafter, "a").await;
    drafter
        .wait_for("session A's output to be indexed", |s| {
            s.outputs_indexed == 1
        })
        .await;

    let b = first_tree(&drafter, "a").await;
    assert!(
        root_child(&b, next),
        "tenant a's later session drafts A's output ({next} next): {b:?}"
    );
    let c = first_tree(&drafter, "b").await;
    assert!(
        !c.nodes.iter().any(|n| output()[6..].contains(&n.token)),
        "tenant b never sees tenant a's text: {c:?}"
    );
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anonymous_tenant_is_one_tenant_and_a_zero_index_disables_sharing() {
    let drafter = Drafter::start(config()).await;
    finish_session(&drafter, "").await;
    drafter
        .wait_for("indexing", |s| s.outputs_indexed >= 1)
        .await;
    assert!(root_child(&first_tree(&drafter, "").await, output()[6]));
    drafter.shutdown().await.unwrap();

    let mut cfg = config();
    cfg.global_index_bytes = 0;
    let drafter = Drafter::start(cfg).await;
    finish_session(&drafter, "").await;
    drafter
        .wait_for("the session to end", |s| s.sessions_open == 0)
        .await;
    assert!(!root_child(&first_tree(&drafter, "").await, output()[6]));
    assert_eq!(drafter.stats.snapshot().outputs_indexed, 0);
    drafter.shutdown().await.unwrap();
}
