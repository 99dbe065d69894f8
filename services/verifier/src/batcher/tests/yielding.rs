//! Trees a batch does not wait for (`batcher::yielding`): a session
//! waiting for its tree is called in, root-only, when every other session
//! is in (its tree does not pay) or when the batch's wait runs out, and a
//! called session's step joins the batch forming.

use super::*;

/// Whether `wait` is called in within `within`.
async fn called_within(wait: &mut YieldingWait, within: Duration) -> bool {
    tokio::time::timeout(within, wait.called()).await.is_ok()
}

#[tokio::test]
async fn a_tree_that_does_not_pay_is_not_waited_for_once_every_other_session_is_in() {
    let b = batcher(config(8, FOREVER, 0));
    let c = b.counters();
    let (pa, pb) = (prompt(PROMPTS[0]), prompt(PROMPTS[1]));
    let (a, bs) = (plain_job(prefilled(&pa)), plain_job(prefilled(&pb)));
    let _decoding = [Gauge::up(&c.decoding), Gauge::up(&c.decoding)];
    let mut wait = b.yielding_wait(Patience::Others);
    assert_eq!(c.yields.waiting(Patience::Others), 1);
    // Nobody in yet: nothing waits for this tree but its own step.
    assert!(!called_within(&mut wait, Duration::from_millis(100)).await);
    let calls_a = send_steps(&b, vec![a]);
    assert!(
        called_within(&mut wait, WEDGED).await,
        "A is in: B is called in"
    );
    drop(wait);
    assert_eq!(c.yields.waiting(Patience::Others), 0);
    let calls_b = send_steps(&b, vec![bs]);
    for (done, p) in answers(calls_a).await.into_iter().zip([&pa]) {
        let (_, step, n) = ok(done);
        assert_eq!((n, step.committed.clone()), (2, plain(p, 1)));
    }
    for (done, p) in answers(calls_b).await.into_iter().zip([&pb]) {
        let (_, step, n) = ok(done);
        assert_eq!((n, step.committed.clone()), (2, plain(p, 1)));
    }
    assert_eq!(counts(c), (1, 2), "one forward for both");
}

#[tokio::test]
async fn a_tree_that_pays_is_waited_for_until_the_batch_s_wait_runs_out() {
    // The window outlasts the test: A's batch waits for B's tree.
    let b = batcher(config(8, FOREVER, 0));
    let c = b.counters();
    let (pa, pb) = (prompt(PROMPTS[0]), prompt(PROMPTS[1]));
    let (a, bs) = (plain_job(prefilled(&pa)), plain_job(prefilled(&pb)));
    let _decoding = [Gauge::up(&c.decoding), Gauge::up(&c.decoding)];
    let mut wait = b.yielding_wait(Patience::Deadline);
    let calls_a = send_steps(&b, vec![a]);
    assert!(!called_within(&mut wait, Duration::from_millis(200)).await);
    assert_eq!(counts(c), (0, 0), "A waits");
    drop(wait);
    let calls_b = send_steps(&b, vec![bs]);
    let mut done = answers(calls_a).await;
    done.extend(answers(calls_b).await);
    assert!(done.iter().all(|d| d.batch_size == 2));
    assert_eq!(counts(c), (1, 2));

    // A short window: the tree still missing when it ends is called in,
    // and its session joins the batch root-only instead of stepping in a
    // forward of its own (as a session that does not wait for a tree
    // does: `a_step_that_arrives_later_runs_in_a_later_batch`).
    let b = batcher(config(8, Duration::from_millis(20), 0));
    let c = b.counters();
    let (a, bs) = (plain_job(prefilled(&pa)), plain_job(prefilled(&pb)));
    let _decoding = [Gauge::up(&c.decoding), Gauge::up(&c.decoding)];
    let mut wait = b.yielding_wait(Patience::Deadline);
    let calls_a = send_steps(&b, vec![a]);
    assert!(called_within(&mut wait, WEDGED).await, "the window ran out");
    drop(wait);
    let calls_b = send_steps(&b, vec![bs]);
    let mut done = answers(calls_a).await;
    done.extend(answers(calls_b).await);
    assert!(done.iter().all(|d| d.batch_size == 2));
    assert_eq!(counts(c), (1, 2));
}
