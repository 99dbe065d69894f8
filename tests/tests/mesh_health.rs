//! Member health through real processes: the gateway watches its drafters
//! (`grpc.health.v1` Watch), leaves a dead one out of placement, and places
//! on one that comes up later, so every tenant keeps speculating while
//! drafters come and go.

use std::time::{Duration, Instant};

use specmesh_e2e::mesh::{chat_request, with_mode};
use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

/// A verify cost that barely grows, so every session drafts when it can.
const FLAT_CURVE: &str = "1:1,2:1.01,4:1.02,8:1.04,16:1.08,32:1.16,64:1.32";

/// Text the prompt-lookup drafter can continue from the first step on.
const PROMPT: &str = "Repeat this line three times: the quick brown fox jumps over the lazy dog.";

/// Enough tenants that, by rendezvous hashing, some land on each of two
/// drafters (all 12 on one: 2 in 4,096).
const TENANTS: usize = 12;

/// The tenants whose request drafted nothing: they were placed on a
/// drafter that is not there (the verifier then decodes plain).
async fn without_drafts(client: &mut GenerationClient<Channel>) -> Vec<String> {
    let mut missed = Vec::new();
    for t in 0..TENANTS {
        let tenant = format!("tenant-{t}");
        let mut r = with_mode(chat_request(PROMPT, 24), v1::SpeculationMode::ModelFree);
        r.tenant = tenant.clone();
        let out = client.generate(r).await.unwrap().into_inner();
        if out.speculation.unwrap_or_default().drafted_tokens == 0 {
            missed.push(tenant);
        }
    }
    missed
}

/// Repeats [`without_drafts`] until every tenant drafts, for at most
/// `within` (a member's health changes reach the gateway within a few
/// seconds: its watch retries back off up to 4 s).
async fn until_every_tenant_drafts(client: &mut GenerationClient<Channel>, within: Duration) {
    let start = Instant::now();
    loop {
        let missed = without_drafts(client).await;
        if missed.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < within,
            "tenants {missed:?} still drafted nothing after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_drafters_are_left_out_and_recovered_ones_placed_on() {
    // A loopback port with nothing on it yet: the second drafter's.
    let later = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let model = model_path().display().to_string();
    let first = Service::start("specmesh-drafter", &[] as &[&str], &[]);
    let drafters = format!("{},http://{later}", first.url);
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--cost-curve",
            FLAT_CURVE,
            "--threads",
            "2",
            "--drafters",
            &drafters,
        ],
        &[],
    );
    let gateway = Service::start(
        "specmesh-gateway",
        &[
            "--model",
            &model,
            "--verifiers",
            &verifier.url,
            "--drafters",
            &drafters,
        ],
        &[],
    );
    let mut client = GenerationClient::connect(gateway.url.clone())
        .await
        .unwrap();

    // The second drafter is down from the start: no tenant is placed there.
    until_every_tenant_drafts(&mut client, Duration::from_secs(10)).await;

    // It comes up, and the first goes away: every tenant moves to it.
    let second = Service::start_at("specmesh-drafter", &later.to_string(), &[] as &[&str], &[]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(first);
    until_every_tenant_drafts(&mut client, Duration::from_secs(10)).await;
    drop(second);
}
