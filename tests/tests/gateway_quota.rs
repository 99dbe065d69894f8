//! Per-tenant quotas at the real gateway, tenants from API keys: a tenant
//! over its concurrent requests or its tokens per minute is refused with
//! RESOURCE_EXHAUSTED and a `retry-after`, while another tenant's requests
//! go on as before.

use specmesh_e2e::tenants::{KeyedMesh, TenantKey, chat_as, with_key};
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::Code;

/// The `retry-after` a refusal carries, in seconds.
fn retry_after(status: &tonic::Status) -> u64 {
    status
        .metadata()
        .get("retry-after")
        .unwrap_or_else(|| panic!("no retry-after on {status:?}"))
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_over_its_quota_does_not_stop_another() {
    let dir = tempfile::tempdir().unwrap();
    let TenantKey {
        key: key_a,
        line: line_a,
    } = specmesh_e2e::tenants::new_key("team-a");
    let TenantKey {
        key: key_b,
        line: line_b,
    } = specmesh_e2e::tenants::new_key("team-b");
    let keys = dir.path().join("api-keys");
    std::fs::write(&keys, format!("{line_a}\n{line_b}\n")).unwrap();
    let mesh = KeyedMesh::start(
        &keys,
        false,
        &[
            "--tenant-max-concurrent",
            "1",
            "--tenant-tokens-per-minute",
            "600",
        ],
    );
    let gateway = &mesh.gateway;
    let mut client = GenerationClient::connect(gateway.url.clone())
        .await
        .unwrap();

    // A's one allowed request runs (a stream); A's second is refused, B's
    // goes through.
    let long = chat_as("Write a short story about a lighthouse keeper.", 200, "");
    let mut running = client
        .generate_stream(with_key(long, Some(&key_a)))
        .await
        .unwrap()
        .into_inner();
    running.message().await.unwrap().expect("a first chunk");
    let short = || chat_as("Name three prime numbers.", 8, "");
    let refused = client
        .generate(with_key(short(), Some(&key_a)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("team-a"), "{refused:?}");
    assert!(retry_after(&refused) >= 1);
    let b = client.generate(with_key(short(), Some(&key_b))).await;
    assert!(
        b.is_ok(),
        "B is not held back by A's running request: {b:?}"
    );
    while running.message().await.unwrap().is_some() {}

    // A's long story used its 600 tokens of the minute (prompt and 200
    // generated, plus what came before): the next request waits, told how
    // long; B still has its own.
    let mut a_refused = None;
    for _ in 0..30 {
        match client.generate(with_key(short(), Some(&key_a))).await {
            Ok(_) => continue,
            Err(status) => {
                a_refused = Some(status);
                break;
            }
        }
    }
    let status = a_refused.expect("A never ran out of its 600 tokens per minute");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("tokens per minute"), "{status:?}");
    let wait = retry_after(&status);
    assert!((1..=60).contains(&wait), "retry-after {wait}");
    let b = client.generate(with_key(short(), Some(&key_b))).await;
    assert!(b.is_ok(), "B's tokens are its own: {b:?}");
}
