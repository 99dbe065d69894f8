//! Kept KV caches on the real verifier: a session's next turn reuses its
//! cache, another tenant's session with the same key does not, the oldest
//! kept cache is evicted when `--max-cached-sessions` is reached (the next
//! turn then re-prefills, with the same output), and `Verifier.Stats`
//! counts reused tokens and evictions.

use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::session_event::Event;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tonic::transport::Channel;

/// One turn: its context, the cache key and tenant; returns the tokens it
/// reused from a kept cache and those it generated.
async fn turn(
    client: &mut VerifierClient<Channel>,
    tenant: &str,
    key: &str,
    tokens: &[u32],
) -> (u32, Vec<u32>) {
    let request = v1::RunRequest {
        session_id: format!("{tenant}-{key}"),
        tokens: tokens.to_vec(),
        prompt_len: tokens.len() as u32,
        max_new_tokens: 6,
        cache_key: key.into(),
        tenant: tenant.into(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_caches_are_reused_by_their_tenant_only_and_evicted_oldest_first() {
    let model = model_path().display().to_string();
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--cost-curve",
            "1:1",
            "--threads",
            "2",
            "--max-cached-sessions",
            "2",
        ],
        &[],
    );
    let mut client = VerifierClient::connect(verifier.url.clone()).await.unwrap();
    let prompt: Vec<u32> = (100..140).collect();

    // Turn 1 of tenant a's conversation: nothing to reuse.
    let (reused, out) = turn(&mut client, "a", "chat", &prompt).await;
    assert_eq!(reused, 0);
    let mut second: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    second.extend([200, 201]);

    // Tenant b with the same key and context: a's cache is not b's.
    let (reused, b_out) = turn(&mut client, "b", "chat", &second).await;
    assert_eq!(reused, 0, "another tenant's cache was reused");

    // Tenant a's next turn reuses its own cache, and says the same.
    let (reused, a_out) = turn(&mut client, "a", "chat", &second).await;
    assert!(reused as usize >= prompt.len(), "reused {reused}");
    assert_eq!(a_out, b_out, "a reused cache changes nothing");
    let s = stats(&mut client).await;
    assert_eq!(s.reused_tokens, u64::from(reused));
    assert_eq!((s.cached_sessions, s.evicted_caches), (2, 0));
    // a's and b's caches: each the second turn's context and its output.
    let each = second.len() as u64;
    assert!(
        (2 * each..=2 * (each + 6)).contains(&s.kept_tokens),
        "kept {} tokens for two contexts of {each} + 6",
        s.kept_tokens
    );

    // A third kept session evicts the least recently used (b's); b's next
    // turn re-prefills and answers the same.
    turn(&mut client, "c", "chat", &prompt).await;
    let s = stats(&mut client).await;
    assert_eq!((s.cached_sessions, s.evicted_caches), (2, 1));
    let (reused, again) = turn(&mut client, "b", "chat", &second).await;
    assert_eq!(reused, 0, "b's cache was evicted");
    assert_eq!(again, b_out);
    let s = stats(&mut client).await;
    assert_eq!((s.active_sessions, s.cached_sessions), (0, 2));
}
