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

/// Limits of a tenant's own, on its key-file line, win over the gateway's
/// for that tenant alone, and `/metrics` counts each tenant's tokens and
/// refusals; a field the gateway does not know keeps it from starting,
/// named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_own_limits_from_the_key_file_apply_and_are_counted() {
    use specmesh_e2e::metrics::metric;
    let dir = tempfile::tempdir().unwrap();
    let a = specmesh_e2e::tenants::new_key("team-a");
    let b = specmesh_e2e::tenants::new_key("team-b");
    let keys = dir.path().join("api-keys");
    std::fs::write(&keys, format!("{} concurrent=2\n{}\n", a.line, b.line)).unwrap();
    let mesh = KeyedMesh::start(
        &keys,
        false,
        &[
            "--tenant-max-concurrent",
            "1",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let metrics = mesh
        .gateway
        .metrics
        .clone()
        .expect("the gateway's /metrics");
    let mut client = GenerationClient::connect(mesh.gateway.url.clone())
        .await
        .unwrap();
    let long = || chat_as("Write a short story about a lighthouse keeper.", 400, "");
    let short = || chat_as("Name three prime numbers.", 8, "");
    let mut streams = Vec::new();
    for key in [&a.key, &a.key, &b.key] {
        let mut s = client
            .generate_stream(with_key(long(), Some(key)))
            .await
            .unwrap_or_else(|e| panic!("within its limit: {e:?}"))
            .into_inner();
        s.message().await.unwrap().expect("a first chunk");
        streams.push(s);
    }
    for (key, limit) in [(&a.key, "2"), (&b.key, "1")] {
        let refused = client
            .generate(with_key(short(), Some(key)))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        assert!(
            refused
                .message()
                .contains(&format!("runs {limit} requests")),
            "{refused:?}"
        );
    }
    drop(streams);
    for tenant in ["team-a", "team-b"] {
        let labels = format!("reason=\"concurrent\",tenant=\"{tenant}\"");
        assert_eq!(
            metric(&metrics, "specmesh_quota_rejections_total", &labels),
            1.0,
            "{tenant}"
        );
        let used = metric(
            &metrics,
            "specmesh_tenant_tokens_total",
            &format!("tenant=\"{tenant}\""),
        );
        assert!(used > 0.0, "{tenant}: {used} tokens counted");
    }

    // An unknown field: the gateway does not start, and says which.
    std::fs::write(&keys, format!("{} rpm=5\n", a.line)).unwrap();
    let out = std::process::Command::new(specmesh_e2e::binary("specmesh-gateway"))
        .args(["--plaintext", "--listen", "127.0.0.1:0", "--verifiers"])
        .arg(&mesh.verifier.url)
        .arg("--api-keys")
        .arg(&keys)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("unknown field `rpm`"), "{stderr}");
}
