//! Sampling with a draft model through the real services follows the
//! target's distribution.
//!
//! The drafter drafts with a model (here the target's first 8 layers, so
//! its distribution q differs from the target's p) sampled with the
//! request's parameters, which reach it in `DraftStart`; sampled trees carry
//! q and the verifier accepts by recursive rejection sampling. Unlike the
//! model-free case a seeded request need not return the same tokens with
//! and without speculation (the draws differ: the test requires that some
//! do, or rejection sampling never ran), so the claim is statistical: a
//! chi-square homogeneity test of each output position's distribution,
//! with and without speculation, at a false-alarm rate of 0.1% per test,
//! at temperature 1 and at temperature 0.7 with top-p 0.9; once with the
//! whole draft head, once with one that scores only the most frequent
//! tokens (FR-Spec).

use specmesh_e2e::mesh::{Mesh, generate_all, sampled_request, with_mode, without_speculation};
use specmesh_e2e::stats::{chi2_999, homogeneity};
use specmesh_proto::v1;

const SEEDS: u64 = 200;
const TOKENS: u32 = 3;
/// Requests in flight at once: the verifier batches them (its batched
/// forward is bit-exact, so a seeded plain request draws the same tokens
/// in any batch), and the run takes a fraction of one-at-a-time's time.
const WAVE: usize = 4;

/// With the draft model only: the test is about its sampled trees. Trees
/// of at most 8 nodes: on the flat curve below the policy would draft 64,
/// a fifth of a second of drafting per step, for what 8 test as well
/// (rejection sampling acts on every node alike).
fn sampled(temperature: f32, top_p: f32, seed: u64) -> v1::GenerateRequest {
    let mut r = with_mode(
        sampled_request(temperature, top_p, seed, TOKENS),
        v1::SpeculationMode::DraftModel,
    );
    if let Some(s) = r.speculation.as_mut() {
        s.max_draft_tokens = 8;
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_model_sampling_follows_the_target() {
    sampling_follows_the_target(&[]).await;
}

/// The draft head scores only the 1,024 most frequent tokens (FR-Spec):
/// q is over those, zero elsewhere, and the target's distribution must
/// still come out whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frequent_token_draft_head_keeps_sampling_exact() {
    sampling_follows_the_target(&[("SPECMESH_DRAFTER_DRAFT_HEAD_TOKENS", "1024")]).await;
}

/// Plain sampling's outputs per (temperature, top-p), seed by seed: the
/// same in both tests (the drafter settings they vary never reach a plain
/// request, and a seeded plain request draws the same tokens in any
/// batch), so the second test to get there reuses the first's instead of
/// sampling them again. A std mutex: each test has a runtime of its own.
static PLAIN: std::sync::Mutex<Vec<(Setting, Outputs)>> = std::sync::Mutex::new(Vec::new());

/// A (temperature, top-p) pair by its bits, and one output per seed.
type Setting = (u32, u32);
type Outputs = Vec<Vec<u32>>;

fn plain_outputs(key: Setting) -> Option<Outputs> {
    let plain = PLAIN.lock().unwrap_or_else(|e| e.into_inner());
    plain
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.clone())
}

/// The chi-square test with a self-draft of the target's first 8 layers
/// and `extra` drafter settings.
async fn sampling_follows_the_target(extra: &[(&str, &str)]) {
    let mesh = Mesh::start_self_draft(extra);
    for (temperature, top_p) in [(1.0f32, 1.0f32), (0.7, 0.9)] {
        let key = (temperature.to_bits(), top_p.to_bits());
        let known = plain_outputs(key);
        let (mut with, mut without) = (Vec::new(), Vec::new());
        let mut differ = 0;
        let (mut drafted, mut accepted) = (0u64, 0u64);
        let seeds: Vec<u64> = (0..SEEDS).collect();
        for wave in seeds.chunks(WAVE) {
            let speculated = wave.iter().map(|&s| sampled(temperature, top_p, s));
            let plain = wave
                .iter()
                .filter(|_| known.is_none())
                .map(|&s| without_speculation(sampled(temperature, top_p, s)));
            let answers = generate_all(&mesh.gateway, speculated.chain(plain).collect()).await;
            let (a, b) = answers.split_at(wave.len());
            for (i, (&seed, a)) in wave.iter().zip(a).enumerate() {
                let b = match &known {
                    Some(known) => &known[seed as usize],
                    None => &b[i].token_ids,
                };
                let s = a.speculation.clone().unwrap_or_default();
                drafted += u64::from(s.drafted_tokens);
                accepted += u64::from(s.accepted_tokens);
                differ += usize::from(a.token_ids != *b);
                with.push(a.token_ids.clone());
                without.push(b.clone());
            }
        }
        if known.is_none() {
            PLAIN
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((key, without.clone()));
        }
        let at = |runs: &[Vec<u32>], i: usize| -> Vec<u32> {
            runs.iter().filter_map(|r| r.get(i).copied()).collect()
        };
        let distinct: std::collections::BTreeSet<u32> = at(&without, 0).into_iter().collect();
        assert!(
            distinct.len() > 3,
            "t={temperature}: the first token should vary: {distinct:?}"
        );
        assert!(
            drafted > 0 && accepted > 0,
            "t={temperature}: the draft model drafted {drafted}, {accepted} accepted"
        );
        assert!(
            differ > 0,
            "t={temperature}: every output equals plain sampling's: the draft distributions were never used"
        );
        for i in 0..TOKENS as usize {
            let (chi2, df) = homogeneity(&at(&with, i), &at(&without, i));
            eprintln!(
                "t={temperature} top_p={top_p} token {i}: drafted {drafted}, accepted {accepted}, {differ} of {SEEDS} outputs differ, chi2 {chi2:.1} (df {df}, limit {:.1})",
                chi2_999(df)
            );
            assert!(
                chi2 <= chi2_999(df),
                "t={temperature} top_p={top_p}: token {i} distributions differ: chi2 {chi2:.1} > {:.1} (df {df})",
                chi2_999(df)
            );
        }
    }
}

/// Under a grammar the target's distribution is its masked one (here a
/// sentence of letters: no digits, markdown or newlines): drafted nodes
/// the grammar forbids are cut (their parent then decides by the
/// probability-free rule), the rest are accepted by rejection sampling
/// against the masked target, and what comes out must be distributed as
/// plain sampling under the same grammar, position by position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_model_sampling_under_a_grammar_follows_the_masked_target() {
    let mesh = Mesh::start_self_draft(&[]);
    let constrained = |mut r: v1::GenerateRequest| {
        r.structured = Some(v1::Structured {
            kind: Some(v1::structured::Kind::Regex("[A-Z][A-Za-z ,']+\\.".into())),
        });
        r
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let (mut drafted, mut accepted, mut differ) = (0u64, 0u64, 0usize);
    let seeds: Vec<u64> = (0..SEEDS).collect();
    for wave in seeds.chunks(WAVE) {
        let speculated = wave.iter().map(|&s| constrained(sampled(1.0, 1.0, s)));
        let plain = wave
            .iter()
            .map(|&s| without_speculation(constrained(sampled(1.0, 1.0, s))));
        let answers = generate_all(&mesh.gateway, speculated.chain(plain).collect()).await;
        let (a, b) = answers.split_at(wave.len());
        for (a, b) in a.iter().zip(b) {
            let s = a.speculation.clone().unwrap_or_default();
            drafted += u64::from(s.drafted_tokens);
            accepted += u64::from(s.accepted_tokens);
            differ += usize::from(a.token_ids != b.token_ids);
            with.push(a.token_ids.clone());
            without.push(b.token_ids.clone());
        }
    }
    let at = |runs: &[Vec<u32>], i: usize| -> Vec<u32> {
        runs.iter().filter_map(|r| r.get(i).copied()).collect()
    };
    let distinct: std::collections::BTreeSet<u32> = at(&without, 0).into_iter().collect();
    assert!(
        distinct.len() > 2,
        "the first token should vary: {distinct:?}"
    );
    assert!(
        drafted > 0 && accepted > 0,
        "drafted {drafted}, accepted {accepted}"
    );
    assert!(differ > 0, "rejection sampling never ran");
    for i in 0..TOKENS as usize {
        let (chi2, df) = homogeneity(&at(&with, i), &at(&without, i));
        eprintln!(
            "grammar token {i}: drafted {drafted}, accepted {accepted}, {differ} differ, chi2 {chi2:.1} (df {df}, limit {:.1})",
            chi2_999(df)
        );
        assert!(
            chi2 <= chi2_999(df),
            "token {i} distributions differ under the grammar: chi2 {chi2:.1} > {:.1} (df {df})",
            chi2_999(df)
        );
    }
}
