//! Sampling through the real services follows the target's distribution
//! with and without speculation.
//!
//! With model-free drafters (no draft probabilities) the verifier draws each
//! output position with the same uniform as plain sampling, so a seeded
//! request returns the very same tokens either way; the test checks that
//! identity for every seed and, as the statistical statement the identity
//! implies, a chi-square homogeneity test of the first-token distributions
//! at a false-alarm rate of 0.1%.

use specmesh_e2e::mesh::{Mesh, sampled_request, without_speculation};
use specmesh_e2e::stats::{chi2_999, homogeneity};
use specmesh_proto::v1;

const SEEDS: u64 = 200;
const TOKENS: u32 = 3;

fn sampled(seed: u64) -> v1::GenerateRequest {
    sampled_request(1.0, 1.0, seed, TOKENS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_tokens_follow_the_target_with_and_without_speculation() {
    let mesh = Mesh::start();
    let mut client = mesh.client().await;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut identical = 0;
    for seed in 0..SEEDS {
        let a = client
            .generate(sampled(seed))
            .await
            .unwrap()
            .into_inner()
            .token_ids;
        let b = client
            .generate(without_speculation(sampled(seed)))
            .await
            .unwrap()
            .into_inner()
            .token_ids;
        identical += usize::from(a == b);
        with.push(a[0]);
        without.push(b[0]);
    }
    let distinct: std::collections::BTreeSet<u32> = without.iter().copied().collect();
    assert!(
        distinct.len() > 3,
        "temperature 1 should vary the first token: {distinct:?}"
    );
    assert_eq!(
        identical, SEEDS as usize,
        "a seeded request differs with and without speculation"
    );
    let (chi2, df) = homogeneity(&with, &without);
    assert!(
        chi2 <= chi2_999(df),
        "first-token distributions differ: chi2 {chi2:.1} > {:.1} (df {df})",
        chi2_999(df)
    );
}
