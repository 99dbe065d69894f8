//! A prefix cache hit never changes an output: conversations that share a
//! system prompt, with speculation (model-free drafting), greedy and
//! seeded, at concurrency 1, 4 and 16, answer through a mesh with the
//! prefix cache on exactly what a mesh with it off answers, token for
//! token. The cache is hit (the verifier's stats say so), partially hit
//! (blocks of a shared start), and under a small budget evicted (at
//! concurrency 1 and 4: 16 sessions at once would not fit that budget's
//! reservations).

use std::sync::Arc;

use specmesh_e2e::cluster::Cluster;
use specmesh_proto::v1;
use tokio::sync::Semaphore;

const CONVERSATIONS: usize = 16;
const MAX_NEW: u32 = 16;
const SYSTEM: &str = "You are a concise assistant for a hardware store. Answer in one or two \
                      sentences, name a product when it helps, and never invent prices.";

/// Turn `t` (0 or 1) of conversation `c`: greedy, or sampled with a seed
/// of its own.
fn request(c: usize, t: usize, first_reply: &str, seeded: bool) -> v1::GenerateRequest {
    let user = |t: usize| match t {
        0 => format!(
            "What do I need to fix a {} squeaky door hinge?",
            ["small", "large", "old", "new"][c % 4]
        ),
        _ => format!("And how long does it take, step {c}?"),
    };
    let mut messages = vec![
        v1::ChatMessage {
            role: "system".into(),
            content: SYSTEM.into(),
            ..Default::default()
        },
        v1::ChatMessage {
            role: "user".into(),
            content: user(0),
            ..Default::default()
        },
    ];
    if t == 1 {
        messages.push(v1::ChatMessage {
            role: "assistant".into(),
            content: first_reply.into(),
            ..Default::default()
        });
        messages.push(v1::ChatMessage {
            role: "user".into(),
            content: user(1),
            ..Default::default()
        });
    }
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages,
            ..Default::default()
        })),
        max_new_tokens: MAX_NEW,
        sampling: seeded.then_some(v1::SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 0,
            seed: 1000 + c as u64,
        }),
        speculation: Some(v1::SpeculationParams {
            mode: v1::SpeculationMode::ModelFree as i32,
            max_draft_tokens: 0,
        }),
        tenant: "store".into(),
        ..Default::default()
    }
}

/// Every conversation's two turns, `concurrency` conversations at once;
/// each turn's token ids and text.
async fn run(cluster: &Cluster, concurrency: usize, seeded: bool) -> Vec<[(Vec<u32>, String); 2]> {
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for c in 0..CONVERSATIONS {
        let mut client = cluster.client().await;
        let gate = Arc::clone(&gate);
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let first = client
                .generate(request(c, 0, "", seeded))
                .await
                .unwrap()
                .into_inner();
            let second = client
                .generate(request(c, 1, &first.text, seeded))
                .await
                .unwrap()
                .into_inner();
            [
                (first.token_ids, first.text),
                (second.token_ids, second.text),
            ]
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_are_the_same_with_the_prefix_cache_on_and_off() {
    let off = Cluster::start(1, 1, &["--prefix-cache=false"], &[]);
    let reference = [run(&off, 1, false).await, run(&off, 1, true).await];
    drop(off);
    // On, and on under a 40 MiB budget: four sessions' reservations (up
    // to 8.4 MiB each: context, 16 new tokens and a 65-node tree) and
    // less than the 56 MB every conversation's blocks take, so blocks are
    // evicted as the run goes.
    for (flags, levels) in [
        (&[][..], &[1, 4, 16][..]),
        (&["--kv-budget-mib", "40"][..], &[1, 4][..]),
    ] {
        let on = Cluster::start(1, 1, flags, &[]);
        for &concurrency in levels {
            for (i, seeded) in [false, true].into_iter().enumerate() {
                let got = run(&on, concurrency, seeded).await;
                for (c, (want, got)) in reference[i].iter().zip(&got).enumerate() {
                    assert_eq!(
                        (&want[0].0, &want[1].0),
                        (&got[0].0, &got[1].0),
                        "{flags:?}, concurrency {concurrency}, seeded {seeded}, conversation {c}: {:?} / {:?}",
                        got[0].1,
                        got[1].1
                    );
                }
            }
        }
        let stats = on.settled_stats(std::time::Duration::from_secs(10)).await;
        let s = stats[0].as_ref().expect("verifier stats");
        eprintln!("{flags:?}: {s:?}");
        assert!(s.reused_tokens > 0, "the cache was never hit: {s:?}");
        assert_eq!(s.reserved_bytes, 0);
        if !flags.is_empty() {
            assert!(s.evicted_caches > 0, "nothing was evicted: {s:?}");
        }
    }
}
