//! The model drafter through the service (`$SPECMESH_MODEL`, else the
//! `specmesh model fetch` cache). A missing model fails the test: CI always
//! has it, and a skipped test proves nothing.

use std::time::Duration;

use specmesh_drafter::DraftModelConfig;
use specmesh_model::{Block, LoadOptions, Model};
use specmesh_proto::v1;
use specmesh_tokenizer::Tokenizer;

use crate::common::{Drafter, Stream, config, root_child};
use specmesh_testing::model_path;

fn model_config(layers: Option<usize>) -> DraftModelConfig {
    DraftModelConfig {
        path: model_path(),
        sha256: None,
        self_draft_layers: layers,
        target_tokenizer: Some(model_path()),
        threads: Some(2),
        isa: None,
        max_sessions: 4,
        kv_budget_bytes: 64 << 20,
        draft_ahead: false,
        head_tokens: None,
        token_ranking: None,
    }
}

/// The greedy next token of `model` after `tokens`.
fn greedy_next(model: &Model, tokens: &[u32]) -> u32 {
    let mut seq = model.new_sequence();
    let block = Block::chain(tokens.to_vec(), 0).unwrap().last_logits_only();
    let logits = model.forward(&mut seq, &block).unwrap();
    logits.argmax(logits.rows() - 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_draft_with_the_model_on_plain_text() {
    let path = model_path();
    let tokenizer = Tokenizer::from_gguf_path(&path).unwrap();
    let prompt = tokenizer
        .encode_for_model("The history of the printing press begins in the fifteenth century, when")
        .unwrap();
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let vocab = model.config().vocab_size as u32;
    let next = greedy_next(&model, &prompt);

    let mut cfg = config();
    cfg.draft_model = Some(model_config(None));
    let drafter = Drafter::start(cfg).await;
    let mut client = drafter.client().await;
    let start = v1::DraftStart {
        session_id: "model".into(),
        tokens: prompt.clone(),
        prompt_len: prompt.len() as u32,
        vocab_size: vocab,
        max_draft_tokens: 8,
        max_depth: 4,
        sources: v1::DraftSources::DraftModel as i32,
        ..Default::default()
    };
    let mut stream = Stream::start(&mut client, start).await;
    let tree = stream.tree().await;
    assert!(
        root_child(&tree, next),
        "the draft model's greedy token {next} is drafted: {tree:?}"
    );
    // Every step is answered; the model keeps drafting as text is committed.
    let mut context = prompt.clone();
    let mut tree = tree;
    for step in 0..4u64 {
        let want = greedy_next(&model, &context);
        let path = match tree
            .nodes
            .iter()
            .position(|n| n.parent == 0 && n.token == want)
        {
            Some(j) => vec![0, j as u32 + 1],
            None => vec![0],
        };
        let bonus = {
            let mut c = context.clone();
            c.push(want);
            greedy_next(&model, &c)
        };
        let committed = if path.len() == 2 {
            vec![want, bonus]
        } else {
            vec![want]
        };
        context.extend_from_slice(&committed);
        stream
            .outcome(v1::StepOutcome {
                step,
                path,
                committed,
                batch_size: 1,
                ..Default::default()
            })
            .await;
        tree = stream.tree().await;
        assert_eq!(
            (tree.step, tree.root_token),
            (step + 1, *context.last().unwrap())
        );
        assert!(tree.nodes.len() <= 8);
    }
    stream.close().await;
    let stats = drafter.stats.snapshot();
    println!(
        "model drafting: {:.2} ms per tree over {} trees",
        stats.propose_time.as_secs_f64() * 1e3 / stats.trees_sent as f64,
        stats.trees_sent
    );
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_draft_serves_and_a_foreign_tokenizer_is_refused_at_startup() {
    let mut cfg = config();
    cfg.draft_model = Some(model_config(Some(4)));
    let drafter = Drafter::start(cfg).await;
    let mut client = drafter.client().await;
    let start = v1::DraftStart {
        tokens: vec![1, 2, 3, 4],
        prompt_len: 4,
        vocab_size: 49152,
        max_draft_tokens: 4,
        max_depth: 4,
        ..Default::default()
    };
    let mut stream = Stream::start(&mut client, start).await;
    assert_eq!(stream.tree().await.step, 0);
    stream.close().await;
    drafter.shutdown().await.unwrap();

    // A target tokenizer with another vocabulary that does not give back
    // its text (three tokens cannot spell a chat): the drafter does not
    // start, and says why it cannot draft through text either.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), FOREIGN_TOKENIZER).unwrap();
    let mut cfg = config();
    cfg.draft_model = Some(DraftModelConfig {
        target_tokenizer: Some(dir.path().to_path_buf()),
        ..model_config(None)
    });
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        specmesh_server::start::<specmesh_drafter::Drafter>(cfg),
    )
    .await
    .unwrap()
    .expect_err("a foreign vocabulary is refused");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("cannot draft for the target tokenizer"),
        "{msg}"
    );
    assert!(msg.contains("but the target's has 3"), "{msg}");
    assert!(
        msg.contains("cannot draft through text") && msg.contains("does not give back"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_of_another_vocabulary_is_refused_naming_both_models() {
    let path = model_path();
    let tokenizer = Tokenizer::from_gguf_path(&path).unwrap();
    let mut cfg = config();
    cfg.draft_model = Some(model_config(Some(4)));
    let drafter = Drafter::start(cfg).await;
    let mut client = drafter.client().await;
    let start = |fingerprint: u64, sources: v1::DraftSources| v1::DraftStart {
        session_id: "vocab".into(),
        tokens: vec![1, 2, 3, 4],
        prompt_len: 4,
        vocab_size: 49152,
        max_draft_tokens: 4,
        max_depth: 4,
        sources: sources as i32,
        target_model: "some-other-target".into(),
        target_vocab_fingerprint: fingerprint,
        ..Default::default()
    };
    // The right vocabulary: drafted with the model.
    let mut ok = Stream::start(
        &mut client,
        start(tokenizer.vocab_fingerprint(), v1::DraftSources::DraftModel),
    )
    .await;
    assert_eq!(ok.tree().await.step, 0);
    ok.close().await;
    // Another one, whether the model is asked for or only possible.
    for sources in [
        v1::DraftSources::DraftModel,
        v1::DraftSources::Combined,
        v1::DraftSources::Auto,
    ] {
        let mut s = Stream::start(&mut client, start(0x1234, sources)).await;
        let status = s.error().await;
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        let msg = status.message();
        assert!(
            msg.contains("some-other-target") && msg.contains(&path.display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("vocabularies differ"), "{msg}");
    }
    // Model-free drafting never touches the model: no refusal.
    let mut s = Stream::start(&mut client, start(0x1234, v1::DraftSources::ModelFree)).await;
    assert_eq!(s.tree().await.step, 0);
    s.close().await;
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_for_a_draft_model_the_drafter_lacks_is_refused() {
    let drafter = Drafter::start(config()).await;
    let mut client = drafter.client().await;
    for sources in [v1::DraftSources::DraftModel, v1::DraftSources::Combined] {
        let start = v1::DraftStart {
            tokens: vec![1, 2, 3],
            prompt_len: 3,
            vocab_size: 100,
            max_draft_tokens: 4,
            max_depth: 4,
            sources: sources as i32,
            ..Default::default()
        };
        let mut s = Stream::start(&mut client, start).await;
        let status = s.error().await;
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains("--draft-model"), "{status:?}");
    }
    drafter.shutdown().await.unwrap();
}

/// A three-word Hugging Face tokenizer.
const FOREIGN_TOKENIZER: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "<unk>": 2}, "unk_token": "<unk>"}
}"#;

/// Drafting ahead, driven step by step: the target's greedy path through
/// each tree and its next token are committed, and since the draft model is
/// the target itself, the guess drafted while "the verifier verifies" holds:
/// the next tree comes from it (`drafted_ahead`), rooted at the committed
/// token, holding the greedy continuation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_that_holds_is_sent_as_the_next_tree() {
    let path = model_path();
    let tokenizer = Tokenizer::from_gguf_path(&path).unwrap();
    let prompt = tokenizer
        .encode_for_model("One, two, three, four, five, six, seven, eight, nine,")
        .unwrap();
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let vocab = model.config().vocab_size as u32;

    let mut cfg = config();
    cfg.draft_model = Some(DraftModelConfig {
        draft_ahead: true,
        head_tokens: None,
        token_ranking: None,
        ..model_config(None)
    });
    let drafter = Drafter::start(cfg).await;
    let mut client = drafter.client().await;
    let start = v1::DraftStart {
        session_id: "ahead".into(),
        tokens: prompt.clone(),
        prompt_len: prompt.len() as u32,
        vocab_size: vocab,
        max_draft_tokens: 8,
        max_depth: 4,
        sources: v1::DraftSources::DraftModel as i32,
        // A slow target and a flat curve: drafting with the model always
        // pays, so every step drafts and every tree has a guess after it.
        target_step_seconds: 10.0,
        cost_curve: vec![
            v1::CostPoint {
                tokens: 1,
                relative_cost: 1.0,
            },
            v1::CostPoint {
                tokens: 64,
                relative_cost: 1.0,
            },
        ],
        ..Default::default()
    };
    let mut stream = Stream::start(&mut client, start).await;
    let mut context = prompt.clone();
    let mut tree = stream.tree().await;
    let mut ahead = 0;
    for step in 0..5u64 {
        assert!(!tree.nodes.is_empty(), "step {step} drafted nothing");
        // The target's greedy path through the tree, then its own token.
        let (mut node, mut path, mut committed) = (0u32, vec![0u32], Vec::new());
        let bonus = loop {
            let mut c = context.clone();
            c.extend_from_slice(&committed);
            let want = greedy_next(&model, &c);
            match tree
                .nodes
                .iter()
                .position(|n| n.parent == node && n.token == want)
            {
                Some(j) => {
                    node = j as u32 + 1;
                    path.push(node);
                    committed.push(want);
                }
                None => break want,
            }
        };
        committed.push(bonus);
        context.extend_from_slice(&committed);
        stream
            .outcome(v1::StepOutcome {
                step,
                path,
                committed,
                batch_size: 1,
                ..Default::default()
            })
            .await;
        tree = stream.tree().await;
        assert_eq!(
            (tree.step, tree.root_token),
            (step + 1, *context.last().unwrap())
        );
        if tree.drafted_ahead {
            ahead += 1;
            // A tree from a guess still drafts the target's next token.
            let want = greedy_next(&model, &context);
            assert!(root_child(&tree, want), "{want} under the root: {tree:?}");
        }
    }
    assert!(ahead >= 3, "{ahead} of 5 trees came from a guess");
    stream.close().await;
    drafter.shutdown().await.unwrap();
}

/// `--draft-head-tokens`: the shipped ranking serves by default; a ranking
/// counted with another tokenizer, or a file that is not one, stops the
/// drafter at start with a message that says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_head_ranking_of_another_tokenizer_is_refused_at_start() {
    let mut cfg = config();
    cfg.draft_model = Some(DraftModelConfig {
        head_tokens: Some(2048),
        ..model_config(None)
    });
    let drafter = Drafter::start(cfg).await;
    drafter.shutdown().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let qwen = dir.path().join("qwen.txt");
    let other = specmesh_draft_model::TokenRanking::from_counts(0x1234, "test".into(), &[0, 3, 1]);
    std::fs::write(&qwen, other.to_text()).unwrap();
    let junk = dir.path().join("junk.txt");
    std::fs::write(&junk, "1 2\n").unwrap();
    for (file, says) in [
        (qwen, "make one for this model with `specmesh token-ranking"),
        (junk, "not a token ranking"),
        (dir.path().join("missing.txt"), "reading the token ranking"),
    ] {
        let mut cfg = config();
        cfg.draft_model = Some(DraftModelConfig {
            head_tokens: Some(2048),
            token_ranking: Some(file.clone()),
            ..model_config(None)
        });
        let err = tokio::time::timeout(
            Duration::from_secs(60),
            specmesh_server::start::<specmesh_drafter::Drafter>(cfg),
        )
        .await
        .unwrap()
        .expect_err("a bad ranking is refused");
        let msg = format!("{err:#}");
        assert!(msg.contains(says), "{}: {msg}", file.display());
        assert!(
            msg.contains("--draft-head-tokens") || msg.contains("token ranking"),
            "{msg}"
        );
    }
}

/// Every block hash the drafter's KV events have stored so far, waiting
/// until there are `want` (or failing after 30 s).
async fn stored_blocks(
    events: &mut tonic::Streaming<v1::KvEventBatch>,
    held: &mut std::collections::HashSet<u64>,
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
    use specmesh_kvcache::{BLOCK_TOKENS, Scope, block_hashes};
    use specmesh_proto::v1::kv_events_client::KvEventsClient;

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
    let start = |tenant: &str, salt: &str, tokens: &[u32]| v1::DraftStart {
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
    };
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
    let mut held = std::collections::HashSet::new();
    stored_blocks(&mut events, &mut held, blocks1).await;
    let scope = Scope::new("a", "", None);
    let expected: std::collections::HashSet<u64> = block_hashes(scope, &turn1, BLOCK_TOKENS)
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
            let start = v1::DraftStart {
                session_id: tenant.clone(),
                tenant,
                prompt_len: tokens.len() as u32,
                tokens,
                vocab_size: vocab,
                max_draft_tokens: 8,
                max_depth: 4,
                sources: v1::DraftSources::DraftModel as i32,
                ..Default::default()
            };
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
