//! The model drafter through the service (`$SPECMESH_MODEL`, else the
//! `specmesh model fetch` cache). A missing model fails the test: CI always
//! has it, and a skipped test proves nothing.

use std::time::Duration;

use specmesh_drafter::DraftModelConfig;
use specmesh_model::{Block, LoadOptions, Model};
use specmesh_proto::v1;
use specmesh_tokenizer::Tokenizer;

use crate::common::{Drafter, Stream, config, model_config, root_child};
use specmesh_testing::model_path;

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
    assert_eq!(tree.drafted_by, v1::DraftSources::DraftModel as i32);
    // A model forward ran for it: the verifier prices that drafting.
    assert!(tree.draft_micros > 0, "the drafting is measured: {tree:?}");
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
        tree = stream.verified(step, path, committed, 1).await;
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
        tree = stream.verified(step, path, committed, 1).await;
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
