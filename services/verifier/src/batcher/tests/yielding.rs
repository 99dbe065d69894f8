//! Trees a batch does not wait for (`batcher::yielding`): a session
//! waiting for its tree is called in, root-only, when every other session
//! is in (its tree does not pay) or when the batch's wait runs out, and a
//! called session's step joins the batch forming.

use super::*;

/// Whether `wait` is called in within `within`.
async fn called_within(wait: &mut YieldingWait, within: Duration) -> bool {
    tokio::time::timeout(within, wait.called()).await.is_ok()
}

/// Two decoding sessions, A and B, on a batcher with `window`: their
/// prompts, their root-only steps (prefilled before any wait starts) and
/// the gauges that count them decoding.
struct Two {
    b: Batcher,
    prompts: [Vec<u32>; 2],
    steps: [(Box<Session>, TokenTree); 2],
    _decoding: [Gauge; 2],
}

fn two(window: Duration) -> Two {
    let b = batcher(config(8, window, 0));
    let prompts = [prompt(PROMPTS[0]), prompt(PROMPTS[1])];
    let steps = [
        plain_job(prefilled(&prompts[0])),
        plain_job(prefilled(&prompts[1])),
    ];
    let c = b.counters();
    let _decoding = [Gauge::up(&c.decoding), Gauge::up(&c.decoding)];
    Two {
        b,
        prompts,
        steps,
        _decoding,
    }
}

/// A's and B's steps were verified in one forward, each committing plain
/// greedy's token.
async fn one_forward(b: &Batcher, calls: [Vec<Call<'_>>; 2], prompts: &[Vec<u32>; 2]) {
    for (calls, p) in calls.into_iter().zip(prompts) {
        for done in answers(calls).await {
            let (_, step, n) = ok(done);
            assert_eq!((n, step.committed), (2, plain(p, 1)));
        }
    }
    assert_eq!(counts(b.counters()), (1, 2), "one forward for both");
}

#[tokio::test]
async fn a_tree_that_does_not_pay_is_not_waited_for_once_every_other_session_is_in() {
    let Two {
        b,
        prompts,
        steps: [a, bs],
        _decoding,
    } = two(FOREVER);
    let mut wait = b.yielding_wait(Patience::Others);
    assert_eq!(b.counters().yields.waiting(Patience::Others), 1);
    // Nobody in yet: nothing waits for this tree but its own step.
    assert!(!called_within(&mut wait, Duration::from_millis(100)).await);
    let calls_a = send_steps(&b, vec![a]);
    assert!(
        called_within(&mut wait, WEDGED).await,
        "A is in: B is called in"
    );
    drop(wait);
    assert_eq!(b.counters().yields.waiting(Patience::Others), 0);
    let calls_b = send_steps(&b, vec![bs]);
    one_forward(&b, [calls_a, calls_b], &prompts).await;
}

/// A paying session's wait (B's) while A's step is in, on a batch
/// window of `window`: called in when the window ends (`called`) or
/// waited for all along; either way B's step joins A's forward.
async fn a_paying_wait(window: Duration, called: bool) {
    let Two {
        b,
        prompts,
        steps: [a, bs],
        _decoding,
    } = two(window);
    let mut wait = b.yielding_wait(Patience::Deadline);
    let calls_a = send_steps(&b, vec![a]);
    if called {
        assert!(called_within(&mut wait, WEDGED).await, "the window ran out");
    } else {
        assert!(!called_within(&mut wait, Duration::from_millis(200)).await);
        assert_eq!(counts(b.counters()), (0, 0), "A waits");
    }
    drop(wait);
    let calls_b = send_steps(&b, vec![bs]);
    one_forward(&b, [calls_a, calls_b], &prompts).await;
}

#[tokio::test]
async fn a_tree_that_pays_is_waited_for_while_the_batch_s_wait_lasts() {
    // The window outlasts the test: A's batch waits for B's tree.
    a_paying_wait(FOREVER, false).await;
}

#[tokio::test]
async fn a_tree_still_missing_when_the_batch_s_wait_ends_joins_it_root_only() {
    // A short window: the missing tree is called in, and its session joins
    // the batch instead of stepping in a forward of its own (as a session
    // that does not wait for a tree does:
    // `a_step_that_arrives_later_runs_in_a_later_batch`).
    a_paying_wait(Duration::from_millis(20), true).await;
}
