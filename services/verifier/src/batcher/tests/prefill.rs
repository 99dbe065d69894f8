//! Prefills in the batching thread: a prompt riding in other sessions'
//! step forwards chunk by chunk or alone, the prefix cache's blocks taken
//! and published, the shortest prefill first, and a failed chunk or a
//! caller that left touching nothing else.

use super::*;

/// A long prompt prefilled `chunk` tokens at a time (0: at once) inside
/// the forwards of a decoding session's steps.
async fn prefill_rides_in_the_steps(chunk: usize) {
    let b = batcher(config(8, FOREVER, chunk));
    let c = b.counters();
    let (pd, pp) = (prompt(PROMPTS[0]), long_prompt());
    let n = pp.len() - 1;
    let chunks = if chunk == 0 { 1 } else { n.div_ceil(chunk) };
    let (truth_d, truth_p) = (plain(&pd, chunks + 4), plain(&pp, 3));
    let mut d = prefilled(&pd);
    let mut decoding = vec![Gauge::up(&c.decoding)];
    let mut prefill = send_prefill(&b, &pp);
    // Each of D's steps carries the next chunk: none runs alone while D
    // decodes.
    let mut out_d = Vec::new();
    for k in 1..=chunks {
        let (s, step, size) = plain_steps(&b, [d]).await.pop().unwrap();
        assert_eq!(size, 1, "a chunk is no session of the batch");
        let fused = if chunk == 0 { n } else { n.min(k * chunk) } as u64;
        assert_eq!(prefill_tokens(c), (fused, fused), "after step {k}");
        out_d.extend(step.committed);
        d = s;
    }
    // Answered with its last chunk's forward, before the batcher takes
    // another job.
    let (d, last) = decode(&b, d, 1).await;
    out_d.extend(last);
    let done = ready(&mut prefill).expect("the prefill answered").unwrap();
    let (reused, seconds) = done.result.unwrap();
    assert!(seconds.is_finite() && seconds >= 0.0, "{seconds}");
    let s = &done.session;
    assert_eq!((reused, s.prefilled(), s.prefill_left()), (0, n, 0));
    assert_eq!(counts(c), (chunks as u64 + 1, chunks as u64 + 1));
    // Decoding beside D, its first step's log-probabilities are exactly
    // those after a prefill in one piece, verified alone.
    let mut whole = prefilled(&pp);
    let tree = plain_tree(&whole);
    let alone = step_batch(model(), &mut [(&mut *whole, &tree)], TOP_K).unwrap();
    decoding.push(Gauge::up(&c.decoding));
    let (mut sessions, mut outs) = (vec![d, done.session], [out_d, Vec::new()]);
    for round in 0..3 {
        let stepped = plain_steps(&b, sessions).await;
        if round == 0 {
            assert_eq!(stepped[1].1.verification.top_k, alone[0].verification.top_k);
        }
        sessions = Vec::new();
        for (i, (s, step, size)) in stepped.into_iter().enumerate() {
            assert_eq!(size, 2);
            outs[i].extend(step.committed);
            sessions.push(s);
        }
    }
    assert_eq!(outs, [truth_d, truth_p]);
    assert_eq!(prefill_tokens(c), (n as u64, n as u64), "none twice");
}

#[tokio::test]
async fn a_long_prompt_prefills_in_chunks_fused_into_other_sessions_steps() {
    prefill_rides_in_the_steps(16).await;
}

#[tokio::test]
async fn an_unchunked_prefill_rides_whole_in_one_step() {
    prefill_rides_in_the_steps(0).await;
}

#[tokio::test]
async fn with_no_session_decoding_a_prefill_runs_alone_and_a_cached_prefix_is_reused() {
    let m = memory();
    let b = batcher_on(config(8, FOREVER, 16), &m);
    let c = b.counters();
    let first = long_prompt();
    let n = first.len() - 1;
    let key = |tokens: &[u32]| m.key_of("t", "", None, tokens);
    let done = answer(b.prefill(session(&first, None), key(&first))).await;
    assert_eq!(done.result.unwrap().0, 0);
    assert_eq!(prefill_tokens(c), (n as u64, 0), "all alone, none fused");
    assert_eq!(counts(c), (0, 0), "a prefill is no step");
    // The next turn finds the first one's whole blocks, published as its
    // prefill ran; another tenant finds none.
    let mut next = first.clone();
    next.extend(prompt(" And then the dog"));
    let hit = n / 16 * 16;
    let done = answer(b.prefill(session(&next, None), key(&next))).await;
    assert_eq!(
        done.result.unwrap().0,
        hit,
        "the first turn's blocks reused"
    );
    assert_eq!(prefill_tokens(c), ((n + next.len() - 1 - hit) as u64, 0));
    let other = m.key_of("u", "", None, &next);
    let alone = answer(b.prefill(session(&next, None), other)).await;
    assert_eq!(alone.result.unwrap().0, 0, "another tenant's prefix");
    let usage = m.usage();
    assert_eq!(
        (usage.queried_tokens, usage.hit_tokens),
        ((n + 2 * (next.len() - 1)) as u64, hit as u64)
    );
    let _decoding = Gauge::up(&c.decoding);
    let (_, out) = decode(&b, done.session, 3).await;
    assert_eq!(out, plain(&next, 3));
}

#[tokio::test]
async fn a_short_prefill_goes_before_a_long_one_and_a_shared_prefix_is_computed_once() {
    let m = memory();
    let (b, start) = paused_on(config(8, FOREVER, 16), m.clone());
    let c = Arc::clone(&b.counters);
    let long = long_prompt();
    let mut long2 = long.clone();
    long2.extend(prompt(" Then the cat"));
    let short = prompt(PROMPTS[1]);
    let key = |tokens: &[u32]| m.key_of("t", "", None, tokens);
    // Queued in this order before the thread first looks: the long
    // prompt, the same prompt extended, then a short one.
    let mut calls: Vec<Prefill<'_>> = vec![
        Box::pin(b.prefill(session(&long, None), key(&long))),
        Box::pin(b.prefill(session(&long2, None), key(&long2))),
        Box::pin(b.prefill(session(&short, None), key(&short))),
    ];
    calls.iter_mut().for_each(send);
    let thread = start();
    let mut order = Vec::new();
    let mut reused = [0; 3];
    let deadline = Instant::now() + WEDGED;
    while order.len() < 3 {
        assert!(Instant::now() < deadline, "the batcher is wedged");
        for (i, call) in calls.iter_mut().enumerate() {
            if reused[i] == 0
                && !order.contains(&i)
                && let Some(done) = ready(call)
            {
                reused[i] = done.unwrap().result.unwrap().0;
                order.push(i);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(order[0], 2, "the short prompt first: {order:?}");
    // Whichever of the two long ones ran first, the other took its blocks.
    let shared = (long.len() - 1) / 16 * 16;
    assert_eq!(reused[0].max(reused[1]), shared, "{reused:?}");
    assert_eq!(
        prefill_tokens(&c).0 as usize,
        (short.len() - 1) + (long.len() - 1) + (long2.len() - 1) - shared
    );
    drop(calls);
    stop(b, thread);
}

#[tokio::test]
async fn a_prefill_whose_chunk_fails_fails_alone() {
    let b = batcher(config(8, FOREVER, 16));
    let c = b.counters();
    let pd = prompt(PROMPTS[0]);
    let truth = plain(&pd, 3);
    // A token the model does not have, in the second chunk.
    let mut pp = long_prompt()[..40].to_vec();
    pp[20] = vocab() + 7;
    let _decoding = Gauge::up(&c.decoding);
    let mut prefill = send_prefill(&b, &pp);
    let (_, out) = decode(&b, prefilled(&pd), 3).await;
    // The second chunk failed the fused forward: D's step was retried
    // alone, then the chunk ran alone and failed its prefill, before the
    // batcher took D's third step; its KV is as the first chunk left it.
    let done = ready(&mut prefill).expect("answered after that forward");
    let done = done.unwrap();
    failed_with(&done.result, "token");
    assert_eq!(done.session.prefilled(), 16);
    assert_eq!(out, truth);
    assert_eq!(prefill_tokens(c), (16, 16), "only the good chunk counted");
    assert_eq!(counts(c), (3, 3));
}

#[tokio::test]
async fn a_prefill_whose_caller_left_is_not_computed_further() {
    let (b, start) = paused(config(8, FOREVER, 16));
    let c = Arc::clone(&b.counters);
    let (pd, pq, long) = (prompt(PROMPTS[0]), prompt(PROMPTS[1]), long_prompt());
    let qn = (pq.len() - 1) as u64;
    assert!(qn <= 16, "Q prefills in one chunk");
    // Gone before the thread saw it.
    drop(send_prefill(&b, &long));
    // Gone after its first chunk.
    let later = send_prefill(&b, &long);
    let q = send_prefill(&b, &pq);
    let _decoding = Gauge::up(&c.decoding);
    let thread = start();
    // The shortest prefill first: Q whole, in the first step.
    let (s, first) = decode(&b, prefilled(&pd), 1).await;
    assert_eq!(prefill_tokens(&c), (qn, qn), "Q's, the shortest");
    let done = answer(q).await;
    let left = done.session.prefill_left();
    assert_eq!((done.result.unwrap().0, left), (0, 0));
    let (s, second) = decode(&b, s, 1).await;
    assert_eq!(
        prefill_tokens(&c),
        (qn + 16, qn + 16),
        "the long one's first chunk"
    );
    drop(later);
    let (_, third) = decode(&b, s, 1).await;
    assert_eq!(prefill_tokens(&c), (qn + 16, qn + 16), "none of its after");
    assert_eq!([first, second, third].concat(), plain(&pd, 3));
    stop(b, thread);
}
