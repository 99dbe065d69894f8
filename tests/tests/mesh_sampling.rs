//! Sampling through the real services follows the target's distribution
//! with and without speculation.
//!
//! With model-free drafters (no draft probabilities) the verifier draws each
//! output position with the same uniform as plain sampling, so a seeded
//! request returns the very same tokens either way; the test checks that
//! identity for every seed and, as the statistical statement the identity
//! implies, a chi-square homogeneity test of the first-token distributions
//! at a false-alarm rate of 0.1%.

use specmesh_e2e::mesh::{Mesh, chat_request, without_speculation};
use specmesh_proto::v1;

const SEEDS: u64 = 200;
const TOKENS: u32 = 3;

fn sampled(seed: u64) -> v1::GenerateRequest {
    v1::GenerateRequest {
        sampling: Some(v1::SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed,
        }),
        ..chat_request(
            "Write one word that comes to your mind, then a short sentence with it.",
            TOKENS,
        )
    }
}

/// Chi-square homogeneity statistic of two samples over the same
/// categories, pooling categories with fewer than 10 observations in total
/// (so every expected count is at least 5).
fn homogeneity(a: &[u32], b: &[u32]) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for &t in a {
        counts.entry(t).or_default().0 += 1.0;
    }
    for &t in b {
        counts.entry(t).or_default().1 += 1.0;
    }
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    for (_, c) in counts {
        if c.0 + c.1 >= 10.0 {
            cells.push(c);
        } else {
            pooled.0 += c.0;
            pooled.1 += c.1;
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        cells.push(pooled);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let n = na + nb;
    let mut chi2 = 0.0;
    for (x, y) in &cells {
        let total = x + y;
        for (obs, size) in [(x, na), (y, nb)] {
            let e = total * size / n;
            chi2 += (obs - e).powi(2) / e;
        }
    }
    (chi2, cells.len().saturating_sub(1))
}

/// The 0.999 quantile of chi-square with `df` degrees of freedom
/// (Wilson–Hilferty approximation, within 1% for df >= 3).
fn chi2_999(df: usize) -> f64 {
    let k = df.max(1) as f64;
    let z = 3.090_232; // the normal 0.999 quantile
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
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

#[test]
fn the_homogeneity_test_detects_a_shifted_distribution() {
    // The statistic must be able to fail: two clearly different samples.
    let a: Vec<u32> = (0..200).map(|i| i % 4).collect();
    let b: Vec<u32> = (0..200)
        .map(|i| if i % 2 == 0 { 0 } else { (i % 4) as u32 })
        .collect();
    let (chi2, df) = homogeneity(&a, &b);
    assert!(chi2 > chi2_999(df), "chi2 {chi2} df {df}");
    let (same, df) = homogeneity(&a, &a);
    assert!(same < 1e-9 && same <= chi2_999(df));
}
