//! Tiny synthetic vocabularies (GGUF metadata maps and a Hugging Face
//! directory) so that tokenizer behaviour can be tested without a model file.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};

/// GPT-2's byte-to-character map (`bytes_to_unicode`).
pub fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let offset = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(256 + offset).unwrap()
}

pub fn strings(items: &[&str]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|s| Value::String((*s).to_owned()))
            .collect(),
    )
}

pub struct Vocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
}

impl Vocab {
    pub fn push(&mut self, token: &str, ty: i32) -> u32 {
        self.tokens.push(token.to_owned());
        self.types.push(ty);
        (self.tokens.len() - 1) as u32
    }
    pub fn id(&self, token: &str) -> u32 {
        self.tokens.iter().position(|t| t == token).unwrap() as u32
    }
}

/// Ids of the GPT-2 test vocabulary: bytes are `0..256` in byte order.
pub const HELLO: u32 = 259;
pub const TWELVE: u32 = 260;
pub const IM_START: u32 = 262;
pub const IM_END: u32 = 263;
pub const TOOL: u32 = 264;

pub const TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A byte-level vocabulary: all 256 bytes, "he", "ll", "hell", "hello",
/// "12", "Ġhello", two control tokens and one user-defined token.
pub fn gpt2_metadata() -> HashMap<String, Value> {
    let mut v = Vocab {
        tokens: Vec::new(),
        types: Vec::new(),
    };
    for b in 0u8..=255 {
        v.push(&byte_char(b).to_string(), 1);
    }
    v.push("he", 1);
    v.push("ll", 1);
    v.push("hell", 1);
    assert_eq!(v.push("hello", 1), HELLO);
    assert_eq!(v.push("12", 1), TWELVE);
    v.push("Ġhello", 1);
    assert_eq!(v.push("<|im_start|>", 3), IM_START);
    assert_eq!(v.push("<|im_end|>", 3), IM_END);
    assert_eq!(v.push("<tool>", 4), TOOL);

    let mut m = HashMap::new();
    m.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    m.insert("tokenizer.ggml.pre".into(), Value::String("smollm".into()));
    let tokens: Vec<&str> = v.tokens.iter().map(String::as_str).collect();
    m.insert("tokenizer.ggml.tokens".into(), strings(&tokens));
    m.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(v.types.iter().map(|t| Value::I32(*t)).collect()),
    );
    m.insert(
        "tokenizer.ggml.merges".into(),
        strings(&["h e", "l l", "he ll", "hell o", "1 2", "Ġ hello"]),
    );
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(IM_START));
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(IM_END));
    m.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(false));
    m.insert(
        "tokenizer.chat_template".into(),
        Value::String(TEMPLATE.into()),
    );
    m
}

/// A SentencePiece ("llama") vocabulary with byte fallback and scores.
pub fn spm_metadata() -> (HashMap<String, Value>, Vocab) {
    let mut v = Vocab {
        tokens: Vec::new(),
        types: Vec::new(),
    };
    let mut scores = Vec::new();
    let mut add = |v: &mut Vocab, t: &str, ty: i32, score: f32| {
        v.push(t, ty);
        scores.push(Value::F32(score));
    };
    add(&mut v, "<unk>", 2, 0.0);
    add(&mut v, "<s>", 3, 0.0);
    add(&mut v, "</s>", 3, 0.0);
    for b in 0u8..=255 {
        add(&mut v, &format!("<0x{b:02X}>"), 6, 0.0);
    }
    for (i, t) in [
        "▁", "h", "e", "l", "o", "▁h", "he", "ll", "▁he", "▁hell", "▁hello",
    ]
    .iter()
    .enumerate()
    {
        add(&mut v, t, 1, -(i as f32));
    }
    let mut m = HashMap::new();
    m.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
    let tokens: Vec<&str> = v.tokens.iter().map(String::as_str).collect();
    m.insert("tokenizer.ggml.tokens".into(), strings(&tokens));
    m.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(v.types.iter().map(|t| Value::I32(*t)).collect()),
    );
    m.insert("tokenizer.ggml.scores".into(), Value::Array(scores));
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1));
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
    m.insert("tokenizer.ggml.unknown_token_id".into(), Value::U32(0));
    (m, v)
}

pub fn content(metadata: HashMap<String, Value>) -> Content {
    Content {
        magic: VersionedMagic::GgufV3,
        metadata,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    }
}

/// Write a tokenizer.json / tokenizer_config.json / generation_config.json
/// trio describing the same byte-level vocabulary as [`gpt2_metadata`].
pub fn write_hf_dir(dir: &Path) {
    let mut vocab = serde_json::Map::new();
    for b in 0u8..=255 {
        vocab.insert(byte_char(b).to_string(), b.into());
    }
    for (i, t) in ["he", "ll", "hell", "hello", "<|im_start|>", "<|im_end|>"]
        .iter()
        .enumerate()
    {
        vocab.insert((*t).to_owned(), (256 + i).into());
    }
    let added = |id: usize, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(260, "<|im_start|>"), added(261, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": ["h e", "l l", "he ll", "hell o"]}
    });
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "chat_template": TEMPLATE,
    });
    let generation = serde_json::json!({"eos_token_id": [261, 0]});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("generation_config.json"), generation.to_string()).unwrap();
}
