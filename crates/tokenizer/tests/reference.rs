//! Checks the tokenizer built from the real SmolLM2 GGUF against ids and chat
//! renderings recorded from llama.cpp (`tests/fixtures/tokenizer_reference.json`).

use std::path::PathBuf;

use serde::Deserialize;
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

fn model_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SPECMESH_MODEL") {
        return PathBuf::from(path);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/specmesh/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn load_fixture() -> Fixture {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer_reference.json");
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
    let tokenizer = load_tokenizer();
    let mut failures = Vec::new();
    let total = fixture.cases.len();

    for case in &fixture.cases {
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
    // eos is <|im_end|> (2), which is also the template's end-of-turn token.
    assert_eq!(tokenizer.eos_token_ids(), &[2]);
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
