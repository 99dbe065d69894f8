//! Sessions moving between verifiers through real processes: a verifier
//! `kill -9`ed under a seeded sampled stream, or under a multi-turn
//! session (between turns and in the middle of one), changes nothing the
//! client sees. The gateway re-places the session from the tokens
//! committed so far (`prompt_len` unchanged, so sampling positions and
//! their seeded draws continue), and a turn whose kept KV cache died with
//! its verifier is prefilled again elsewhere.

use std::time::{Duration, Instant};

use specmesh_e2e::cluster::{Cluster, Role};
use specmesh_e2e::mesh::{chat_request, without_speculation};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

/// Each verifier's (verify steps, prefix cache blocks, reused tokens) once
/// no session runs; zeros for one that does not answer (killed).
async fn snapshot(cluster: &Cluster) -> Vec<(u64, u64, u64)> {
    cluster
        .idle_stats()
        .await
        .into_iter()
        .map(|s| {
            s.map_or((0, 0, 0), |s| {
                (s.steps, s.prefix_cache_blocks, s.reused_tokens)
            })
        })
        .collect()
}

/// The verifier running the only session in flight.
async fn serving(cluster: &Cluster) -> usize {
    let stats = cluster.verifier_stats().await;
    let running: Vec<usize> = (0..stats.len())
        .filter(|&i| stats[i].as_ref().is_some_and(|s| s.active_sessions > 0))
        .collect();
    assert_eq!(
        running.len(),
        1,
        "one verifier should run the session: {stats:?}"
    );
    running[0]
}

/// Streams `request`, checking every chunk's offset; once `kill_at` tokens
/// have arrived, `kill -9`s the verifier serving it. Returns the tokens and
/// the verifier killed.
async fn stream_killing_its_verifier(
    cluster: &Cluster,
    client: &mut GenerationClient<Channel>,
    request: v1::GenerateRequest,
    kill_at: usize,
) -> (Vec<u32>, usize) {
    let mut stream = client.generate_stream(request).await.unwrap().into_inner();
    let (mut ids, mut killed) = (Vec::new(), None);
    while let Some(chunk) = stream.message().await.unwrap() {
        // No gap, no repeat, across the re-placement too.
        assert_eq!(chunk.token_offset as usize, ids.len(), "{chunk:?}");
        ids.extend(chunk.token_ids);
        if killed.is_none() && ids.len() >= kill_at {
            let victim = serving(cluster).await;
            let pid = cluster.kill(Role::Verifier, victim);
            eprintln!(
                "killed verifier #{victim} (pid {pid}) after {} tokens",
                ids.len()
            );
            killed = Some(victim);
        }
    }
    let killed = killed.unwrap_or_else(|| {
        panic!(
            "the stream ended after {} tokens, before the kill",
            ids.len()
        )
    });
    (ids, killed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_sampled_stream_survives_losing_its_verifier() {
    let cluster = Cluster::start(2, 1, &[], &[]);
    let mut client = cluster.client().await;
    let sampled = |seed| v1::GenerateRequest {
        sampling: Some(v1::SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 0,
            seed,
        }),
        ..chat_request("Write a long story about a dragon who learns to bake.", 120)
    };
    let expected = client.generate(sampled(42)).await.unwrap().into_inner();
    // Long enough to be killed in the middle, and a claim only if the seed
    // decides the output: another seed samples another story.
    assert!(expected.token_ids.len() >= 60, "{expected:?}");
    let other = client.generate(sampled(43)).await.unwrap().into_inner();
    assert_ne!(
        other.token_ids, expected.token_ids,
        "the seed changed nothing"
    );

    let before = snapshot(&cluster).await;
    let (ids, killed) = stream_killing_its_verifier(&cluster, &mut client, sampled(42), 20).await;
    assert_eq!(
        ids, expected.token_ids,
        "the seeded stream resumed on another verifier differs from an uninterrupted one"
    );
    // The rest really ran on the other verifier.
    let after = snapshot(&cluster).await;
    let survivor = 1 - killed;
    assert!(
        after[survivor].0 > before[survivor].0,
        "the surviving verifier ran no step: {before:?} → {after:?}"
    );
}

/// The turns of the conversation: a user message and its token budget.
const TURNS: [(&str, u32); 3] = [
    (
        "My name is Ada and I like sailing. Suggest a name for my boat.",
        48,
    ),
    ("Why did you pick that name?", 48),
    ("Now write a short poem about my boat and me.", 80),
];

/// Turn `t` of a conversation whose earlier replies are `replies`: every
/// earlier message, then this turn's, under `session_id` (also its cache
/// salt, so that no other conversation's cached prefix is found).
fn turn_request(session_id: &str, replies: &[String], t: usize) -> v1::GenerateRequest {
    let mut messages = Vec::new();
    for (i, (user, _)) in TURNS.iter().enumerate().take(t + 1) {
        messages.push(v1::ChatMessage {
            role: "user".into(),
            content: (*user).into(),
            ..Default::default()
        });
        if i < t {
            messages.push(v1::ChatMessage {
                role: "assistant".into(),
                content: replies[i].clone(),
                ..Default::default()
            });
        }
    }
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages,
            ..Default::default()
        })),
        max_new_tokens: TURNS[t].1,
        session_id: session_id.into(),
        cache_salt: session_id.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_turn_session_moves_to_another_verifier() {
    let cluster = Cluster::start(2, 1, &[], &[]);
    let mut client = cluster.client().await;

    // The conversation without faults, under another session id, on the
    // same mesh: what every turn below must say.
    let mut reference: Vec<v1::GenerateResponse> = Vec::new();
    let mut replies: Vec<String> = Vec::new();
    for t in 0..TURNS.len() {
        let r = client
            .generate(turn_request("reference", &replies, t))
            .await
            .unwrap()
            .into_inner();
        replies.push(r.text.clone());
        reference.push(r);
    }
    // Turn 3 must be long enough to be killed in the middle.
    assert!(reference[2].token_ids.len() >= 40, "{:?}", reference[2]);

    // Turn 1; the verifier that ran it keeps the session's KV cache.
    let mut replies: Vec<String> = Vec::new();
    let before = snapshot(&cluster).await;
    let first = client
        .generate(turn_request("moving", &replies, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.token_ids, reference[0].token_ids, "turn 1");
    replies.push(first.text);
    let after = snapshot(&cluster).await;
    let holder = (0..2)
        .find(|&i| after[i].0 > before[i].0)
        .expect("a verifier ran turn 1");
    assert!(
        after[holder].1 > before[holder].1,
        "turn 1's KV is not cached on the verifier that ran it: {before:?} → {after:?}"
    );

    // The holder dies between turns, its cache with it: turn 2 goes to the
    // other verifier, which prefills the whole conversation and answers
    // the same.
    let pid = cluster.kill(Role::Verifier, holder);
    eprintln!("killed verifier #{holder} (pid {pid}), which held the session's cache");
    let other = 1 - holder;
    let before = snapshot(&cluster).await;
    let second = client
        .generate(turn_request("moving", &replies, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.token_ids, reference[1].token_ids, "turn 2, moved");
    replies.push(second.text);
    let after = snapshot(&cluster).await;
    assert!(
        after[other].0 > before[other].0
            && after[other].1 > before[other].1
            && after[other].2 == before[other].2,
        "turn 2 did not run on the other verifier, prefilled whole and cached there: {before:?} → {after:?}"
    );

    // The holder comes back (empty). Once the gateway's health watch has
    // seen it again (its retries back off up to 4 s), turn 3 is placed by
    // the session's rendezvous order again; whichever verifier serves it
    // is killed in the middle, and the other resumes it (the other one
    // holding the session's turn-2 cache when that is where it goes).
    cluster.restart(Role::Verifier, holder);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = snapshot(&cluster).await;
    let (third, killed) = stream_killing_its_verifier(
        &cluster,
        &mut client,
        turn_request("moving", &replies, 2),
        16,
    )
    .await;
    assert_eq!(third, reference[2].token_ids, "turn 3, killed mid-stream");
    let after = snapshot(&cluster).await;
    let survivor = 1 - killed;
    assert!(
        after[survivor].0 > before[survivor].0,
        "the surviving verifier ran no step of turn 3: {before:?} → {after:?}"
    );
    eprintln!(
        "turn 3 ran on verifier #{killed}, then #{survivor}, which reused {} cached tokens",
        after[survivor].2 - before[survivor].2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_losing_each_verifier_in_turn() {
    // Up to 20 re-placements: with two verifiers, a session that loses
    // both, one after the other, must go back to the first once it is up
    // again.
    let cluster = Cluster::start(2, 0, &[], &["--max-replacements", "20"]);
    let mut client = cluster.client().await;
    // Plain decoding of a long, steady count: it runs long enough for a
    // verifier to die, come back and be seen by the gateway (5 s), and the
    // other to die, all in the middle of it. (800 tokens took 6 s here:
    // too close to those 5 s on a fast run.)
    let counting: String = (1..=20).map(|i| format!("{i}, ")).collect();
    let request = without_speculation(v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Prompt(counting)),
        max_new_tokens: 1400,
        ..Default::default()
    });
    let t0 = Instant::now();
    let expected = client.generate(request.clone()).await.unwrap().into_inner();
    assert_eq!(expected.token_ids.len(), 1400, "{}", expected.text);
    eprintln!(
        "{} tokens uninterrupted in {:.1} s",
        expected.token_ids.len(),
        t0.elapsed().as_secs_f64()
    );

    let mut stream = client.generate_stream(request).await.unwrap().into_inner();
    let mut ids: Vec<u32> = Vec::new();
    let (mut first, mut second) = (None, None);
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => panic!(
                "the stream failed after {} tokens; kills: first {:?}, second {second:?} \
                 (the first victim restarted, and placed on again): {e:?}",
                ids.len(),
                first.map(|f: (usize, Instant)| f.0),
            ),
        };
        assert_eq!(chunk.token_offset as usize, ids.len(), "{chunk:?}");
        ids.extend(chunk.token_ids);
        match (first, second) {
            (None, _) if ids.len() >= 10 => {
                let victim = serving(&cluster).await;
                let pid = cluster.kill(Role::Verifier, victim);
                eprintln!(
                    "killed verifier #{victim} (pid {pid}) after {} tokens",
                    ids.len()
                );
                cluster.restart(Role::Verifier, victim);
                first = Some((victim, Instant::now()));
            }
            // Back for 5 s: the gateway's health watch (back-off up to
            // 4 s) has seen it again, and places on it.
            (Some((back, since)), None) if since.elapsed() >= Duration::from_secs(5) => {
                let victim = serving(&cluster).await;
                assert_ne!(
                    victim, back,
                    "the session did not move off the first victim"
                );
                // A new request goes to the least loaded verifier: the
                // one back, if the gateway counts it in.
                let mut probe = cluster.client().await;
                probe.generate(chat_request("Hi", 4)).await.unwrap();
                let steps = cluster.verifier_stats().await[back]
                    .as_ref()
                    .map_or(0, |s| s.steps);
                assert!(
                    steps > 0,
                    "the gateway does not place on verifier #{back} again"
                );
                let pid = cluster.kill(Role::Verifier, victim);
                eprintln!(
                    "killed verifier #{victim} (pid {pid}) after {} tokens, #{back} up {:.1} s",
                    ids.len(),
                    since.elapsed().as_secs_f64()
                );
                second = Some(victim);
            }
            _ => {}
        }
    }
    assert!(
        second.is_some(),
        "the stream ended after {} tokens, before the second kill",
        ids.len()
    );
    assert_eq!(
        ids, expected.token_ids,
        "the stream differs from an uninterrupted one"
    );
}
