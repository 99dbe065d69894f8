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
        if !tree.nodes.is_empty() {
            assert_eq!(
                tree.drafted_by,
                v1::DraftSources::ModelFree as i32,
                "a tree names the way it was drafted"
            );
        }
        let (path, committed) = verify_greedy(&tree, &text(len..len + 64));
        accepted += path.len() - 1;
        len += committed.len();
        tree = stream.verified(step, path, committed, 4).await;
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

/// A verifier that lost a session's drafter re-attaches it to another at a
/// later step: the start carries the output committed so far and the step
/// to go on from; trees and outcomes count from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reattached_at_a_later_step_drafts_from_its_committed_context() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;
    // Prompt of 30 tokens, then 12 committed on the lost drafter's watch.
    let len = 42;
    let mut start = draft_start("", text(0..len), 6, 4);
    start.prompt_len = 30;
    start.first_step = 9;
    let mut stream = Stream::start(&mut client, start).await;
    let tree = stream.tree().await;
    assert_eq!((tree.epoch, tree.step), (3, 9));
    assert_eq!(tree.root_token, phrase(len - 1));
    assert!(root_child(&tree, phrase(len)), "{tree:?}");
    let (path, committed) = verify_greedy(&tree, &text(len..len + 64));
    stream
        .outcome(v1::StepOutcome {
            step: 9,
            path,
            committed,
            batch_size: 1,
            ..Default::default()
        })
        .await;
    assert_eq!(stream.tree().await.step, 10);
    stream.close().await;

    let mut far = draft_start("", text(0..len), 6, 4);
    far.first_step = u64::MAX - 3;
    let mut stream = Stream::start(&mut client, far).await;
    let status = stream.error().await;
    crate::common::assert_invalid(&status, "start.first_step");
}

/// Drives a stream as a verifier would for `steps` steps, taking the
/// phrase as the target's output: a tree with no nodes and a span stands
/// for its steps, reported in one outcome. Returns the trees, each checked
/// to be the next step's.
async fn drive(stream: &mut Stream, mut len: usize, steps: u64) -> Vec<v1::TokenTree> {
    let mut trees = Vec::new();
    let mut step = 0;
    while step < steps {
        let tree = stream.tree().await;
        assert_eq!(tree.step, step, "every step is covered, once: {tree:?}");
        assert!(step > 0 || tree.root_token == phrase(len - 1));
        let span = u64::from(tree.span.max(1));
        assert!(span == 1 || tree.nodes.is_empty(), "{tree:?}");
        // No tree in this test is accepted beyond its root.
        let committed = text(len..len + span as usize);
        len += committed.len();
        step += span;
        stream
            .outcome(v1::StepOutcome {
                step: step - 1,
                span: span as u32,
                committed,
                batch_size: 1,
                ..Default::default()
            })
            .await;
        trees.push(tree);
    }
    trees
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_budget_still_covers_every_step_with_the_root_alone() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;

    // max_draft_tokens = 0: the verifier wants no speculation at all. Step
    // 0's tree, then runs of the longest span, sent ahead.
    let mut stream = Stream::start(&mut client, draft_start("", text(0..30), 0, 4)).await;
    let trees = drive(&mut stream, 30, 200).await;
    let spans: Vec<u32> = trees.iter().map(|t| t.span).collect();
    assert_eq!(spans, [0, 64, 64, 64, 64]);
    assert!(trees.iter().all(|t| t.nodes.is_empty()));
    stream.close().await;

    // A cost curve under which no tree pays: the policy's budget is zero
    // but for a probe every 16th step, and the runs between probes are
    // spans.
    let mut start = draft_start("", text(0..30), 16, 8);
    start.cost_curve = [(1, 1.0), (2, 50.0), (16, 800.0)]
        .into_iter()
        .map(|(tokens, relative_cost)| v1::CostPoint {
            tokens,
            relative_cost,
        })
        .collect();
    let mut stream = Stream::start(&mut client, start).await;
    let trees = drive(&mut stream, 30, 47).await;
    let steps: Vec<(u64, u32)> = trees.iter().map(|t| (t.step, t.span)).collect();
    assert_eq!(
        steps,
        [(0, 0), (1, 14), (15, 0), (16, 15), (31, 0), (32, 15)]
    );
    for t in &trees {
        let probe = t.step % 16 == 15;
        assert_eq!(t.nodes.is_empty(), !probe, "only probes draft: {t:?}");
    }
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
    // It stands for the longest run of steps; step 0's outcome is answered
    // with the tree of the run after it, again ahead.
    assert_eq!(ahead.span, 64);
    stream
        .outcome(v1::StepOutcome {
            step: 0,
            committed: vec![phrase(30)],
            ..Default::default()
        })
        .await;
    let next = stream.tree().await;
    assert_eq!((next.step, next.span), (65, 64));
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
    assert_eq!((next.step, next.root_token, next.span), (1, phrase(30), 0));
    stream.close().await;
}

/// Runs one session of `tenant` over the phrase for `steps` steps, its
/// trees verified greedily against the phrase; returns its first tree.
async fn taught_session(drafter: &Drafter, tenant: &str, steps: u64) -> v1::TokenTree {
    let mut client = drafter.client().await;
    let mut len = 42;
    let mut stream = Stream::start(&mut client, draft_start(tenant, text(0..len), 16, 8)).await;
    let first = stream.tree().await;
    let mut tree = first.clone();
    for step in 0..steps {
        let (path, committed) = verify_greedy(&tree, &text(len..len + 64));
        len += committed.len();
        tree = stream.verified(step, path, committed, 1).await;
    }
    stream.close().await;
    first
}

/// A tenant's later sessions start from what its earlier ones measured:
/// after sessions whose trees the target accepted throughout, a new
/// session of that tenant drafts its first tree deeper than one of
/// another tenant, which starts from the policy's guess; with
/// `--learn-across-sessions false` every session starts from the guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_sessions_of_a_tenant_start_from_what_earlier_ones_learned() {
    for learn in [true, false] {
        let drafter = Drafter::start(Config {
            learn_across_sessions: learn,
            ..config()
        })
        .await;
        let guess = tree_depth(&taught_session(&drafter, "a", 30).await);
        for _ in 0..2 {
            taught_session(&drafter, "a", 30).await;
        }
        drafter
            .wait_for("the sessions to close", |s| s.sessions_open == 0)
            .await;
        let taught = tree_depth(&taught_session(&drafter, "a", 0).await);
        let other = tree_depth(&taught_session(&drafter, "b", 0).await);
        assert_eq!(other, guess, "another tenant starts from the guess");
        if learn {
            assert!(taught > guess, "{taught} levels against {guess}");
        } else {
            assert_eq!(taught, guess);
        }
        drafter.shutdown().await.unwrap();
    }
}
