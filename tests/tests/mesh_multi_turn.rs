//! Multi-turn sessions under KV pressure through real processes: eight
//! three-turn conversations interleaved on one verifier whose KV budget
//! holds about two of them. The prefix cache's blocks are evicted least
//! recently used first to make room; a turn whose prefix survived reuses
//! it, the others prefill again; every turn says what a verifier without
//! a prefix cache says for the same conversation. The verifier's
//! accounting is exact: when no session runs nothing is reserved, and
//! `kv_bytes` is what the cached blocks hold, within the budget.

use std::time::Duration;

use specmesh_e2e::cluster::Cluster;
use specmesh_e2e::mesh::without_speculation;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

const SESSIONS: usize = 8;
const TURNS: usize = 3;
const MAX_NEW: u32 = 32;
const MIB: u64 = 1 << 20;

/// SmolLM2-135M's KV cache per token, as the verifier holds it: K and V
/// (2) × 30 layers × 192 (3 KV heads × 64) × 4 bytes (f32).
const KV_BYTES_PER_TOKEN: u64 = 2 * 30 * 192 * 4;

/// Tokens a drafting turn reserves besides its context and output: one
/// draft tree, the verifier's default 64 drafted nodes and the root (the
/// verifier's `kv_tokens`). A kept cache holds what its turn reserved.
const TREE: u64 = 65;

const TOPICS: [&str; SESSIONS] = [
    "cats",
    "the planet Mars",
    "volcanoes",
    "jazz music",
    "baking bread",
    "chess",
    "the river Danube",
    "green tea",
];

fn user_message(session: usize, turn: usize) -> String {
    match turn {
        0 => format!("Tell me about {}.", TOPICS[session]),
        1 => "Give me one surprising fact about it.".into(),
        _ => "Summarize what you told me in one sentence.".into(),
    }
}

/// Turn `turn` of conversation `session`, after `replies`: every earlier
/// message and reply, then this turn's message.
fn turn_request(session: usize, replies: &[String], turn: usize) -> v1::GenerateRequest {
    let mut messages = Vec::new();
    for (t, reply) in replies.iter().enumerate().take(turn) {
        messages.push(v1::ChatMessage {
            role: "user".into(),
            content: user_message(session, t),
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
        content: user_message(session, turn),
        ..Default::default()
    });
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages,
            ..Default::default()
        })),
        max_new_tokens: MAX_NEW,
        ..Default::default()
    }
}

#[derive(Debug, Clone)]
struct Turn {
    tokens: Vec<u32>,
    text: String,
    prompt_tokens: u64,
    /// Prompt tokens the verifier took from its prefix cache.
    cached_tokens: u64,
}

impl Turn {
    /// Tokens of KV the turn reserves on a verifier, drafting.
    fn kv_tokens(&self) -> u64 {
        self.prompt_tokens + u64::from(MAX_NEW) + TREE
    }
}

async fn generate(client: &mut GenerationClient<Channel>, request: v1::GenerateRequest) -> Turn {
    let r = client.generate(request).await.unwrap().into_inner();
    let usage = r.usage.expect("usage");
    Turn {
        tokens: r.token_ids,
        text: r.text,
        prompt_tokens: u64::from(usage.prompt_tokens),
        cached_tokens: u64::from(usage.cached_tokens),
    }
}

/// The verifier's stats once its sessions have ended.
async fn idle(cluster: &Cluster) -> v1::VerifierStats {
    cluster
        .idle_stats()
        .await
        .remove(0)
        .expect("verifier stats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_interleaved_sessions_of_three_turns_fit_a_two_session_kv_budget() {
    // Every conversation on a verifier with the default budget and no
    // prefix cache, each turn without a session (nothing reused) and
    // without speculation: plain decoding, what each session turn must
    // equal.
    let reference = {
        let cluster = Cluster::start(1, 0, &["--prefix-cache=false"], &[]);
        let mut client = cluster.client().await;
        let mut all = Vec::new();
        for s in 0..SESSIONS {
            let mut replies = Vec::new();
            let mut turns = Vec::new();
            for t in 0..TURNS {
                let turn = generate(
                    &mut client,
                    without_speculation(turn_request(s, &replies, t)),
                )
                .await;
                replies.push(turn.text.clone());
                turns.push(turn);
            }
            all.push(turns);
        }
        all
    };

    // A budget of twice the largest turn's reservation: two sessions fit,
    // eight do not, even at their first turn.
    let largest = reference
        .iter()
        .flatten()
        .map(Turn::kv_tokens)
        .max()
        .unwrap();
    let budget_mib = (2 * largest * KV_BYTES_PER_TOKEN).div_ceil(MIB);
    let budget = budget_mib * MIB;
    let budget_tokens = budget / KV_BYTES_PER_TOKEN;
    let first_turns: u64 = reference.iter().map(|s| s[0].kv_tokens()).sum();
    eprintln!(
        "KV: {KV_BYTES_PER_TOKEN} bytes per token; a turn reserves prompt + {MAX_NEW} new + {TREE} \
         (one tree) tokens; the largest turn {largest} tokens ({:.2} MiB); budget {budget_mib} MiB \
         = {budget_tokens} tokens; the 8 first turns need {first_turns} tokens",
        (largest * KV_BYTES_PER_TOKEN) as f64 / MIB as f64
    );
    assert!(
        first_turns > budget_tokens,
        "the budget keeps every session's first turn: nothing would be evicted"
    );

    let budget_flag = budget_mib.to_string();
    let cluster = Cluster::start(1, 1, &["--kv-budget-mib", &budget_flag], &[]);
    let mut client = cluster.client().await;
    let mut replies: Vec<Vec<String>> = vec![Vec::new(); SESSIONS];
    // Turn 1 of all, turn 2 of all in reverse order (so the sessions that
    // ended round one last find their caches kept), turn 3 of all in order
    // again (so do the first ones).
    for t in 0..TURNS {
        let order: Vec<usize> = if t % 2 == 0 {
            (0..SESSIONS).collect()
        } else {
            (0..SESSIONS).rev().collect()
        };
        for &s in &order {
            let mut request = turn_request(s, &replies[s], t);
            request.session_id = format!("session-{s}");
            request.end_session = t == TURNS - 1;
            let turn = generate(&mut client, request).await;
            assert_eq!(
                turn.tokens,
                reference[s][t].tokens,
                "session {s}, turn {}: differs from a fresh verifier's answer",
                t + 1
            );
            assert_eq!(turn.prompt_tokens, reference[s][t].prompt_tokens);
            replies[s].push(turn.text);
            let stats = idle(&cluster).await;
            assert_eq!(
                (stats.active_sessions, stats.reserved_bytes),
                (0, 0),
                "{stats:?}"
            );
            assert!(stats.kv_bytes <= budget, "over the budget: {stats:?}");
            assert_eq!(stats.kv_bytes, stats.prefix_cache_bytes, "{stats:?}");
            if (t, s) == (0, 0) {
                // The first turn's committed KV, in whole blocks: the
                // per-token size above is right.
                let committed = reference[0][0].prompt_tokens + turn.tokens.len() as u64 - 1;
                assert_eq!(
                    (stats.prefix_cache_blocks, stats.kv_bytes),
                    (committed / 16, committed / 16 * 16 * KV_BYTES_PER_TOKEN),
                    "{stats:?}"
                );
            }
        }
        if t == TURNS - 2 {
            let stats = idle(&cluster).await;
            eprintln!("after {} turns: {stats:?}", SESSIONS * (t + 1));
            assert!(stats.evicted_caches > 0, "no block was evicted: {stats:?}");
        }
    }

    // Every session has had its last turn: turns reused their prefixes
    // where they were cached, and nothing is reserved.
    let end = cluster
        .settled_stats(Duration::from_secs(10))
        .await
        .remove(0)
        .expect("verifier stats");
    eprintln!("after {} turns: {end:?}", SESSIONS * TURNS);
    assert!(end.reused_tokens > 0, "no turn reused its prefix: {end:?}");
    assert_eq!(
        (end.active_sessions, end.reserved_bytes),
        (0, 0),
        "KV reserved after every session ended: {end:?}"
    );
    assert!(end.kv_bytes <= budget, "{end:?}");
}

/// A turn the gateway ends early (a stop string met: it cancels the
/// verifier's stream) publishes its KV too, and the next turn reuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_ended_by_a_stop_string_keeps_its_cache_for_the_next() {
    let cluster = Cluster::start(1, 0, &[], &[]);
    let mut client = cluster.client().await;
    let mut first = turn_request(0, &[], 0);
    first.session_id = "stopped".into();
    first.stop = vec![".".into()];
    let stopped = client.generate(first).await.unwrap().into_inner();
    assert_eq!(stopped.finish_reason, v1::FinishReason::Stop as i32);
    // The verifier learns of the cancel at its next step, then publishes.
    let kept = cluster
        .settled_stats(Duration::from_secs(10))
        .await
        .remove(0)
        .expect("verifier stats");
    assert!(
        kept.reserved_bytes == 0 && kept.prefix_cache_blocks > 0,
        "the stopped turn's KV: {kept:?}"
    );

    let replies = [stopped.text.clone()];
    let mut second = turn_request(0, &replies, 1);
    second.session_id = "stopped".into();
    let reused = generate(&mut client, second).await;
    // The same turn under a salt of its own finds nothing, and says the
    // same.
    let mut salted = turn_request(0, &replies, 1);
    salted.cache_salt = "elsewhere".into();
    let fresh = generate(&mut client, salted).await;
    assert_eq!(reused.tokens, fresh.tokens);
    assert_eq!(fresh.cached_tokens, 0);
    let first_prompt = u64::from(stopped.usage.expect("usage").prompt_tokens);
    assert!(
        reused.cached_tokens >= first_prompt / 16 * 16,
        "the second turn reused {} of its {} prompt tokens; the stopped turn's prompt had {first_prompt}",
        reused.cached_tokens,
        reused.prompt_tokens
    );
}
