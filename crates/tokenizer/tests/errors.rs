//! Bad metadata, bad files and bad templates produce clear errors (never
//! panics); chat templates render with Hugging Face's Jinja semantics.

mod common;

use candle_core::quantized::gguf_file::Value;
use common::*;
use specmesh_tokenizer::{ChatMessage, Tokenizer, TokenizerError};

fn build(
    edit: impl FnOnce(&mut std::collections::HashMap<String, Value>),
) -> Result<Tokenizer, TokenizerError> {
    let mut meta = gpt2_metadata();
    edit(&mut meta);
    Tokenizer::from_gguf(&content(meta))
}

fn error(edit: impl FnOnce(&mut std::collections::HashMap<String, Value>)) -> String {
    build(edit).unwrap_err().to_string()
}

fn with_template(template: &str) -> Tokenizer {
    build(|m| {
        m.insert(
            "tokenizer.chat_template".into(),
            Value::String(template.into()),
        );
    })
    .unwrap()
}

fn user(content: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", content)]
}

#[test]
fn missing_keys_are_named() {
    let err = error(|m| {
        m.remove("tokenizer.ggml.model");
    });
    assert_eq!(err, "gguf metadata key `tokenizer.ggml.model` is missing");
    let err = error(|m| {
        m.remove("tokenizer.ggml.tokens");
    });
    assert_eq!(err, "gguf metadata key `tokenizer.ggml.tokens` is missing");
    let err = error(|m| {
        m.remove("tokenizer.ggml.merges");
    });
    assert_eq!(err, "gguf metadata key `tokenizer.ggml.merges` is missing");
}

#[test]
fn wrong_types_and_values_are_named() {
    let err = error(|m| {
        m.insert("tokenizer.ggml.model".into(), Value::U32(2));
    });
    assert_eq!(
        err,
        "gguf metadata key `tokenizer.ggml.model` has type u32, expected string"
    );
    let err = error(|m| {
        m.insert(
            "tokenizer.ggml.tokens".into(),
            Value::Array(vec![Value::I32(1)]),
        );
    });
    assert_eq!(
        err,
        "gguf metadata key `tokenizer.ggml.tokens` is invalid: element 0 has type i32, expected string"
    );
    let err = error(|m| {
        m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(5000));
    });
    assert!(
        err.contains("`tokenizer.ggml.bos_token_id`") && err.contains("5000"),
        "{err}"
    );
    let err = error(|m| {
        m.insert("tokenizer.ggml.merges".into(), strings(&["h e", "nospace"]));
    });
    assert!(
        err.contains("`tokenizer.ggml.merges`") && err.contains("element 1 `nospace`"),
        "{err}"
    );
    let err = error(|m| {
        m.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(vec![Value::I32(1); 3]),
        );
    });
    assert!(
        err.contains("has 3 entries but `tokenizer.ggml.tokens` has 265"),
        "{err}"
    );
    // -1 is the "no such token" sentinel, not an error.
    let tok = build(|m| {
        m.insert("tokenizer.ggml.padding_token_id".into(), Value::I32(-1));
    });
    assert!(tok.is_ok());
}

#[test]
fn bad_token_type_is_reported_with_its_index() {
    let err = build(|m| {
        if let Some(Value::Array(types)) = m.get_mut("tokenizer.ggml.token_type") {
            types[7] = Value::I32(9);
        }
    })
    .unwrap_err();
    assert!(matches!(
        err,
        TokenizerError::InvalidTokenType { index: 7, value: 9 }
    ));
    assert!(err.to_string().contains("value 9 at index 7"), "{err}");
}

#[test]
fn unsupported_model_names_the_value() {
    let err = error(|m| {
        m.insert("tokenizer.ggml.model".into(), Value::String("bert".into()));
    });
    assert!(
        err.starts_with("unsupported tokenizer.ggml.model `bert`"),
        "{err}"
    );
}

#[test]
fn unknown_pre_tokenizer_falls_back_with_a_warning() {
    let tok = build(|m| {
        m.insert("tokenizer.ggml.pre".into(), Value::String("mystery".into()));
    })
    .unwrap();
    assert_eq!(tok.warnings().len(), 1);
    assert!(tok.warnings()[0].contains("`mystery`"));
    // GPT-2 splitting keeps digit runs together, so the "1 2" merge applies.
    assert_eq!(tok.encode("12", false).unwrap(), vec![TWELVE]);
}

#[test]
fn add_bos_without_a_bos_id_is_an_error() {
    let err = error(|m| {
        m.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true));
        m.remove("tokenizer.ggml.bos_token_id");
    });
    assert!(err.contains("add_bos_token"), "{err}");
}

#[test]
fn bad_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let err = Tokenizer::from_gguf_path(&missing).unwrap_err().to_string();
    assert!(
        err.starts_with("failed to read") && err.contains("nope.gguf"),
        "{err}"
    );
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a gguf file").unwrap();
    let err = Tokenizer::from_gguf_path(&garbage).unwrap_err().to_string();
    assert!(
        err.contains("is not a readable GGUF file") && err.contains("garbage.gguf"),
        "{err}"
    );
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::write(dir.path().join("tokenizer.json"), b"{ not json").unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.starts_with("invalid ") && err.contains("not valid json"),
        "{err}"
    );
}

#[test]
fn missing_template_is_a_clear_error() {
    let tok = build(|m| {
        m.remove("tokenizer.chat_template");
    })
    .unwrap();
    assert!(!tok.has_chat_template());
    let err = tok
        .apply_chat_template(&user("hi"), true)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "the model has no chat template (gguf metadata key `tokenizer.chat_template` is missing)"
    );
}

#[test]
fn template_errors_carry_the_cause() {
    let tok = with_template("{{ raise_exception('Conversation roles must alternate') }}");
    let err = tok
        .apply_chat_template(&user("hi"), true)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chat template failed to render"), "{err}");
    assert!(err.contains("Conversation roles must alternate"), "{err}");
    let tok = with_template("{% for m in messages %}");
    let err = tok
        .apply_chat_template(&user("hi"), true)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chat template failed to render"), "{err}");
}

#[test]
fn templates_get_hf_variables_and_whitespace_control() {
    let tok = with_template(
        "{{ bos_token }}\n{% for m in messages %}\n    {{ m.role }}={{ m['content'] }};\n{% endfor %}\n{% if add_generation_prompt %}GO{% endif %}{{ eos_token }}\n",
    );
    let rendered = tok.apply_chat_template(&user("hi"), true).unwrap();
    // trim_blocks + lstrip_blocks remove the block lines; the final newline is dropped.
    assert_eq!(rendered, "<|im_start|>\n    user=hi;\nGO<|im_end|>");
}

#[test]
fn python_string_methods_and_tojson() {
    let tok = with_template(
        "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' a') }}",
    );
    assert_eq!(
        tok.apply_chat_template(&user(" a b "), true).unwrap(),
        "A B|True"
    );
    let tok = with_template("{{ messages | tojson }}");
    let rendered = tok
        .apply_chat_template(&user("say \"<hi>\" é\n"), true)
        .unwrap();
    assert_eq!(
        rendered,
        r#"[{"role": "user", "content": "say \"<hi>\" é\n"}]"#
    );
    let tok = with_template("{{ messages[0] | tojson(indent=2) }}");
    let rendered = tok.apply_chat_template(&user("x"), true).unwrap();
    assert_eq!(
        rendered,
        "{\n  \"role\": \"user\",\n  \"content\": \"x\"\n}"
    );
    let tok = with_template("{{ {'b': 1.0, 'a': [true, none, 2]} | tojson(sort_keys=true) }}");
    assert_eq!(
        tok.apply_chat_template(&user("x"), true).unwrap(),
        r#"{"a": [true, null, 2], "b": 1.0}"#
    );
}

#[test]
fn strftime_now_is_available() {
    let tok = with_template("{{ strftime_now('%Y') | length }}");
    assert_eq!(tok.apply_chat_template(&user("x"), true).unwrap(), "4");
}
