//! A session over repetitive text, driven by a simulated greedy verifier.

use specmesh_drafter::Config;
use specmesh_proto::v1;

use crate::common::{Drafter, Stream, config, draft_start, root_child, tree_depth, verify_greedy};

/// Token `i` of an endless text that repeats a 12-token phrase.
fn phrase(i: usize) -> u32 {
    [101, 7, 250, 33, 640, 12, 99, 4, 871, 56, 300, 18][i % 12]
}

fn text(range: std::ops::Range<usize>) -> Vec<u32> {
    range.map(phrase).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repetitive_session_gets_its_continuation_drafted_within_the_bounds() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;
    // Three and a half repetitions of the phrase as the prompt.
    let mut len = 42;
    let (max_draft, max_depth) = (6, 4);
    let mut stream = Stream::start(
        &mut client,
        draft_start("", text(0..len), max_draft, max_depth),
    )
    .await;

    let mut tree = stream.tree().await;
    assert_eq!((tree.epoch, tree.step), (3, 0));
    assert_eq!(tree.root_token, phrase(len - 1));
    assert!(
        root_child(&tree, phrase(len)),
        "the obvious continuation {} is drafted: {tree:?}",
        phrase(len)
    );

    let mut accepted = 0;
    for step in 0..40u64 {
        assert_eq!(tree.step, step);
        assert_eq!(
            tree.root_token,
            phrase(len - 1),
            "rooted at the last committed token"
        );
        assert!(
            tree.nodes.len() <= max_draft as usize,
            "{} nodes",
            tree.nodes.len()
        );
        assert!(tree_depth(&tree) <= max_depth as usize);
        let (path, committed) = verify_greedy(&tree, &text(len..len + 64));
        accepted += path.len() - 1;
        len += committed.len();
        stream
            .outcome(v1::StepOutcome {
                step,
                path,
                committed,
                top_k: Vec::new(),
                batch_size: 4,
            })
            .await;
        tree = stream.tree().await;
    }
    assert!(
        accepted >= 100,
        "the repetition is accepted: {accepted} tokens over 40 steps"
    );
    stream.close().await;

    let stats = drafter.stats.snapshot();
    assert_eq!(stats.trees_sent, 41);
    assert_eq!(stats.accepted_nodes, accepted as u64);
    assert!(stats.drafted_nodes >= stats.accepted_nodes);
    println!(
        "model-free drafting: {:.1} µs per tree over {} trees",
        stats.propose_time.as_secs_f64() * 1e6 / stats.trees_sent as f64,
        stats.trees_sent
    );
    drafter
        .wait_for("the session to close", |s| s.sessions_open == 0)
        .await;
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_budget_still_answers_every_step_with_the_root_alone() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;

    // max_draft_tokens = 0: the verifier wants no speculation at all.
    let mut len = 30;
    let mut stream = Stream::start(&mut client, draft_start("", text(0..len), 0, 4)).await;
    for step in 0..10u64 {
        let tree = stream.tree().await;
        // Trees after the first are sent ahead of their outcome ("nothing
        // drafted"), before the drafter knows their root.
        assert_eq!(tree.step, step);
        assert!(step > 0 || tree.root_token == phrase(len - 1));
        assert!(tree.nodes.is_empty(), "root only: {tree:?}");
        stream
            .outcome(v1::StepOutcome {
                step,
                committed: vec![phrase(len)],
                ..Default::default()
            })
            .await;
        len += 1;
    }
    stream.close().await;

    // A cost curve under which no tree pays: the policy's budget is zero.
    let mut start = draft_start("", text(0..30), 16, 8);
    start.cost_curve = [(1, 1.0), (2, 50.0), (16, 800.0)]
        .into_iter()
        .map(|(tokens, relative_cost)| v1::CostPoint {
            tokens,
            relative_cost,
        })
        .collect();
    let mut len = 30;
    let mut stream = Stream::start(&mut client, start).await;
    for step in 0..10u64 {
        let tree = stream.tree().await;
        assert_eq!(tree.step, step);
        assert!(step > 0 || tree.root_token == phrase(len - 1));
        assert!(tree.nodes.is_empty(), "speculation does not pay: {tree:?}");
        stream
            .outcome(v1::StepOutcome {
                step,
                committed: vec![phrase(len)],
                batch_size: 1,
                ..Default::default()
            })
            .await;
        len += 1;
    }
    let last = stream.tree().await;
    assert_eq!(last.step, 10);
    stream.close().await;
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_nothing_is_drafted_the_next_tree_comes_before_the_outcome() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;
    let mut stream = Stream::start(&mut client, draft_start("", text(0..30), 0, 4)).await;
    // Step 0's tree and, without any outcome sent, step 1's.
    let first = stream.tree().await;
    let ahead = stream.tree().await;
    assert_eq!((first.step, ahead.step), (0, 1));
    assert!(first.nodes.is_empty() && ahead.nodes.is_empty());
    // Step 0's outcome is answered with step 2's tree, again ahead.
    stream
        .outcome(v1::StepOutcome {
            step: 0,
            committed: vec![phrase(30)],
            ..Default::default()
        })
        .await;
    assert_eq!(stream.tree().await.step, 2);
    stream.close().await;

    // Without pipelining, one tree per outcome.
    let off = Drafter::start(Config {
        pipeline: false,
        ..config()
    })
    .await;
    let mut client = off.client().await;
    let mut stream = Stream::start(&mut client, draft_start("", text(0..30), 0, 4)).await;
    assert_eq!(stream.tree().await.step, 0);
    stream
        .outcome(v1::StepOutcome {
            step: 0,
            committed: vec![phrase(30)],
            ..Default::default()
        })
        .await;
    let next = stream.tree().await;
    assert_eq!((next.step, next.root_token), (1, phrase(30)));
    stream.close().await;
}
