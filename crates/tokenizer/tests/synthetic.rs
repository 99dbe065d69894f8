//! Encoding, decoding and streaming on tiny synthetic vocabularies (no model
//! file needed): GGUF byte-level BPE, GGUF SentencePiece, and a Hugging Face
//! tokenizer directory.

mod common;

use common::*;
use specmesh_tokenizer::{ChatMessage, Tokenizer};

fn gpt2() -> Tokenizer {
    Tokenizer::from_gguf(&content(gpt2_metadata())).unwrap()
}

fn byte_ids(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// Concatenation of every streamed chunk plus the final flush.
fn stream(tokenizer: &Tokenizer, ids: &[u32], skip_special: bool) -> (Vec<Option<String>>, String) {
    let mut decoder = tokenizer.incremental_decoder_with(skip_special);
    let chunks: Vec<Option<String>> = ids.iter().map(|&id| decoder.push(id).unwrap()).collect();
    let mut all: String = chunks.iter().flatten().map(String::as_str).collect();
    all.push_str(&decoder.finish());
    (chunks, all)
}

#[test]
fn gpt2_merges_and_digit_splitting() {
    let tok = gpt2();
    assert_eq!(tok.vocab_size(), 265);
    assert_eq!(tok.encode("hello", false).unwrap(), vec![HELLO]);
    // "Ġhello" exists, so " hello" is one pre-token and one token.
    assert_eq!(
        tok.encode("hello hello", false).unwrap(),
        vec![HELLO, HELLO + 2]
    );
    // smollm splits every digit before BPE, so the "1 2" merge never applies.
    assert_eq!(tok.encode("12", false).unwrap(), byte_ids("12"));
    assert_eq!(tok.decode(&[TWELVE], false).unwrap(), "12");
    assert!(tok.warnings().is_empty());
    assert!(tok.encode("", true).unwrap().is_empty());
}

#[test]
fn special_tokens_follow_parse_special() {
    let tok = gpt2();
    let text = "<|im_start|>hello<|im_end|>";
    assert_eq!(
        tok.encode(text, true).unwrap(),
        vec![IM_START, HELLO, IM_END]
    );
    let plain = tok.encode(text, false).unwrap();
    assert!(!plain.contains(&IM_START) && !plain.contains(&IM_END));
    assert_eq!(tok.decode(&plain, false).unwrap(), text);
    // User-defined tokens are matched even without special parsing (llama.cpp).
    assert_eq!(tok.encode("<tool>", false).unwrap(), vec![TOOL]);
    assert_eq!(
        tok.decode(&[IM_START, HELLO, IM_END], true).unwrap(),
        "hello"
    );
    assert_eq!(
        tok.decode(&[IM_START, HELLO, TOOL], false).unwrap(),
        "<|im_start|>hello<tool>"
    );
    assert!(tok.is_special(IM_START) && !tok.is_special(TOOL) && !tok.is_special(HELLO));
    assert!(!tok.is_special(100_000));
}

#[test]
fn gpt2_metadata_fields() {
    let tok = gpt2();
    assert_eq!(tok.bos_token_id(), Some(IM_START));
    assert_eq!(tok.eos_token_ids(), &[IM_END]);
    assert_eq!(tok.token_piece(HELLO + 2).as_deref(), Some("Ġhello"));
    assert_eq!(tok.token_piece(9999), None);
    assert_eq!(tok.token_id("hello"), Some(HELLO));
    assert_eq!(tok.encode_for_model("hello").unwrap(), vec![HELLO]);
    let rendered = tok
        .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn incremental_decoder_holds_back_split_characters() {
    let tok = gpt2();
    // 🍕 is four bytes, 好 three: every byte is its own token here.
    let ids = byte_ids("a🍕好!");
    let (chunks, all) = stream(&tok, &ids, false);
    assert_eq!(all, tok.decode(&ids, false).unwrap());
    assert_eq!(all, "a🍕好!");
    let expected: Vec<Option<String>> = vec![
        Some("a".into()),
        None,
        None,
        None,
        Some("🍕".into()),
        None,
        None,
        Some("好".into()),
        Some("!".into()),
    ];
    assert_eq!(chunks, expected);
}

#[test]
fn incremental_decoder_replaces_invalid_bytes_like_decode() {
    let tok = gpt2();
    let cases: Vec<Vec<u32>> = vec![
        vec![0xF0, 0x9F, u32::from(b'a')],  // truncated emoji then ASCII
        vec![0xF0, 0x9F],                   // truncated emoji at the end
        vec![0x80, 0xBF, u32::from(b'x')],  // lone continuation bytes
        vec![0xE5, 0xF0, 0x9F, 0x8D, 0x95], // truncated CJK then a whole emoji
        vec![0xED, 0xA0, 0x80],             // encoded surrogate (invalid)
        vec![0xFF, IM_START, 0xE5, 0xA5, 0xBD],
    ];
    for ids in cases {
        for skip in [false, true] {
            let (chunks, all) = stream(&tok, &ids, skip);
            assert_eq!(all, tok.decode(&ids, skip).unwrap(), "{ids:?} skip={skip}");
            for chunk in chunks.iter().flatten() {
                assert!(!chunk.is_empty());
            }
        }
    }
    let mut decoder = tok.incremental_decoder();
    assert_eq!(decoder.push(0xF0).unwrap(), None);
    assert!(decoder.has_pending());
    assert_eq!(decoder.finish(), "\u{FFFD}");
    assert!(!decoder.has_pending());
}

#[test]
fn incremental_decoder_matches_decode_on_pseudo_random_streams() {
    let tok = gpt2();
    let mut state: u64 = 0x5eed;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u32
    };
    for _ in 0..500 {
        let len = next() % 12;
        let ids: Vec<u32> = (0..len).map(|_| next() % tok.vocab_size() as u32).collect();
        for skip in [false, true] {
            assert_eq!(
                stream(&tok, &ids, skip).1,
                tok.decode(&ids, skip).unwrap(),
                "{ids:?}"
            );
        }
    }
}

#[test]
fn unknown_ids_are_errors_not_panics() {
    let tok = gpt2();
    let err = tok.decode(&[HELLO, 70_000], false).unwrap_err().to_string();
    assert_eq!(
        err,
        "token id 70000 is out of range for a vocabulary of 265 tokens"
    );
    assert!(tok.incremental_decoder().push(70_000).is_err());
}

#[test]
fn sentencepiece_bpe_with_scores_and_byte_fallback() {
    let (meta, vocab) = spm_metadata();
    let tok = Tokenizer::from_gguf(&content(meta)).unwrap();
    let hello = vocab.id("▁hello");
    assert_eq!(tok.encode("hello", true).unwrap(), vec![hello]);
    // "w" is not in the vocabulary: it falls back to its byte token.
    let ids = tok.encode("hello w", true).unwrap();
    assert_eq!(ids, vec![hello, vocab.id("▁"), vocab.id("<0x77>")]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "hello w");
    // SentencePiece models add BOS by default, and <s> parses as a special token.
    assert_eq!(tok.encode_for_model("hello").unwrap(), vec![1, hello]);
    assert_eq!(tok.encode("<s>hello", true).unwrap(), vec![1, hello]);
    assert_eq!(tok.decode(&[1, hello], true).unwrap(), "hello");
    // A multi-byte character through byte fallback streams intact.
    let ids = tok.encode("hello 好", true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "hello 好");
    assert_eq!(stream(&tok, &ids, false).1, "hello 好");
    assert_eq!(stream(&tok, &[1, hello], true).1, "hello");
    assert!(!tok.has_chat_template());
}

#[test]
fn gguf_file_on_disk_reads_only_metadata() {
    let meta = gpt2_metadata();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let mut file = std::fs::File::create(&path).unwrap();
    let entries: Vec<(&str, &candle_core::quantized::gguf_file::Value)> =
        meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    candle_core::quantized::gguf_file::write(&mut file, &entries, &[]).unwrap();
    drop(file);
    let tok = Tokenizer::from_gguf_path(&path).unwrap();
    assert_eq!(tok.encode("hello", true).unwrap(), vec![HELLO]);
}

#[test]
fn hugging_face_directory() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(dir.path());
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 262);
    assert_eq!(tok.encode("hello", true).unwrap(), vec![259]);
    assert_eq!(
        tok.encode("<|im_start|>hello", true).unwrap(),
        vec![260, 259]
    );
    assert_ne!(tok.encode("<|im_start|>", false).unwrap(), vec![260]);
    assert_eq!(tok.bos_token_id(), Some(260));
    assert!(!tok.add_bos_token());
    // eos from tokenizer_config.json plus generation_config.json's list.
    assert_eq!(tok.eos_token_ids(), &[261, 0]);
    assert!(tok.is_special(260) && !tok.is_special(259));
    let ids = byte_ids("é🍕");
    assert_eq!(tok.decode(&ids, false).unwrap(), "é🍕");
    assert_eq!(stream(&tok, &ids, false).1, "é🍕");
    let rendered = tok
        .apply_chat_template(&[ChatMessage::new("user", "hi")], false)
        .unwrap();
    assert_eq!(rendered, "<|im_start|>user\nhi<|im_end|>\n");
}
