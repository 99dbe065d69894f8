//! A draft model of another vocabulary through the real services:
//! `specmesh up --model qwen2.5-coder-1.5b --draft-model smollm2-135m`.
//! SmolLM2 (49k tokens) drafts through text for the 1.5B (151k): greedy
//! output equals plain decoding, and seeded sampling follows the target
//! (its trees carry no q, so each seed's draws are plain sampling's, and
//! every position's distribution passes a chi-square homogeneity test).

use specmesh_e2e::mesh::{Mesh, chat_request, sampled_request, with_mode, without_speculation};
use specmesh_e2e::metrics::metric;
use specmesh_e2e::model_path;
use specmesh_e2e::stats::{chi2_999, homogeneity};
use specmesh_proto::v1;

/// A verify cost that barely grows with the tree, so the policy and the
/// planner grant the draft model's trees while the test runs.
const FLAT_CURVE: &str = "1:1,2:1.01,4:1.02,8:1.04,16:1.08,32:1.16,64:1.32";

/// The two tests take turns: two 1.5B meshes on the same two cores slow
/// each other's forwards, and the policy prices the draft model against
/// what it measures.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn mesh() -> Mesh {
    Mesh::start_model_with_draft(
        std::path::Path::new("qwen2.5-coder-1.5b"),
        FLAT_CURVE,
        &model_path(),
        &[],
    )
}

fn draft_model(r: v1::GenerateRequest) -> v1::GenerateRequest {
    with_mode(r, v1::SpeculationMode::DraftModel)
}

/// The sum of every sample of `name` in the drafter's `/metrics`.
fn drafter_metric(mesh: &Mesh, name: &str) -> f64 {
    let url = mesh.of("specmesh-drafter")[0]
        .metrics
        .clone()
        .expect("the drafter's metrics URL");
    metric(&url, name, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_drafting_through_text_keeps_the_1_5b_greedy_output() {
    let _turn = SERIAL.lock().await;
    let mesh = mesh();
    let mut client = mesh.client().await;
    let (mut drafted, mut accepted) = (0u64, 0u64);
    for text in [
        "Write a Python function that returns the sum of a list of numbers.",
        "Translate to French: Good morning, how are you today?",
        "List three colors, one per line.",
    ] {
        let spec = client
            .generate(draft_model(chat_request(text, 32)))
            .await
            .unwrap()
            .into_inner();
        let off = client
            .generate(without_speculation(chat_request(text, 32)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(spec.token_ids, off.token_ids, "{text:?}");
        let s = spec.speculation.unwrap_or_default();
        drafted += u64::from(s.drafted_tokens);
        accepted += u64::from(s.accepted_tokens);
    }
    // How much of it the 1.5B accepts depends on which steps the policy
    // drafts at, which on two cores shared by both models follows their
    // timing (from 0 of 17 to 7 of 41 in suite runs): printed, not
    // asserted. The trees flowed and changed nothing.
    eprintln!("cross-vocabulary greedy: {drafted} drafted, {accepted} accepted");
    assert!(drafted > 0, "the draft model drafted nothing through text");
    assert!(drafter_metric(&mesh, "specmesh_drafter_retokenize_seconds_count") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_with_smollm2_drafting_through_text_follows_the_1_5b() {
    let _turn = SERIAL.lock().await;
    const SEEDS: u64 = 40;
    const TOKENS: u32 = 3;
    let mesh = mesh();
    let mut client = mesh.client().await;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut drafted = 0u64;
    for seed in 0..SEEDS {
        let r = sampled_request(1.0, 1.0, seed, TOKENS);
        let a = client
            .generate(draft_model(r.clone()))
            .await
            .unwrap()
            .into_inner();
        let b = client
            .generate(without_speculation(r))
            .await
            .unwrap()
            .into_inner();
        drafted += u64::from(a.speculation.unwrap_or_default().drafted_tokens);
        // Deterministic proposals: the target's seeded draws decide every
        // token, speculation or not.
        assert_eq!(a.token_ids, b.token_ids, "seed {seed}");
        with.push(a.token_ids);
        without.push(b.token_ids);
    }
    assert!(drafted > 0, "the draft model drafted nothing");
    let at = |runs: &[Vec<u32>], i: usize| -> Vec<u32> {
        runs.iter().filter_map(|r| r.get(i).copied()).collect()
    };
    let distinct: std::collections::BTreeSet<u32> = at(&without, 0).into_iter().collect();
    assert!(
        distinct.len() > 3,
        "the first token should vary: {distinct:?}"
    );
    for i in 0..TOKENS as usize {
        let (chi2, df) = homogeneity(&at(&with, i), &at(&without, i));
        eprintln!(
            "token {i}: drafted {drafted}, chi2 {chi2:.1} (df {df}, limit {:.1})",
            chi2_999(df)
        );
        assert!(chi2 <= chi2_999(df), "token {i}: chi2 {chi2:.1} (df {df})");
    }
}
