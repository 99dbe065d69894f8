//! `Model::load` on bad input: every case must come back as the specific
//! `ModelError` whose message tells the user what to fix, never a panic and
//! never a generic error.

mod common;

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::model_path;
use specmesh_model::{LoadOptions, Model, ModelError};

/// Loads `path` expecting a failure. One thread: these models never run.
fn load_err(path: &Path) -> ModelError {
    let opts = LoadOptions {
        threads: Some(1),
        ..LoadOptions::default()
    };
    match Model::load(path, &opts) {
        Ok(_) => panic!("loading {} succeeded, expected an error", path.display()),
        Err(e) => e,
    }
}

/// A small F32 tensor in GGUF form.
fn f32_tensor(dims: &[usize]) -> QTensor {
    let t = Tensor::zeros(dims, candle_core::DType::F32, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

/// Writes a GGUF with the given metadata and tensors.
fn write_gguf(path: &Path, metadata: &[(&str, Value)], tensors: &[(&str, QTensor)]) {
    let mut file = std::fs::File::create(path).unwrap();
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (*k, t)).collect();
    gguf_file::write(&mut file, &md, &ts).unwrap();
}

/// Metadata of a tiny but complete llama: every key the loader requires.
fn llama_metadata() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", Value::U32(8)),
        ("llama.attention.head_count", Value::U32(2)),
        ("llama.feed_forward_length", Value::U32(16)),
        ("llama.block_count", Value::U32(1)),
        ("llama.context_length", Value::U32(64)),
    ]
}

#[test]
fn missing_path_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.gguf");
    let err = load_err(&path);
    assert!(
        matches!(&err, ModelError::NotFound { path: p } if *p == path),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("absent.gguf"),
        "names the path: {err}"
    );
}

#[test]
fn text_file_is_not_gguf_and_says_what_to_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("README.txt");
    std::fs::write(&path, "This is a text file, not a model.\n".repeat(20)).unwrap();
    let err = load_err(&path);
    assert!(matches!(err, ModelError::NotGguf { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("pass a .gguf file or a Hugging Face model directory"),
        "{msg}"
    );
}

/// A copy of the first `len` bytes of the real model, in `dir`.
fn truncated_copy(dir: &Path, len: usize) -> std::path::PathBuf {
    let real = std::fs::read(model_path()).unwrap();
    let path = dir.join(format!("cut-{len}.gguf"));
    std::fs::write(&path, &real[..len]).unwrap();
    path
}

#[test]
fn truncated_download_is_reported_with_download_it_again() {
    let dir = tempfile::tempdir().unwrap();
    // 4 MiB holds the whole header (vocabulary, merges, tensor table) but
    // not the tensor data: caught by the extent check before any tensor is read.
    let err = load_err(&truncated_copy(dir.path(), 4 << 20));
    assert!(matches!(err, ModelError::Truncated { .. }), "{err:?}");
    assert!(err.to_string().contains("download it again"), "{err}");
}

#[test]
fn download_truncated_inside_the_header_is_reported_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    // 64 KiB cuts inside the vocabulary array; 16 bytes inside the counts
    // after the magic. Both files start like a GGUF: truncated, not foreign.
    for len in [64 << 10, 16] {
        let err = load_err(&truncated_copy(dir.path(), len));
        assert!(
            matches!(err, ModelError::Truncated { .. }),
            "cut at {len}: {err:?}"
        );
        assert!(err.to_string().contains("download it again"), "{err}");
    }
}

#[test]
fn other_architecture_is_unsupported_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma.gguf");
    write_gguf(
        &path,
        &[
            ("general.architecture", Value::String("gemma2".into())),
            ("gemma2.embedding_length", Value::U32(8)),
        ],
        &[("token_embd.weight", f32_tensor(&[4, 8]))],
    );
    let err = load_err(&path);
    assert!(
        matches!(&err, ModelError::UnsupportedArchitecture { arch, .. } if arch == "gemma2"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("gemma2") && msg.contains("llama") && msg.contains("qwen2"),
        "names the found and the supported: {msg}"
    );
}

#[test]
fn missing_required_llama_key_is_a_metadata_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // Each required key, removed in turn; the tensor table is valid so the
    // key is the only thing wrong.
    for missing in [
        "general.architecture",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.feed_forward_length",
        "llama.block_count",
        "llama.context_length",
    ] {
        let path = dir.path().join(format!("{missing}.gguf"));
        let md: Vec<_> = llama_metadata()
            .into_iter()
            .filter(|(k, _)| *k != missing)
            .collect();
        write_gguf(&path, &md, &[("token_embd.weight", f32_tensor(&[4, 8]))]);
        let err = load_err(&path);
        assert!(
            matches!(&err, ModelError::Metadata { key, .. } if key == missing),
            "without {missing}: {err:?}"
        );
        assert!(err.to_string().contains(missing), "{err}");
    }
}

#[test]
fn wrongly_typed_llama_key_is_a_metadata_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typed.gguf");
    let mut md = llama_metadata();
    md[1].1 = Value::String("576".into()); // llama.embedding_length
    write_gguf(&path, &md, &[("token_embd.weight", f32_tensor(&[4, 8]))]);
    let err = load_err(&path);
    assert!(
        matches!(&err, ModelError::Metadata { key, .. } if key == "llama.embedding_length"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("integer"),
        "says what type was expected: {err}"
    );
}

#[test]
fn llama_without_tensors_names_the_missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.gguf");
    write_gguf(
        &path,
        &llama_metadata(),
        &[("token_embd.weight", f32_tensor(&[4, 8]))],
    );
    let err = load_err(&path);
    // The embedding is there; the first layer's weights are not.
    assert!(
        matches!(&err, ModelError::MissingTensor { name, .. } if name.starts_with("blk.0.")),
        "{err:?}"
    );
}

/// A valid config of a tiny llama, so only the checkpoint files are at fault.
fn write_hf_config(dir: &Path) {
    let config = serde_json::json!({
        "model_type": "llama",
        "vocab_size": 4,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn hf_directory_without_safetensors_says_they_are_missing() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_config(dir.path());
    let err = load_err(dir.path());
    assert!(matches!(err, ModelError::NoWeights { .. }), "{err:?}");
    assert!(
        err.to_string().contains("*.safetensors"),
        "names the missing files: {err}"
    );
}

#[test]
fn hf_directory_without_config_names_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, ModelError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn hf_config_that_is_not_json_is_a_metadata_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, ModelError::Metadata { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn hf_config_of_another_architecture_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value = serde_json::json!({
        "model_type": "mistral", "vocab_size": 4, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64,
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::UnsupportedArchitecture { arch, .. } if arch == "mistral"),
        "{err:?}"
    );
    assert!(err.to_string().contains("Qwen2ForCausalLM"), "{err}");
    // And rope scaling, which only the GGUF path implements, is refused by name.
    config["model_type"] = "llama".into();
    config["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::Metadata { key, .. } if key == "rope_scaling"),
        "{err:?}"
    );
}

#[test]
fn corrupt_safetensors_shard_is_an_error_naming_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_config(dir.path());
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"garbage, not safetensors",
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, ModelError::BadSafetensors { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("safetensors file"),
        "{msg}"
    );
}

#[test]
fn a_context_past_the_limit_is_refused_before_any_table_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge-context.gguf");
    let mut md = llama_metadata();
    md[5].1 = Value::U32(u32::MAX); // llama.context_length
    write_gguf(&path, &md, &[("token_embd.weight", f32_tensor(&[4, 8]))]);
    let err = load_err(&path);
    assert!(matches!(&err, ModelError::Metadata { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("`max_context` (4294967295) is over specmesh's limit of 1048576"),
        "{err}"
    );
}
