//! `specmesh tokenize` against the ids llama.cpp produced for the same model
//! (the tokenizer crate's fixture `tokenizer_reference.json`).
//!
//! The CLI encodes like the model is fed: special tokens in the text are
//! parsed and a BOS is added only if the model asks for one (SmolLM2 does
//! not). So the fixture's raw cases with `parse_special: true` must match
//! exactly, as must the chat case with a single user message under `--chat`.

use serde::Deserialize;
use specmesh_e2e::{model_path, run, stdout_ok};

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
        messages: Vec<Message>,
        ids: Vec<u32>,
    },
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct Output {
    ids: Vec<u32>,
    pieces: Vec<String>,
}

fn fixture() -> Fixture {
    let raw = include_str!("../../crates/tokenizer/tests/fixtures/tokenizer_reference.json");
    let f: Fixture = serde_json::from_str(raw).expect("parsing tokenizer_reference.json");
    // The fixture was recorded from this exact file (the `model fetch` hash).
    assert_eq!(
        f.model_sha256,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    f
}

fn tokenize(extra: &[&str], text: &str) -> Output {
    let model = model_path();
    let mut args = vec!["tokenize", "--json", "--model", model.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(text);
    let stdout = stdout_ok(&run(args));
    let out: Output =
        serde_json::from_str(stdout.trim_end()).expect("tokenize --json prints one JSON object");
    assert_eq!(out.ids.len(), out.pieces.len(), "one piece per id");
    out
}

#[test]
fn raw_text_ids_match_llama_cpp_with_special_tokens_parsed() {
    let mut checked = Vec::new();
    for case in fixture().cases {
        let Case::Raw {
            name,
            text,
            parse_special: true,
            ids,
        } = case
        else {
            continue;
        };
        if text.is_empty() {
            continue;
        }
        assert_eq!(tokenize(&[], &text).ids, ids, "case `{name}`: {text:?}");
        checked.push(name);
    }
    assert!(
        checked.len() >= 5,
        "too few fixture cases checked: {checked:?}"
    );
}

#[test]
fn plain_text_ids_match_llama_cpp() {
    // Without special-token markup, parsing specials changes nothing, so the
    // `parse_special: false` cases are valid references too. A sample of
    // them covers whitespace, unicode, digits and code.
    let names = [
        "ascii_sentence",
        "leading_trailing_multi_space",
        "crlf",
        "chinese",
        "emoji_zwj_flags",
        "numbers_grouped",
        "code_rust",
    ];
    let mut checked = 0;
    for case in fixture().cases {
        let Case::Raw {
            name, text, ids, ..
        } = case
        else {
            continue;
        };
        if !names.contains(&name.as_str()) {
            continue;
        }
        assert!(
            !text.contains("<|"),
            "case `{name}` has special-token markup"
        );
        assert_eq!(tokenize(&[], &text).ids, ids, "case `{name}`: {text:?}");
        checked += 1;
    }
    assert_eq!(checked, names.len(), "fixture cases missing");
}

#[test]
fn chat_ids_match_llama_cpp_for_a_single_user_message() {
    let mut checked = 0;
    for case in fixture().cases {
        let Case::Chat {
            name,
            messages,
            ids,
        } = case
        else {
            continue;
        };
        let [Message { role, content }] = messages.as_slice() else {
            continue;
        };
        if role != "user" {
            continue;
        }
        assert_eq!(
            tokenize(&["--chat"], content).ids,
            ids,
            "chat case `{name}`"
        );
        checked += 1;
    }
    assert!(
        checked >= 1,
        "the fixture has no single-user-message chat case"
    );
}

#[test]
fn pieces_spell_the_text() {
    // Byte-level BPE pieces use `Ġ` for a space; joined, they are the text.
    let out = tokenize(&[], "The quick brown fox");
    assert_eq!(out.pieces.concat().replace('Ġ', " "), "The quick brown fox");
}
