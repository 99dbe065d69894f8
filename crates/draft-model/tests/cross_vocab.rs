//! Drafting through text between two real vocabularies: SmolLM2-135M's
//! (49k tokens) and Qwen2.5-Coder's (151k), from the `specmesh model fetch`
//! cache (`$SPECMESH_MODEL` for SmolLM2, `$SPECMESH_QWEN_TOKENIZER` for any
//! Qwen2.5-Coder GGUF). A missing model fails the test: CI fetches both.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use specmesh_draft::{DraftContext, Drafter, TreeLimits};
use specmesh_draft_model::{
    BridgeError, CrossVocabDrafter, DraftOptions, EXTRA_LEVELS, ModelDrafter, TextBridge, TextMap,
};
use specmesh_model::{LoadOptions, Model};
use specmesh_sampling::SamplingParams;
use specmesh_tokenizer::{ChatMessage, Tokenizer};
use specmesh_tree::{TokenTree, TreeBuilder};

fn cached(env: &str, file: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        home.join(".cache/specmesh/models").join(file)
    });
    assert!(
        path.exists(),
        "{} not found (run `specmesh model fetch smollm2-135m qwen2.5-coder-0.5b`)",
        path.display()
    );
    path
}

fn smol_path() -> PathBuf {
    cached("SPECMESH_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn smol() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_model_path(&smol_path()).unwrap())
}

fn qwen() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let p = cached(
            "SPECMESH_QWEN_TOKENIZER",
            "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        );
        Tokenizer::from_model_path(&p).unwrap()
    })
}

/// Qwen (target) drafted for by SmolLM2 (draft).
fn bridge() -> Arc<TextBridge> {
    Arc::new(TextBridge::new(qwen().clone(), smol().clone(), "qwen", "smollm2").unwrap())
}

fn conversation() -> String {
    qwen()
        .apply_chat_template(
            &[ChatMessage::new(
                "user",
                "Write a Python function that adds two numbers, naïvely — 数据 🙂",
            )],
            true,
        )
        .unwrap()
}

fn bytes(tok: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&i| tok.token_bytes(i).unwrap().to_vec())
        .collect()
}

#[test]
fn the_pair_round_trips_both_ways_and_shares_the_chat_markers() {
    let b = bridge();
    assert!(b.shared_markers());
    let back = TextBridge::new(smol().clone(), qwen().clone(), "smollm2", "qwen").unwrap();
    assert!(back.shared_markers());
}

#[test]
fn the_map_follows_a_growing_context_as_a_whole_encoding_would() {
    let b = bridge();
    let text = format!(
        "{}Sure! Here is the function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\
         It returns the sum — naïve but fine 🙂.",
        conversation()
    );
    let ids = qwen().encode(&text, true).unwrap();
    let mut map = TextMap::default();
    // The prompt at once, then one token per step, as a session commits.
    let prompt = ids.len() / 3;
    let mut whole_steps = 0;
    for end in prompt..=ids.len() {
        let complete = map.sync(&b, &ids[..end]);
        let seen = bytes(qwen(), &ids[..end]);
        let drafted = bytes(smol(), map.draft_tokens());
        if complete {
            whole_steps += 1;
            assert_eq!(drafted, seen, "after {end} target tokens");
        } else {
            // Only inside a multi-byte character: the draft covers the
            // whole characters before it.
            assert!(seen.starts_with(&drafted) && seen.len() - drafted.len() < 4);
        }
    }
    assert!(whole_steps > ids.len() - prompt - 8, "{whole_steps}");
    // Incremental re-encoding gives the tokens a whole encoding gives.
    assert_eq!(map.draft_tokens(), smol().encode(&text, true).unwrap());
    // A context that changes under the map (another start) is followed too.
    let other = qwen().encode(&conversation(), true).unwrap();
    assert!(map.sync(&b, &other));
    assert_eq!(
        map.draft_tokens(),
        smol().encode(&conversation(), true).unwrap()
    );
}

/// A draft chain after the context's last draft token.
fn draft_chain(root: u32, continuations: &[&str]) -> TokenTree {
    let mut builder = TreeBuilder::new(root, TreeLimits::new(64, 32, 49152)).unwrap();
    for (i, text) in continuations.iter().enumerate() {
        let mut parent = 0;
        for (j, id) in smol().encode(text, true).unwrap().into_iter().enumerate() {
            parent = match builder.child_with(parent, id) {
                Some(c) => c,
                None => builder
                    .push(parent, id, 0.9 - 0.1 * i as f32 - 0.01 * j as f32)
                    .unwrap(),
            };
        }
    }
    builder.build()
}

fn target_paths(tree: &TokenTree) -> Vec<Vec<u32>> {
    let mut paths: Vec<Vec<u32>> = tree
        .leaves()
        .filter(|&l| l != 0)
        .map(|l| tree.path_tokens(l)[1..].to_vec())
        .collect();
    paths.sort();
    paths
}

#[test]
fn a_draft_path_becomes_the_target_tokens_its_text_covers() {
    let b = bridge();
    let limits = TreeLimits::new(64, 32, 151936);
    let root = 151644;
    let tree = draft_chain(7, &["def add(a, b):\n    return a + b"]);
    let (target, lost) = b.to_target(&tree, root, limits);
    let mut want = qwen()
        .encode("def add(a, b):\n    return a + b", true)
        .unwrap();
    // The last token (` b`) may continue (` bias`): dropped.
    want.pop();
    assert_eq!(lost, 1);
    assert_eq!(target.root_token(), root);
    assert_eq!(target_paths(&target), vec![want]);
    // A path that ends on the end of the turn keeps every token.
    let tree = draft_chain(7, &["Done.<|im_end|>"]);
    let (target, lost) = b.to_target(&tree, root, limits);
    assert_eq!(lost, 0);
    assert_eq!(
        target_paths(&target),
        vec![qwen().encode("Done.<|im_end|>", true).unwrap()]
    );
}

#[test]
fn paths_share_their_common_target_prefix_and_respect_the_limits() {
    let b = bridge();
    let tree = draft_chain(7, &["total = a + b\n", "total = a - b\n"]);
    let (target, _) = b.to_target(&tree, 151644, TreeLimits::new(64, 32, 151936));
    let paths = target_paths(&target);
    assert_eq!(paths.len(), 2, "{paths:?}");
    let common = paths[0]
        .iter()
        .zip(&paths[1])
        .take_while(|(a, b)| a == b)
        .count();
    assert!(common >= 3, "{paths:?}");
    // One node per distinct prefix: the shared part is in the tree once.
    assert_eq!(target.draft_len(), paths[0].len() + paths[1].len() - common);
    let (small, _) = b.to_target(&tree, 151644, TreeLimits::new(3, 32, 151936));
    assert!(small.len() <= 3);
    let (shallow, _) = b.to_target(&tree, 151644, TreeLimits::new(64, 2, 151936));
    assert!(shallow.max_depth() <= 2);
}

#[test]
fn the_draft_model_drafts_target_trees_that_greedy_smollm2_would_write() {
    let model = Arc::new(Model::load(&smol_path(), &LoadOptions::default()).unwrap());
    let inner = ModelDrafter::new(
        model,
        SamplingParams::greedy(),
        49152,
        DraftOptions::default(),
    )
    .unwrap();
    let mut d = CrossVocabDrafter::new(inner, bridge());
    let context = qwen()
        .encode(
            &format!("{}def add(a, b):\n    return", conversation()),
            true,
        )
        .unwrap();
    let limits = TreeLimits::new(16, 8, 151936);
    let tree = d.propose(&DraftContext {
        tokens: &context,
        prompt_len: context.len(),
        limits,
    });
    assert_eq!(tree.root_token(), *context.last().unwrap());
    assert!(tree.draft_len() > 0 && tree.len() <= 16 && tree.max_depth() <= 8);
    assert!(!tree.has_draft_dists());
    // Every path is text that follows the context.
    for path in target_paths(&tree) {
        let text = String::from_utf8_lossy(&bytes(qwen(), &path)).into_owned();
        assert!(!text.is_empty());
    }
    let stats = d.stats();
    assert!(stats.retokenize_nanos > 0 && stats.proposes == 1);
    // The next step, one target token later, reuses the draft's cache.
    let mut longer = context.clone();
    longer.push(tree.token(1));
    let before = d.stats().context_tokens;
    d.propose(&DraftContext {
        tokens: &longer,
        prompt_len: context.len(),
        limits,
    });
    assert!(d.stats().context_tokens - before < 12, "{:?}", d.stats());
    // A one-level budget still drafts its level: the draft model runs one
    // level deeper than asked, since a path's last target token is
    // dropped.
    let forwards = d.stats().forwards;
    let one = d.propose(&DraftContext {
        tokens: &longer,
        prompt_len: context.len(),
        limits: TreeLimits::new(2, 1, 151936),
    });
    assert_eq!((one.draft_len(), one.max_depth()), (1, 1), "{one:?}");
    assert_eq!(d.stats().forwards - forwards, 1 + EXTRA_LEVELS as u64);
}

#[test]
fn a_draft_model_without_a_chat_template_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let mut vocab = serde_json::Map::new();
    let byte_char = |b: u8| -> char {
        // GPT-2's byte-to-unicode map.
        let printable =
            (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        if printable {
            b as char
        } else {
            let shifted = (0u8..=255)
                .filter(|c| {
                    !((b'!'..=b'~').contains(c)
                        || (0xA1..=0xAC).contains(c)
                        || (0xAE..=0xFF).contains(c))
                })
                .position(|c| c == b)
                .unwrap();
            char::from_u32(256 + shifted as u32).unwrap()
        }
    };
    for b in 0u8..=255 {
        vocab.insert(byte_char(b).to_string(), b.into());
    }
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
    let plain = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(!plain.has_chat_template());
    let err = TextBridge::new(qwen().clone(), plain, "qwen-target", "base-draft").unwrap_err();
    assert!(matches!(err, BridgeError::NoChatTemplate { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("qwen-target") && msg.contains("base-draft"),
        "{msg}"
    );
}
