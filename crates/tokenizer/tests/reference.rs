//! Checks the tokenizers built from the real GGUFs against ids and chat
//! renderings recorded from llama.cpp: SmolLM2 (`tokenizer_reference.json`)
//! and the Qwen2.5-Coder pair, which share one tokenizer
//! (`tokenizer_reference_qwen2.5-coder.json`: code, CJK, emoji, digits,
//! whitespace runs, ChatML with and without a system message).

use std::path::PathBuf;

use serde::Deserialize;
use specmesh_testing::model_path;
use specmesh_tokenizer::{ChatMessage, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    model_sha256: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Case {
    Raw {
        name: String,
        text: String,
        parse_special: bool,
        ids: Vec<u32>,
    },
    Chat {
        name: String,
        messages: Vec<ChatMessage>,
        rendered: String,
        ids: Vec<u32>,
    },
}

fn load_fixture() -> Fixture {
    load_named_fixture("tokenizer_reference.json")
}

fn load_named_fixture(file: &str) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad fixture {}: {e}", path.display()))
}

fn load_tokenizer() -> Tokenizer {
    let path = model_path();
    if !path.exists() {
        panic!(
            "model not found at {}: run `cargo run --release -p specmesh-cli -- model fetch`",
            path.display()
        );
    }
    Tokenizer::from_gguf_path(&path)
        .unwrap_or_else(|e| panic!("cannot build tokenizer from {}: {e}", path.display()))
}

#[test]
fn matches_llama_cpp_reference() {
    let fixture = load_fixture();
    assert!(
        fixture.model_sha256.starts_with("b179c952"),
        "fixture is for another model"
    );
    check(&load_tokenizer(), &fixture);
}

/// A catalog model's tokenizer (`specmesh model fetch NAME` caches it).
fn catalog_tokenizer(name: &str) -> Tokenizer {
    let path = specmesh_catalog::resolve(Some(std::path::Path::new(name)))
        .unwrap_or_else(|e| panic!("{e}"));
    Tokenizer::from_gguf_path(&path)
        .unwrap_or_else(|e| panic!("cannot build tokenizer from {}: {e}", path.display()))
}

#[test]
fn qwen_coder_tokenizers_match_llama_cpp_reference() {
    let fixture = load_named_fixture("tokenizer_reference_qwen2.5-coder.json");
    assert!(
        fixture.model_sha256.starts_with("1d961463"),
        "fixture is for another model"
    );
    for name in ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] {
        println!("{name}:");
        check(&catalog_tokenizer(name), &fixture);
    }
}

#[test]
fn qwen_coder_metadata_and_both_end_tokens() {
    for name in ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] {
        let t = catalog_tokenizer(name);
        assert_eq!(t.vocab_size(), 151_936, "{name}");
        assert!(!t.add_bos_token(), "{name}");
        // <|im_end|> ends a turn, <|endoftext|> a document: both stop.
        let mut eos = t.eos_token_ids().to_vec();
        eos.sort();
        assert_eq!(eos, [151_643, 151_645], "{name}");
        assert!(t.warnings().is_empty(), "{name}: {:?}", t.warnings());
        // ChatML with the template's default system prompt.
        let rendered = t
            .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
            .unwrap();
        assert!(
            rendered.starts_with("<|im_start|>system\nYou are Qwen"),
            "{rendered:?}"
        );
        assert!(rendered.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
    }
}

fn check(tokenizer: &Tokenizer, fixture: &Fixture) {
    let mut failures = Vec::new();
    let total = fixture.cases.len();

    for case in fixture.cases.iter() {
        match case {
            Case::Raw {
                name,
                text,
                parse_special,
                ids,
            } => {
                let got = tokenizer.encode(text, *parse_special).unwrap();
                if &got != ids {
                    failures.push(format!(
                        "{name}: encode {text:?}\n  want {ids:?}\n  got  {got:?}"
                    ));
                    continue;
                }
                let decoded = tokenizer.decode(ids, false).unwrap();
                if &decoded != text {
                    failures.push(format!("{name}: decode gave {decoded:?}, want {text:?}"));
                    continue;
                }
                // Streaming must agree with the whole-sequence decode.
                let mut stream = tokenizer.incremental_decoder();
                let mut streamed = String::new();
                for &id in ids {
                    streamed.push_str(&stream.push(id).unwrap().unwrap_or_default());
                }
                streamed.push_str(&stream.finish());
                if &streamed != text {
                    failures.push(format!("{name}: incremental decode gave {streamed:?}"));
                }
            }
            Case::Chat {
                name,
                messages,
                rendered,
                ids,
            } => {
                let got = tokenizer.apply_chat_template(messages, true).unwrap();
                if &got != rendered {
                    failures.push(format!(
                        "{name}: rendered\n  want {rendered:?}\n  got  {got:?}"
                    ));
                    continue;
                }
                let got_ids = tokenizer.encode(&got, true).unwrap();
                if &got_ids != ids {
                    failures.push(format!("{name}: ids\n  want {ids:?}\n  got  {got_ids:?}"));
                }
            }
        }
    }

    println!(
        "{} of {total} reference cases matched",
        total - failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm_metadata() {
    let tokenizer = load_tokenizer();
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert!(!tokenizer.add_bos_token());
    // eos is <|im_end|> (2), which is also the template's end-of-turn
    // token; <|endoftext|> (0) ends a generation too, as in llama.cpp.
    assert_eq!(tokenizer.eos_token_ids(), &[2, 0]);
    assert!(tokenizer.is_special(0) && tokenizer.is_special(1) && !tokenizer.is_special(17));
    assert!(
        tokenizer.warnings().is_empty(),
        "{:?}",
        tokenizer.warnings()
    );
    assert_eq!(tokenizer.token_piece(1).as_deref(), Some("<|im_start|>"));
    assert_eq!(
        tokenizer.encode_for_model("Hello").unwrap(),
        tokenizer.encode("Hello", true).unwrap()
    );
    let ids = tokenizer
        .encode("<|im_start|>user\nhi<|im_end|>", true)
        .unwrap();
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "user\nhi");
}
