//! The prefix cache on the real verifier: a call whose context starts with
//! blocks an earlier call of its tenant computed reuses their KV, with or
//! without a session key; another tenant or another `cache_salt` never
//! does; a reuse changes no output; under a small `--kv-budget-mib` blocks
//! are evicted, the budget holds and nothing stays reserved; with
//! `--prefix-cache=false` only a session key's own turns share KV.

use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::session_event::Event;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tonic::transport::Channel;

/// SmolLM2-135M's KV per token: K and V × 30 layers × 192 × 4 bytes.
const KV_BYTES_PER_TOKEN: u64 = 2 * 30 * 192 * 4;
const BLOCK: u64 = 16;
const NEW: u32 = 6;

/// Who asks: tenant, cache salt, session key.
#[derive(Clone, Copy)]
struct Caller<'a> {
    tenant: &'a str,
    salt: &'a str,
    key: &'a str,
}

const fn caller(tenant: &str) -> Caller<'_> {
    Caller {
        tenant,
        salt: "",
        key: "",
    }
}

/// One call over `tokens`; returns the tokens it reused from the cache and
/// those it generated.
async fn turn(
    client: &mut VerifierClient<Channel>,
    who: Caller<'_>,
    tokens: &[u32],
) -> (u32, Vec<u32>) {
    let request = v1::RunRequest {
        session_id: format!("{}-{}", who.tenant, who.key),
        tokens: tokens.to_vec(),
        prompt_len: tokens.len() as u32,
        max_new_tokens: NEW,
        cache_key: who.key.into(),
        tenant: who.tenant.into(),
        cache_salt: who.salt.into(),
        ..Default::default()
    };
    let mut events = client.run(request).await.unwrap().into_inner();
    let (mut reused, mut out) = (None, Vec::new());
    while let Some(e) = events.message().await.unwrap() {
        match e.event {
            Some(Event::Started(s)) => reused = Some(s.reused_tokens),
            Some(Event::Committed(c)) => out.extend(c.tokens),
            _ => {}
        }
    }
    (reused.expect("a Started event"), out)
}

async fn stats(client: &mut VerifierClient<Channel>) -> v1::VerifierStats {
    client
        .stats(v1::StatsRequest {})
        .await
        .unwrap()
        .into_inner()
}

fn verifier(extra: &[&str]) -> Service {
    let model = model_path().display().to_string();
    let mut args = vec!["--model", &model, "--cost-curve", "1:1", "--threads", "2"];
    args.extend_from_slice(extra);
    Service::start("specmesh-verifier", &args, &[])
}

/// Whole blocks of KV a finished call of `tokens` then `out` leaves: every
/// committed token but the last has KV.
fn blocks_of(tokens: usize, out: usize) -> u64 {
    (tokens + out - 1) as u64 / BLOCK
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_is_reused_within_its_tenant_and_salt_only() {
    let v = verifier(&[]);
    let mut client = VerifierClient::connect(v.url.clone()).await.unwrap();
    let prompt: Vec<u32> = (100..140).collect();

    // Tenant a's first turn: nothing to reuse; its KV is cached.
    let (reused, out) = turn(&mut client, caller("a"), &prompt).await;
    assert_eq!(reused, 0);
    let cached = blocks_of(prompt.len(), out.len());
    let s = stats(&mut client).await;
    assert_eq!(
        (s.prefix_cache_blocks, s.block_tokens, s.reserved_bytes),
        (cached, BLOCK as u32, 0),
        "{s:?}"
    );
    assert_eq!(s.prefix_cache_bytes, cached * BLOCK * KV_BYTES_PER_TOKEN);
    assert_eq!(s.kv_bytes, s.prefix_cache_bytes);

    // The next turn, as an OpenAI client sends it: the whole history again.
    let mut second: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    second.extend([200, 201]);
    // Another tenant, and tenant a under a salt: nothing shared.
    let (reused, b_out) = turn(&mut client, caller("b"), &second).await;
    assert_eq!(reused, 0, "another tenant's KV was reused");
    let salted = Caller {
        salt: "user-1",
        ..caller("a")
    };
    let (reused, salted_out) = turn(&mut client, salted, &second).await;
    assert_eq!(reused, 0, "another salt's KV was reused");
    // Tenant a, no session key: its whole cached blocks, the same answer.
    let (reused, a_out) = turn(&mut client, caller("a"), &second).await;
    assert_eq!(u64::from(reused), cached * BLOCK);
    assert_eq!(a_out, b_out, "a reused prefix changes nothing");
    assert_eq!(salted_out, b_out);
    // The salted caller's own next call finds its own blocks.
    let (reused, _) = turn(&mut client, salted, &second).await;
    assert_eq!(u64::from(reused), (second.len() as u64 - 1) / BLOCK * BLOCK);

    let s = stats(&mut client).await;
    let queried: usize = [&prompt, &second, &second, &second, &second]
        .iter()
        .map(|t| t.len() - 1)
        .sum();
    assert_eq!(s.prefix_cache_queries, queried as u64, "{s:?}");
    assert_eq!(
        s.reused_tokens,
        cached * BLOCK + (second.len() as u64 - 1) / BLOCK * BLOCK
    );
    assert_eq!(
        (s.active_sessions, s.reserved_bytes, s.cached_sessions),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_budget_evicts_blocks_and_outputs_stay_the_same() {
    // 4 MiB: about 91 tokens of KV, a call of 40 tokens reserves 47.
    let v = verifier(&["--kv-budget-mib", "4"]);
    let mut client = VerifierClient::connect(v.url.clone()).await.unwrap();
    let budget = 4 << 20;
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| (0..40).map(|t| 100 + 50 * i + t).collect())
        .collect();
    let mut first = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let (_, out) = turn(&mut client, caller("a"), p).await;
        first.push(out);
        let s = stats(&mut client).await;
        assert!(
            s.kv_bytes <= budget,
            "over the budget after call {i}: {s:?}"
        );
        assert_eq!(s.reserved_bytes, 0, "{s:?}");
    }
    let s = stats(&mut client).await;
    assert!(s.evicted_caches > 0, "nothing was evicted: {s:?}");
    // Again, newest first: the last prompts still find blocks, evicted
    // ones prefill again, and every answer is the same.
    let mut reused_any = false;
    for (i, p) in prompts.iter().enumerate().rev() {
        let (reused, out) = turn(&mut client, caller("a"), p).await;
        reused_any |= reused > 0;
        assert_eq!(out, first[i], "prompt {i}, {reused} tokens reused");
    }
    assert!(reused_any, "no prompt found its blocks");
    let s = stats(&mut client).await;
    assert!(s.kv_bytes <= budget, "{s:?}");
    assert_eq!((s.active_sessions, s.reserved_bytes), (0, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_prefix_cache_only_a_session_keys_turns_share() {
    let v = verifier(&["--prefix-cache=false"]);
    let mut client = VerifierClient::connect(v.url.clone()).await.unwrap();
    let prompt: Vec<u32> = (100..140).collect();
    let keyed = Caller {
        key: "chat",
        ..caller("a")
    };
    let (reused, out) = turn(&mut client, keyed, &prompt).await;
    assert_eq!(reused, 0);
    let mut second: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    second.extend([200, 201]);
    let (reused, _) = turn(&mut client, caller("a"), &second).await;
    assert_eq!(reused, 0, "a call without the key");
    let other = Caller {
        key: "other",
        ..caller("a")
    };
    let (reused, _) = turn(&mut client, other, &second).await;
    assert_eq!(reused, 0, "another key");
    let (reused, _) = turn(&mut client, keyed, &second).await;
    assert_eq!(
        u64::from(reused),
        blocks_of(prompt.len(), out.len()) * BLOCK
    );
}
