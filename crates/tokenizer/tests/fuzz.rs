//! Fuzzing the tokenizer's two inputs with proptest: text (anything a
//! caller can send, including special-token look-alikes and invalid
//! places to split) and GGUF tokenizer metadata (what a corrupt or foreign
//! model file carries). Every text encodes and decodes back to itself, any
//! id list decodes or is refused with an error, and metadata that is not a
//! tokenizer is an error naming what is wrong: never a panic.
//!
//! `PROPTEST_CASES=20000 cargo test --release -p specmesh-tokenizer --test fuzz`
//! is the longer run.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Value;
use common::*;
use proptest::prelude::*;
use specmesh_tokenizer::Tokenizer;

/// The real SmolLM2 tokenizer (byte-level BPE, 49 152 tokens).
fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = std::env::var_os("SPECMESH_MODEL")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME").unwrap_or_default();
                PathBuf::from(home).join(".cache/specmesh/models/SmolLM2-135M-Instruct.Q4_1.gguf")
            });
        Tokenizer::from_gguf_path(&path).unwrap_or_else(|e| {
            panic!(
                "{e}: run `cargo run --release -p specmesh-cli -- model fetch` ({})",
                path.display()
            )
        })
    })
}

/// Text as callers send it: any Unicode, mixed with the pieces that stress
/// a pre-tokenizer (digits, whitespace runs, CRLF, contractions) and with
/// special-token look-alikes.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => any::<String>(),
        2 => "[a-zA-Z0-9 ]{0,12}",
        1 => Just("<|im_start|>".to_owned()),
        1 => Just("<|im_end|>".to_owned()),
        1 => Just("<|im_start".to_owned()),
        1 => Just("\r\n\t  \u{a0}\u{3000}".to_owned()),
        1 => Just("'s'll'VE 123456789".to_owned()),
        1 => Just("🍕好é\u{200d}\u{fe0f}".to_owned()),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Byte-level BPE is lossless: whatever a caller sends comes back
    /// unchanged from decode, and streaming gives the same text.
    #[test]
    fn any_text_round_trips_through_the_real_tokenizer(s in text()) {
        let tok = smollm2();
        let ids = tok.encode(&s, false).unwrap();
        prop_assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        prop_assert_eq!(tok.decode(&ids, false).unwrap(), s.clone());
        let mut decoder = tok.incremental_decoder_with(false);
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(chunk) = decoder.push(id).unwrap() {
                streamed.push_str(&chunk);
            }
        }
        streamed.push_str(&decoder.finish());
        prop_assert_eq!(streamed, s.clone());
        // With special tokens parsed the ids differ, never the text.
        let ids = tok.encode(&s, true).unwrap();
        prop_assert_eq!(tok.decode(&ids, false).unwrap(), s);
    }

    /// Any id list, in the vocabulary or past it, decodes or is refused
    /// with an error naming the id; streaming agrees.
    #[test]
    fn any_ids_decode_or_are_refused(ids in proptest::collection::vec(
        prop_oneof![4 => 0u32..49_152, 1 => any::<u32>()], 0..64)
    ) {
        let tok = smollm2();
        let whole = tok.decode(&ids, false);
        let mut decoder = tok.incremental_decoder_with(false);
        let mut streamed = String::new();
        let mut refused = None;
        for &id in &ids {
            match decoder.push(id) {
                Ok(chunk) => streamed.push_str(chunk.as_deref().unwrap_or("")),
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        match whole {
            Ok(text) => {
                prop_assert!(refused.is_none());
                streamed.push_str(&decoder.finish());
                prop_assert_eq!(streamed, text);
            }
            Err(e) => {
                let bad = ids.iter().find(|&&id| id as usize >= tok.vocab_size()).unwrap();
                prop_assert!(e.to_string().contains(&bad.to_string()), "{}", e);
                prop_assert!(refused.is_some());
            }
        }
    }

    /// Tokenizer metadata with values replaced, arrays cut or padded with
    /// the wrong type, and keys dropped: a tokenizer or an error, and a
    /// tokenizer that loads still encodes and decodes any text.
    #[test]
    fn corrupt_tokenizer_metadata_is_an_error_not_a_panic(
        spm in any::<bool>(),
        edits in proptest::collection::vec((0usize..64, edit()), 1..4),
        s in text(),
    ) {
        let mut meta = if spm { spm_metadata().0 } else { gpt2_metadata() };
        let mut keys: Vec<String> = meta.keys().cloned().collect();
        keys.sort();
        for (k, e) in edits {
            let key = &keys[k % keys.len()];
            apply(&mut meta, key, e);
        }
        if let Ok(tok) = Tokenizer::from_gguf(&content(meta)) {
            if let Ok(ids) = tok.encode(&s, false) {
                let _ = tok.decode(&ids, false);
            }
            let _ = tok.encode_for_model(&s);
        }
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Drop,
    Replace(Value),
    Truncate(usize),
    PushWrongType,
    PushString(String),
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u64>().prop_map(Value::U64),
        any::<f32>().prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        any::<String>().prop_map(Value::String),
        Just(Value::Array(Vec::new())),
        proptest::collection::vec(any::<String>().prop_map(Value::String), 0..4)
            .prop_map(Value::Array),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        Just(Edit::Drop),
        value().prop_map(Edit::Replace),
        (0usize..300).prop_map(Edit::Truncate),
        Just(Edit::PushWrongType),
        any::<String>().prop_map(Edit::PushString),
    ]
}

fn apply(meta: &mut HashMap<String, Value>, key: &str, edit: Edit) {
    match edit {
        Edit::Drop => {
            meta.remove(key);
        }
        Edit::Replace(v) => {
            meta.insert(key.to_owned(), v);
        }
        Edit::Truncate(n) => {
            if let Some(Value::Array(a)) = meta.get_mut(key) {
                a.truncate(n);
            }
        }
        Edit::PushWrongType => {
            if let Some(Value::Array(a)) = meta.get_mut(key) {
                a.push(Value::Bool(true));
            }
        }
        Edit::PushString(s) => {
            if let Some(Value::Array(a)) = meta.get_mut(key) {
                a.push(Value::String(s));
            }
        }
    }
}
