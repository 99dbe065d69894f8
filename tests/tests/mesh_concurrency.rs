//! Speculation under load, with the verifier's goodput planner choosing
//! which drafted nodes each batched forward verifies: at concurrency 4 and
//! 16, greedy outputs equal plain decoding's, seeded sampled outputs equal
//! their plain twins (and a chi-square homogeneity test of their first
//! tokens passes at a false-alarm rate of 0.1%), and the planner's
//! decisions are visible in the verifier's `/metrics`.

use specmesh_e2e::mesh::{
    Mesh, bench_prompts, chat_request, generate_all, sampled_request, without_speculation,
};
use specmesh_e2e::metrics::metric;
use specmesh_e2e::stats::{chi2_999, homogeneity};
use specmesh_proto::v1;

/// Every request at once; the token ids of each answer, in order.
async fn all_at_once(gateway: &str, requests: Vec<v1::GenerateRequest>) -> Vec<Vec<u32>> {
    let responses = generate_all(gateway, requests).await;
    responses.into_iter().map(|r| r.token_ids).collect()
}

fn verifier_metrics(mesh: &Mesh) -> String {
    mesh.of("specmesh-verifier")[0]
        .metrics
        .clone()
        .expect("the verifier's metrics URL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_outputs_at_concurrency_4_and_16_equal_plain_decoding() {
    let mesh = Mesh::start();
    // Mixed prompts, and code the drafters predict well (prompt lookup), so
    // the planner has trees worth granting and trees worth cutting.
    let mut prompts: Vec<String> = bench_prompts(1).into_iter().map(|p| p.1).take(12).collect();
    for i in 0..4 {
        prompts.push(format!(
            "Repeat this function exactly, then explain it in one line:\n\
             def add_{i}(a, b):\n    total = a + b\n    return total\n"
        ));
    }
    let mut client = mesh.client().await;
    let mut expected = Vec::new();
    for p in &prompts {
        let r = without_speculation(chat_request(p, 40));
        expected.push(client.generate(r).await.unwrap().into_inner().token_ids);
    }
    let url = verifier_metrics(&mesh);
    for n in [4, 16] {
        for (w, wave) in prompts.chunks(n).enumerate() {
            let requests = wave.iter().map(|p| chat_request(p, 40)).collect();
            let got = all_at_once(&mesh.gateway, requests).await;
            for (j, ids) in got.iter().enumerate() {
                assert_eq!(
                    ids,
                    &expected[w * n + j],
                    "concurrency {n}: prompt {} differs from plain decoding",
                    w * n + j
                );
            }
        }
    }
    let proposed = metric(&url, "specmesh_planner_nodes_proposed_total", "");
    let granted = metric(&url, "specmesh_planner_nodes_granted_total", "");
    let accepted = metric(&url, "specmesh_planner_accepted_total", "");
    let expected_accepted = metric(&url, "specmesh_planner_expected_accepted_total", "");
    eprintln!(
        "planner: {proposed} nodes proposed, {granted} granted, {accepted} accepted \
         ({expected_accepted:.1} expected)"
    );
    assert!(proposed > 0.0, "no drafter proposed anything");
    assert!(
        granted > 0.0 && granted <= proposed,
        "{granted} of {proposed}"
    );
    assert!(accepted > 0.0 && accepted <= granted);
    assert!(expected_accepted > 0.0);
    // The waves' prompts were prefilled while their first sessions
    // decoded: in those sessions' forwards (the outputs above are plain
    // decoding's all the same).
    let fused = metric(&url, "specmesh_prefill_fused_tokens_total", "");
    let prefilled = metric(&url, "specmesh_prefill_tokens_total", "");
    assert!(
        fused > 0.0 && fused <= prefilled,
        "{fused} of {prefilled} prefill tokens in step forwards"
    );
    for phase in [
        "forward",
        "verify",
        "commit",
        "plan",
        "queue",
        "tree_wait",
        "report",
    ] {
        let count = metric(
            &url,
            "specmesh_verify_phase_seconds_count",
            &format!("phase=\"{phase}\""),
        );
        assert!(count > 0.0, "no {phase} phase recorded");
    }
    assert!(metric(&url, "specmesh_verify_forward_tokens_count", "") > 0.0);
}

const SEEDS: u64 = 96;
const TOKENS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_outputs_at_concurrency_4_and_16_follow_the_target() {
    let mesh = Mesh::start();
    let sampled = |seed: u64| sampled_request(1.0, 1.0, seed, TOKENS);
    let mut client = mesh.client().await;
    let mut plain = Vec::new();
    for seed in 0..SEEDS {
        let r = without_speculation(sampled(seed));
        plain.push(client.generate(r).await.unwrap().into_inner().token_ids);
    }
    let distinct: std::collections::BTreeSet<u32> = plain.iter().map(|t| t[0]).collect();
    assert!(
        distinct.len() > 3,
        "temperature 1 should vary the first token"
    );
    for n in [4u64, 16] {
        let mut speculated = Vec::new();
        for wave in (0..SEEDS).collect::<Vec<_>>().chunks(n as usize) {
            let requests = wave.iter().map(|&s| sampled(s)).collect();
            speculated.extend(all_at_once(&mesh.gateway, requests).await);
        }
        let differing = speculated
            .iter()
            .zip(&plain)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            differing, 0,
            "concurrency {n}: {differing} seeded requests differ from plain sampling"
        );
        let with: Vec<u32> = speculated.iter().map(|t| t[0]).collect();
        let without: Vec<u32> = plain.iter().map(|t| t[0]).collect();
        let (chi2, df) = homogeneity(&with, &without);
        assert!(
            chi2 <= chi2_999(df),
            "concurrency {n}: first tokens differ: chi2 {chi2:.1} > {:.1} (df {df})",
            chi2_999(df)
        );
    }
}
