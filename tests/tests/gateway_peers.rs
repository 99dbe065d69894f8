//! Tenant limits that hold across gateway replicas (`--peers`): two real
//! gateways in front of one verifier share each tenant's use. For three
//! minutes one tenant sends about twice its tokens per minute spread over
//! both gateways, a second does the same pinned to one gateway's
//! connection, and a third without a limit asks now and then. Over minutes
//! two and three (after the first minute's burst allowance) each limited
//! tenant gets between 0.8 and 1.1 times its limit in total; the third is
//! never refused.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use specmesh_e2e::cluster::{COST_CURVE, free_addr};
use specmesh_e2e::metrics::metric;
use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_e2e::tenants::{chat_as, new_key, with_key};
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::Code;
use tonic::transport::Channel;

/// Each limited tenant's tokens per minute.
const TPM: u64 = 1200;
const RUN: Duration = Duration::from_secs(180);
/// Tokens are counted from the end of the first minute.
const FROM: Duration = Duration::from_secs(60);
/// One request every this often per limited tenant: at ~79 tokens a
/// request (a 39-token chat prompt, 40 generated), about twice the limit.
const PERIOD: Duration = Duration::from_millis(2000);

/// What one tenant got.
#[derive(Debug, Default)]
struct Tally {
    /// Tokens (prompt and generated) of requests that ended after FROM.
    tokens_late: u64,
    tokens_all: u64,
    offered: u64,
    ok: u64,
    refused: u64,
    failed: Vec<String>,
}

/// Sends a request every PERIOD until RUN is over, round-robin over
/// `clients`, as `key`'s tenant; tallies what came back.
async fn offer(
    clients: Vec<GenerationClient<Channel>>,
    key: String,
    started: Instant,
    max_new: u32,
    period: Duration,
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut ticker = tokio::time::interval(period);
    let mut tasks = Vec::new();
    let mut i = 0;
    while started.elapsed() < RUN {
        ticker.tick().await;
        let mut client = clients[i % clients.len()].clone();
        i += 1;
        let (key, tally) = (key.clone(), Arc::clone(&tally));
        tasks.push(tokio::spawn(async move {
            let request = chat_as("Tell me about the sea and its ships.", max_new, "");
            tally.lock().unwrap().offered += 1;
            match client.generate(with_key(request, Some(&key))).await {
                Ok(r) => {
                    let usage = r.into_inner().usage.unwrap_or_default();
                    let tokens = u64::from(usage.prompt_tokens + usage.completion_tokens);
                    let mut t = tally.lock().unwrap();
                    t.ok += 1;
                    t.tokens_all += tokens;
                    if started.elapsed() >= FROM && started.elapsed() < RUN {
                        t.tokens_late += tokens;
                    }
                }
                Err(s) if s.code() == Code::ResourceExhausted => tally.lock().unwrap().refused += 1,
                Err(s) => tally.lock().unwrap().failed.push(format!("{s:?}")),
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(tally).unwrap().into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_limit_holds_across_two_gateways() {
    let dir = tempfile::tempdir().unwrap();
    let spread = new_key("spread");
    let pinned = new_key("pinned");
    let free = new_key("free");
    let keys = dir.path().join("api-keys");
    std::fs::write(
        &keys,
        format!(
            "{} tpm={TPM}\n{} tpm={TPM}\n{}\n",
            spread.line, pinned.line, free.line
        ),
    )
    .unwrap();
    let model = model_path().display().to_string();
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--threads",
            "1",
            "--cost-curve",
            COST_CURVE,
        ],
        &[],
    );
    let (a, b) = (free_addr(), free_addr());
    // Each lists both, itself included: as a headless Service resolves.
    let peers = format!("http://{a},http://{b}");
    let gateway = |listen: &str| {
        Service::start_at(
            "specmesh-gateway",
            listen,
            &[
                "--model",
                &model,
                "--verifiers",
                &verifier.url,
                "--api-keys",
                &keys.display().to_string(),
                "--peers",
                &peers,
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            &[],
        )
    };
    let (ga, gb) = (gateway(&a), gateway(&b));
    let connect = |url: String| async move { GenerationClient::connect(url).await.unwrap() };
    let (ca, cb) = (connect(ga.url.clone()).await, connect(gb.url.clone()).await);

    let started = Instant::now();
    let spread_run = tokio::spawn(offer(
        vec![ca.clone(), cb.clone()],
        spread.key.clone(),
        started,
        40,
        PERIOD,
    ));
    let pinned_run = tokio::spawn(offer(
        vec![ca.clone()],
        pinned.key.clone(),
        started,
        40,
        PERIOD,
    ));
    let free_run = tokio::spawn(offer(
        vec![cb.clone(), ca.clone()],
        free.key.clone(),
        started,
        8,
        Duration::from_secs(5),
    ));
    let (spread_got, pinned_got, free_got) = (
        spread_run.await.unwrap(),
        pinned_run.await.unwrap(),
        free_run.await.unwrap(),
    );
    eprintln!("spread: {spread_got:?}\npinned: {pinned_got:?}\nfree: {free_got:?}");
    let minutes = RUN.as_secs_f64() / 60.0;
    for (name, got) in [("spread", &spread_got), ("pinned", &pinned_got)] {
        // What it asked for: its requests at the tokens an answered one took.
        let per_request = got.tokens_all as f64 / got.ok.max(1) as f64;
        let offered = got.offered as f64 * per_request / minutes / TPM as f64;
        eprintln!("{name}: offered about {offered:.1}x its tokens per minute");
        assert!(
            offered >= 1.8,
            "{name} offered only {offered:.1}x its limit"
        );
    }

    let expected = TPM as f64 * (RUN - FROM).as_secs_f64() / 60.0;
    for (name, got) in [("spread", &spread_got), ("pinned", &pinned_got)] {
        assert!(got.failed.is_empty(), "{name}: {:?}", got.failed);
        assert!(
            got.refused > 0,
            "{name} was never refused: it did not offer more than its limit"
        );
        let ratio = got.tokens_late as f64 / expected;
        eprintln!(
            "{name}: {} tokens over minutes 2-3 against a limit of {expected}: {ratio:.2}x",
            got.tokens_late
        );
        assert!(
            (0.8..=1.1).contains(&ratio),
            "{name}: {ratio:.2}x of its limit over minutes 2-3 ({} tokens, {got:?})",
            got.tokens_late
        );
    }
    assert_eq!(
        free_got.refused, 0,
        "the tenant without a limit was refused"
    );
    assert!(free_got.failed.is_empty(), "{:?}", free_got.failed);
    assert!(free_got.ok > 20);
    // Both gateways counted the other.
    for g in [&ga, &gb] {
        let m = g.metrics.as_deref().unwrap();
        assert_eq!(metric(m, "specmesh_gateway_peers_synced", ""), 1.0);
    }
}

/// Over TLS, only the identities of `--peer-allow-san` may ask a gateway
/// for its tenants' use (another certificate of the mesh CA is denied, a
/// caller without one unauthenticated), and two gateways sync over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_only_gateways_may_ask_for_tenants_use() {
    use specmesh_e2e::pki::{Ca, TlsFiles, tls_channel};
    use specmesh_proto::v1;
    use specmesh_proto::v1::gateway_peers_client::GatewayPeersClient;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("mesh");
    let files = TlsFiles::write(
        &dir.path().join("gateway"),
        &ca.issue(&["specmesh-gateway", "127.0.0.1"]),
        &ca.pem(),
    );
    let keys = dir.path().join("api-keys");
    std::fs::write(&keys, format!("{}\n", new_key("team-a").line)).unwrap();
    let model = model_path().display().to_string();
    let (a, b) = (free_addr(), free_addr());
    let peers = format!("http://{a},http://{b}");
    let mut args: Vec<String> = [
        "--model",
        &model,
        // No verifier is needed to share tenants' use.
        "--verifiers",
        "http://127.0.0.1:1",
        "--api-keys",
        &keys.display().to_string(),
        "--peers",
        &peers,
        "--peer-tls-name",
        "specmesh-gateway",
        "--peer-allow-san",
        "specmesh-gateway",
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(files.args());
    let (ga, gb) = (
        Service::start_at("specmesh-gateway", &a, &args, &[]),
        Service::start_at("specmesh-gateway", &b, &args, &[]),
    );
    let ask = |identity: Option<specmesh_e2e::pki::Leaf>| {
        let (url, ca_pem) = (ga.url.clone(), ca.pem());
        async move {
            let channel = tls_channel(&url, &ca_pem, "specmesh-gateway", identity.as_ref())
                .await
                .unwrap();
            GatewayPeersClient::new(channel)
                .usage(v1::UsageRequest { from_instance: 7 })
                .await
        }
    };
    let ok = ask(Some(ca.issue(&["specmesh-gateway"]))).await.unwrap();
    assert_ne!(ok.into_inner().instance, 0);
    let denied = ask(Some(ca.issue(&["someone-else"]))).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let anonymous = ask(None).await.unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous:?}");
    // Each counts the other, over TLS.
    for g in [&ga, &gb] {
        let m = g.metrics.as_deref().unwrap();
        let until = Instant::now() + Duration::from_secs(15);
        while metric(m, "specmesh_gateway_peers_synced", "") < 1.0 {
            assert!(
                Instant::now() < until,
                "{} never synced with its peer",
                g.url
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
