//! Cost of one step at a 2k-token context, per drafter. Ignored by default
//! (timings on shared CI machines are noise); run with
//! `cargo test --release -p specmesh-draft --test timing -- --ignored --nocapture`.

use std::hint::black_box;
use std::time::Instant;

use specmesh_draft::{
    DraftContext, Drafter, Feedback, GlobalSuffixIndex, Merged, PromptLookup, SuffixConfig,
    SuffixDrafter, TenantKey, TokenRecycler, TreeLimits,
};

/// 2048 pseudo-random tokens over a 2000-token vocabulary, then a quote of
/// 300 of them (what lookup and suffix drafting live on).
fn text() -> Vec<u32> {
    let mut s = 7u64;
    let mut t: Vec<u32> = (0..2048)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((s >> 33) % 2000) as u32
        })
        .collect();
    let quote = t[100..400].to_vec();
    t.extend_from_slice(&quote);
    t
}

/// Mean µs per propose + observe, the context growing by one token a step
/// from 2048 + 100 tokens.
fn per_step(d: &mut dyn Drafter, tokens: &[u32]) -> f64 {
    let limits = TreeLimits::new(64, 8, 50_000);
    let start = tokens.len() - 200;
    let step = |d: &mut dyn Drafter, n: usize| {
        let tree = d.propose(&DraftContext {
            tokens: &tokens[..n],
            prompt_len: 1024,
            limits,
        });
        let next = tokens[n];
        let path = [0];
        let top_k = [vec![(next, -0.1), (next + 1, -2.0)]];
        d.observe(&Feedback {
            tree: &tree,
            path: &path,
            committed: &[next],
            top_k: &top_k,
        });
        black_box(tree);
    };
    // Warm up: builds the index over the first `start` tokens.
    step(d, start - 1);
    let steps = 199;
    let t0 = Instant::now();
    for i in 0..steps {
        step(d, start + i);
    }
    t0.elapsed().as_secs_f64() * 1e6 / steps as f64
}

#[test]
#[ignore]
fn timing_at_2k_tokens() {
    let tokens = text();
    let index = GlobalSuffixIndex::default();
    let tenant = TenantKey::from("t");
    // 100 earlier outputs of 512 tokens in the tenant's global trie.
    let t0 = Instant::now();
    for i in 0..100 {
        let doc: Vec<u32> = tokens
            .iter()
            .cycle()
            .skip(i * 37)
            .take(512)
            .copied()
            .collect();
        index.insert(&tenant, &doc);
    }
    let insert = t0.elapsed().as_secs_f64() * 1e6 / 100.0;
    println!(
        "global insert: {insert:.0} µs per 512-token document ({} KiB in use)",
        index.bytes() >> 10
    );
    let cases: Vec<(&str, Box<dyn Drafter>)> = vec![
        ("lookup", Box::new(PromptLookup::default())),
        ("suffix (session)", Box::new(SuffixDrafter::default())),
        (
            "suffix (session + global)",
            Box::new(SuffixDrafter::with_global(
                SuffixConfig::default(),
                &index,
                tenant.clone(),
            )),
        ),
        ("recycle", Box::new(TokenRecycler::default())),
        (
            "merged (all three)",
            Box::new(Merged::new(vec![
                Box::new(PromptLookup::default()),
                Box::new(SuffixDrafter::with_global(
                    SuffixConfig::default(),
                    &index,
                    tenant,
                )),
                Box::new(TokenRecycler::default()),
            ])),
        ),
    ];
    for (name, mut d) in cases {
        let us = per_step(d.as_mut(), &tokens);
        println!("{name}: {us:.2} µs per step (64 nodes, depth 8, ~2.2k tokens)");
    }
}
