//! KV-cache ownership across the mesh, through real processes: two
//! verifiers publish their prefix caches' blocks (`KvEvents.Subscribe`),
//! the gateway indexes them, and an OpenAI-style conversation (the whole
//! history resent, no session id) has each follow-up placed on the
//! verifier that holds its history, which reuses it. A gateway restarted
//! by SIGKILL rebuilds its index from the verifiers' snapshots; a verifier
//! killed between turns loses no request (the next turn prefills on the
//! other one). Every answer equals a verifier's without a prefix cache.

use std::time::{Duration, Instant};

use specmesh_e2e::cluster::{Cluster, Role, free_addr};
use specmesh_e2e::metrics::metric;
use specmesh_kvcache::{BLOCK_TOKENS, Scope, block_hashes};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use specmesh_proto::v1::kv_events_client::KvEventsClient;
use tonic::transport::Channel;

const CONVERSATIONS: usize = 4;
const TURNS: usize = 4;
const MAX_NEW: u32 = 24;

const TOPICS: [&str; CONVERSATIONS] = ["cats", "the Moon", "rivers", "bread"];

fn message(c: usize, t: usize) -> String {
    match t {
        0 => format!("Tell me about {}.", TOPICS[c]),
        1 => "Give me one surprising fact about it.".into(),
        2 => "Why is that surprising?".into(),
        _ => "Summarize our talk in one sentence.".into(),
    }
}

/// Turn `t` of conversation `c` after `replies`: the whole history again.
fn turn(c: usize, replies: &[String], t: usize) -> v1::GenerateRequest {
    let mut messages = Vec::new();
    for (i, reply) in replies.iter().enumerate().take(t) {
        messages.push(v1::ChatMessage {
            role: "user".into(),
            content: message(c, i),
            ..Default::default()
        });
        messages.push(v1::ChatMessage {
            role: "assistant".into(),
            content: reply.clone(),
            ..Default::default()
        });
    }
    messages.push(v1::ChatMessage {
        role: "user".into(),
        content: message(c, t),
        ..Default::default()
    });
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages,
            ..Default::default()
        })),
        max_new_tokens: MAX_NEW,
        tenant: format!("tenant-{}", c % 2),
        ..Default::default()
    }
}

struct Answer {
    ids: Vec<u32>,
    text: String,
    prompt: u32,
    cached: u32,
}

async fn ask(client: &mut GenerationClient<Channel>, r: v1::GenerateRequest) -> Answer {
    let r = client.generate(r).await.unwrap().into_inner();
    let usage = r.usage.expect("usage");
    Answer {
        ids: r.token_ids,
        text: r.text,
        prompt: usage.prompt_tokens,
        cached: usage.cached_tokens,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_go_where_their_history_is_cached() {
    // What every turn must say: one verifier without a prefix cache.
    let reference: Vec<Vec<Vec<u32>>> = {
        let cluster = Cluster::start(1, 0, &["--prefix-cache=false"], &[]);
        let mut client = cluster.client().await;
        let mut all = Vec::new();
        for c in 0..CONVERSATIONS {
            let mut replies = Vec::new();
            let mut ids = Vec::new();
            for t in 0..TURNS {
                let a = ask(&mut client, turn(c, &replies, t)).await;
                replies.push(a.text);
                ids.push(a.ids);
            }
            all.push(ids);
        }
        all
    };

    let metrics_addr = free_addr();
    let metrics = format!("http://{metrics_addr}/metrics");
    let mut cluster = Cluster::start(2, 0, &[], &["--metrics-listen", &metrics_addr]);
    let mut client = cluster.client().await;
    let mut replies: Vec<Vec<String>> = vec![Vec::new(); CONVERSATIONS];
    let mut prompts: Vec<Vec<u32>> = vec![Vec::new(); CONVERSATIONS];
    // Turns 1 and 2 of every conversation: each follow-up finds its
    // history (whole blocks of it) where the gateway placed it.
    for t in 0..2 {
        for c in 0..CONVERSATIONS {
            let a = ask(&mut client, turn(c, &replies[c], t)).await;
            assert_eq!(a.ids, reference[c][t], "conversation {c}, turn {}", t + 1);
            if t > 0 {
                let before = prompts[c][t - 1];
                assert!(
                    a.cached + BLOCK_TOKENS as u32 >= before,
                    "conversation {c}, turn {}: {} of {} tokens cached, the last turn's prompt had {before}",
                    t + 1,
                    a.cached,
                    a.prompt
                );
            }
            prompts[c].push(a.prompt);
            replies[c].push(a.text);
        }
    }
    let prefix = metric(&metrics, "specmesh_placements_total", "reason=\"prefix\"");
    assert!(
        prefix >= CONVERSATIONS as f64,
        "{prefix} placements by prefix"
    );
    let predicted = metric(
        &metrics,
        "specmesh_placement_predicted_cached_tokens_total",
        "",
    );
    let actual = metric(
        &metrics,
        "specmesh_placement_actual_cached_tokens_total",
        "",
    );
    assert!(
        predicted > 0.0 && actual >= predicted,
        "predicted {predicted}, actual {actual}"
    );
    assert!(metric(&metrics, "specmesh_kv_index_blocks", "role=\"verifier\"") > 0.0);

    // A crashed gateway's successor learns the caches from the verifiers'
    // snapshots: turn 3 still finds its history.
    cluster.restart_gateway();
    client = cluster.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&metrics, "specmesh_kv_index_blocks", "role=\"verifier\"") == 0.0 {
        assert!(Instant::now() < deadline, "the new gateway indexed nothing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for c in 0..CONVERSATIONS {
        let a = ask(&mut client, turn(c, &replies[c], 2)).await;
        assert_eq!(a.ids, reference[c][2], "conversation {c}, turn 3");
        assert!(
            a.cached + BLOCK_TOKENS as u32 >= prompts[c][1],
            "conversation {c}, turn 3 after the gateway's restart: {} cached",
            a.cached
        );
        prompts[c].push(a.prompt);
        replies[c].push(a.text);
    }

    // Verifier 0 dies between turns: every turn 4 is answered, the same,
    // those whose history died with it prefilled on verifier 1.
    cluster.kill(Role::Verifier, 0);
    for c in 0..CONVERSATIONS {
        let a = ask(&mut client, turn(c, &replies[c], 3)).await;
        assert_eq!(a.ids, reference[c][3], "conversation {c}, turn 4");
    }
}

/// The KV events of the verifier at `url`.
async fn subscribe(url: &str) -> tonic::Streaming<v1::KvEventBatch> {
    KvEventsClient::connect(url.to_owned())
        .await
        .unwrap()
        .subscribe(v1::KvSubscribeRequest {})
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifier_publishes_its_blocks_as_a_snapshot_then_changes() {
    let cluster = Cluster::start(1, 0, &["--kv-budget-mib", "4"], &[]);
    let url = cluster.verifier_urls()[0].clone();
    let mut events = subscribe(&url).await;
    let first = events.message().await.unwrap().unwrap();
    assert!(first.snapshot && first.stored.is_empty(), "{first:?}");
    assert_eq!(first.block_tokens, BLOCK_TOKENS as u32);
    let instance = first.instance.clone();

    // A prompt of 40 tokens straight to the verifier: its blocks, by the
    // hashes anyone can compute from the tenant and the tokens.
    let tokens: Vec<u32> = (100..140).collect();
    let mut verifier = v1::verifier_client::VerifierClient::connect(url.clone())
        .await
        .unwrap();
    let run = v1::RunRequest {
        session_id: "s".into(),
        tokens: tokens.clone(),
        prompt_len: 40,
        max_new_tokens: 1,
        tenant: "acme".into(),
        ..Default::default()
    };
    let mut out = verifier.run(run.clone()).await.unwrap().into_inner();
    while out.message().await.unwrap().is_some() {}
    let want = block_hashes(Scope::new("acme", "", None), &tokens[..39], BLOCK_TOKENS);
    let mut stored = Vec::new();
    while stored.len() < want.len() {
        let b = tokio::time::timeout(Duration::from_secs(5), events.message())
            .await
            .expect("a batch within the heartbeat")
            .unwrap()
            .unwrap();
        assert_eq!(b.instance, instance);
        assert!(!b.snapshot);
        stored.extend(b.stored);
    }
    assert_eq!(stored, want);

    // Other prompts under a 4 MiB budget (about 91 tokens) evict those
    // blocks: removals follow, with the load.
    let mut removed = Vec::new();
    for i in 0..4u32 {
        let mut other = run.clone();
        other.tokens = (0..40).map(|t| 1000 + 100 * i + t).collect();
        let mut out = verifier.run(other).await.unwrap().into_inner();
        while out.message().await.unwrap().is_some() {}
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !want.iter().all(|h| removed.contains(h)) {
        assert!(Instant::now() < deadline, "removed only {removed:?}");
        let b = events.message().await.unwrap().unwrap();
        removed.extend(b.removed);
        let load = b.load.expect("the load");
        assert!(
            load.cached_blocks + load.free_blocks + load.reserved_blocks <= 92,
            "{load:?}"
        );
    }
    // A new subscriber starts from a snapshot of what is held now.
    let mut again = subscribe(&url).await;
    let snap = again.message().await.unwrap().unwrap();
    assert!(
        snap.snapshot && !snap.stored.iter().any(|h| want.contains(h)),
        "{snap:?}"
    );
}
