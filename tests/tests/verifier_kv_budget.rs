//! The KV budget holds over many short conversations: a verifier with a
//! small `--kv-budget-mib` runs conversations of two turns from four
//! tenants, four at a time, straight over `Verifier.Run`. Blocks are
//! evicted all along; at the end nothing is reserved, the cache is within
//! the budget and counted exactly, and the process's resident memory has
//! not grown between the first tenth of the run and its end (nothing
//! leaks per conversation). 100 conversations here; the measurement in
//! docs/performance.md ran 1,000 (`SPECMESH_CONVERSATIONS=1000`).

use std::sync::Arc;

use specmesh_e2e::cluster::verifier_stats;
use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::session_event::Event;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

const BUDGET_MIB: u64 = 16;
const KV_BYTES_PER_TOKEN: u64 = 2 * 30 * 192 * 4;

/// The verifier's resident set in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// One call; returns what it generated.
async fn run(client: &mut VerifierClient<Channel>, tenant: String, tokens: Vec<u32>) -> Vec<u32> {
    let request = v1::RunRequest {
        session_id: format!("{tenant}-{}", tokens.len()),
        prompt_len: tokens.len() as u32,
        tokens,
        max_new_tokens: 4,
        tenant,
        ..Default::default()
    };
    let mut events = client.run(request).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(e) = events.message().await.unwrap() {
        if let Some(Event::Committed(c)) = e.event {
            out.extend(c.tokens);
        }
    }
    out
}

/// Conversation `i`: a system prompt its tenant shares, its own question,
/// then a follow-up after the answer.
async fn converse(client: &mut VerifierClient<Channel>, i: u32) {
    let tenant = format!("tenant-{}", i % 4);
    let mut tokens: Vec<u32> = (200..232).collect();
    tokens.extend((0..12).map(|t| 1000 + (i * 37 + t) % 5000));
    let answer = run(client, tenant.clone(), tokens.clone()).await;
    tokens.extend(answer);
    tokens.extend([300, 301, 302, 303, 304, 305]);
    run(client, tenant, tokens).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_short_conversations_stay_within_a_small_budget() {
    let n: u32 = std::env::var("SPECMESH_CONVERSATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let model = model_path().display().to_string();
    let budget = BUDGET_MIB.to_string();
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--cost-curve",
            "1:1",
            "--threads",
            "2",
            "--kv-budget-mib",
            &budget,
        ],
        &[],
    );
    let client = VerifierClient::connect(verifier.url.clone()).await.unwrap();
    let gate = Arc::new(Semaphore::new(4));
    let mut rss_early = 0;
    let started = std::time::Instant::now();
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    for i in 0..n {
        if i == n / 10 {
            for t in tasks.drain(..) {
                t.await.unwrap();
            }
            rss_early = rss_kib(verifier.pid());
        }
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        let mut c = client.clone();
        tasks.push(tokio::spawn(async move {
            converse(&mut c, i).await;
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let s = verifier_stats(&verifier.url).await.expect("verifier stats");
    let rss_end = rss_kib(verifier.pid());
    eprintln!(
        "{n} conversations in {:.1} s; resident {rss_early} KiB after {}, {rss_end} KiB at the end; {s:?}",
        started.elapsed().as_secs_f64(),
        n / 10
    );
    let budget = BUDGET_MIB << 20;
    assert_eq!((s.active_sessions, s.reserved_bytes), (0, 0), "{s:?}");
    assert!(s.kv_bytes <= budget, "over the budget: {s:?}");
    assert_eq!(
        s.prefix_cache_bytes,
        s.prefix_cache_blocks * 16 * KV_BYTES_PER_TOKEN,
        "{s:?}"
    );
    assert!(s.evicted_caches > 0, "nothing was evicted: {s:?}");
    assert!(s.reused_tokens > 0, "nothing was reused: {s:?}");
    // Allocator noise is a few MiB; a leak of a block (737 KB) or a
    // session's KV per conversation would be hundreds.
    assert!(
        rss_end < rss_early + 24 * 1024,
        "resident memory grew from {rss_early} to {rss_end} KiB"
    );
}
