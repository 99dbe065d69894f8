//! The draft model's KV kept by prefix, through the service: what its KV
//! events publish, what a later session of the same scope reuses (and
//! drafts identically from), and what that saves (an ignored timing).

use std::collections::HashSet;
use std::time::Duration;

use specmesh_drafter::DraftModelConfig;
use specmesh_kvcache::{BLOCK_TOKENS, Scope, block_hashes};
use specmesh_model::{LoadOptions, Model};
use specmesh_proto::v1;
use specmesh_proto::v1::kv_events_client::KvEventsClient;
use specmesh_testing::model_path;
use specmesh_tokenizer::Tokenizer;

use crate::common::{Drafter, Stream, config, model_config};

/// The start of a session of `tenant` and `salt` over `tokens` (all
/// prompt) that drafts with the draft model alone, small trees.
fn model_start(tenant: &str, salt: &str, tokens: &[u32], vocab: u32) -> v1::DraftStart {
    v1::DraftStart {
        session_id: format!("{tenant}/{salt}"),
        tenant: tenant.into(),
        cache_salt: salt.into(),
        tokens: tokens.to_vec(),
        prompt_len: tokens.len() as u32,
        vocab_size: vocab,
        max_draft_tokens: 8,
        max_depth: 4,
        sources: v1::DraftSources::DraftModel as i32,
        ..Default::default()
    }
}

/// Every block hash the drafter's KV events have stored so far, waiting
/// until there are `want` (or failing after 30 s).
async fn stored_blocks(
    events: &mut tonic::Streaming<v1::KvEventBatch>,
    held: &mut HashSet<u64>,
    want: usize,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while held.len() < want {
        let batch = tokio::time::timeout_at(deadline, events.message())
            .await
            .expect("the drafter published its blocks within 30 s")
            .unwrap()
            .expect("the event stream stays open");
        if batch.snapshot {
            held.clear();
        }
        held.extend(&batch.stored);
        for h in &batch.removed {
            held.remove(h);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_draft_models_kv_is_found_by_prefix_within_its_tenant_and_salt() {
    let path = model_path();
    let tokenizer = Tokenizer::from_gguf_path(&path).unwrap();
    let turn1 = tokenizer
        .encode_for_model(
            "You are a careful assistant. The history of the printing press begins in the \
             fifteenth century, when Johannes Gutenberg combined a screw press with movable \
             metal type, oil-based ink and a hand mould, and within fifty years presses ran in \
             more than two hundred cities across Europe.",
        )
        .unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend(
        tokenizer
            .encode_for_model(" Which cities printed first, and why there?")
            .unwrap(),
    );
    let blocks1 = turn1.len() / BLOCK_TOKENS;
    assert!(blocks1 >= 3, "the first turn spans blocks");

    let mut cfg = config();
    cfg.draft_model = Some(model_config(None));
    let drafter = Drafter::start(cfg).await;
    let client = drafter.client().await;
    let mut events = KvEventsClient::new(drafter.channel().await)
        .subscribe(v1::KvSubscribeRequest {})
        .await
        .unwrap()
        .into_inner();
    let snapshot = events.message().await.unwrap().unwrap();
    assert!(snapshot.snapshot && snapshot.stored.is_empty());
    assert_eq!(snapshot.block_tokens as usize, BLOCK_TOKENS);

    let vocab = Model::load(&path, &LoadOptions::default())
        .unwrap()
        .config()
        .vocab_size as u32;
    let start = |tenant: &str, salt: &str, tokens: &[u32]| model_start(tenant, salt, tokens, vocab);
    let first_tree = |start: v1::DraftStart| {
        let mut client = client.clone();
        async move {
            let mut stream = Stream::start(&mut client, start).await;
            let tree = stream.tree().await;
            stream.close().await;
            tree
        }
    };

    // The first turn computes its context and publishes its blocks, named
    // as the gateway names them.
    first_tree(start("a", "", &turn1)).await;
    let mut held = HashSet::new();
    stored_blocks(&mut events, &mut held, blocks1).await;
    let scope = Scope::new("a", "", None);
    let expected: HashSet<u64> = block_hashes(scope, &turn1, BLOCK_TOKENS)
        .into_iter()
        .collect();
    assert_eq!(
        held, expected,
        "the first turn's blocks, in its tenant's scope"
    );
    let before = drafter.stats.snapshot();
    assert_eq!(before.draft_prefix_hit_tokens, 0);

    // The next turn of the same tenant finds them: its draft model starts
    // from them and drafts what a whole prefill would.
    let seeded = first_tree(start("a", "", &turn2)).await;
    let after = drafter.stats.snapshot();
    assert_eq!(
        after.draft_prefix_hit_tokens - before.draft_prefix_hit_tokens,
        (blocks1 * BLOCK_TOKENS) as u64,
        "the whole first turn's blocks are reused"
    );
    assert_eq!(
        after.draft_prefix_queried_tokens - before.draft_prefix_queried_tokens,
        turn2.len() as u64 - 1
    );

    // Another salt of the tenant, and another tenant, find nothing, and
    // draft the same tree from a whole prefill.
    for (tenant, salt) in [("a", "private"), ("b", "")] {
        let before = drafter.stats.snapshot();
        let prefilled = first_tree(start(tenant, salt, &turn2)).await;
        let after = drafter.stats.snapshot();
        assert_eq!(
            after.draft_prefix_hit_tokens, before.draft_prefix_hit_tokens,
            "{tenant}/{salt} shares nothing"
        );
        assert_eq!(
            (&prefilled.nodes, prefilled.root_token),
            (&seeded.nodes, seeded.root_token),
            "a cached prefix drafts what a prefill does"
        );
    }
    drafter.shutdown().await.unwrap();
}

/// What the draft model's KV by prefix saves a conversation's next turn:
/// the time to a session's first tree when its context is a turn of
/// `NEW` tokens after a history of `HISTORY` tokens, with the history's
/// draft KV cached (the same tenant) and without (another tenant), each
/// measured `REPS` times alternately. Prints; asserts only that the
/// history was found. Run with the draft model to time, e.g.
/// `SPECMESH_DRAFT_TIMING_MODEL=qwen2.5-coder-0.5b cargo test --release
/// -p specmesh-drafter --test service -- --ignored --nocapture draft_prefix_timing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing: prints what a cached history saves"]
async fn draft_prefix_timing() {
    const NEW: usize = 200;
    const REPS: usize = 3;
    let name = std::env::var("SPECMESH_DRAFT_TIMING_MODEL")
        .map_or_else(|_| model_path(), std::path::PathBuf::from);
    let path = specmesh_catalog::resolve(Some(&name)).unwrap();
    let vocab = Model::load(&path, &LoadOptions::default())
        .unwrap()
        .config()
        .vocab_size as u32;
    let mut cfg = config();
    cfg.draft_model = Some(DraftModelConfig {
        path: name.clone(),
        target_tokenizer: None,
        threads: None,
        kv_budget_bytes: 1 << 30,
        ..model_config(None)
    });
    let drafter = Drafter::start(cfg).await;
    let client = drafter.client().await;
    let first_tree = |tenant: String, tokens: Vec<u32>| {
        let mut client = client.clone();
        async move {
            let start = model_start(&tenant, "", &tokens, vocab);
            let t0 = std::time::Instant::now();
            let mut stream = Stream::start(&mut client, start).await;
            stream.tree_within(Duration::from_secs(600)).await;
            let took = t0.elapsed().as_secs_f64();
            stream.close().await;
            took
        }
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "draft model {}: time to the first tree of a turn of {NEW} new tokens",
        name.display()
    );
    for history in [1000usize, 2000] {
        let (mut cached, mut fresh) = (Vec::new(), Vec::new());
        for rep in 0..REPS {
            // Ordinary ids of the vocabulary: a forward costs the same
            // whatever the tokens are.
            let context: Vec<u32> = (0..history + NEW)
                .map(|i| 200 + ((i * 7919 + rep * 13) % 20_000) as u32)
                .collect();
            let tenant = format!("h{history}-r{rep}");
            first_tree(tenant.clone(), context[..history].to_vec()).await;
            let before = drafter.stats.snapshot().draft_prefix_hit_tokens;
            cached.push(first_tree(tenant.clone(), context.clone()).await);
            let found = drafter.stats.snapshot().draft_prefix_hit_tokens - before;
            assert!(
                found as usize + 2 * 16 >= history,
                "{found} of {history} found"
            );
            fresh.push(first_tree(format!("{tenant}-other"), context).await);
        }
        let (c, f) = (median(cached), median(fresh));
        println!(
            "history {history}: cached {:.0} ms, computed {:.0} ms ({:.1}x faster)",
            c * 1e3,
            f * 1e3,
            f / c
        );
    }
    drafter.shutdown().await.unwrap();
}
