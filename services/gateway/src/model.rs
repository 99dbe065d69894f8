//! What the gateway needs from the model: its tokenizer and its context
//! length. Both come from metadata (the GGUF header, or a Hugging Face
//! directory's JSON files); the weights stay on disk, since only the
//! verifiers run the model.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use specmesh_tokenizer::{Tokenizer, TokenizerError};

/// The tokenizer and context length of the served model.
#[derive(Debug, Clone)]
pub struct ModelMeta {
    pub tokenizer: Tokenizer,
    /// Positions the model supports: prompt plus generated tokens.
    pub max_context: u32,
}

/// The model's metadata could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ModelMetaError {
    #[error("failed to read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a readable GGUF file: {message}", path.display())]
    Gguf { path: PathBuf, message: String },
    #[error("{}: metadata `{key}` is missing or not a positive integer", path.display())]
    ContextLength { path: PathBuf, key: String },
    #[error("loading the tokenizer of {}: {source}", path.display())]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: TokenizerError,
    },
}

impl ModelMeta {
    /// Reads the metadata of a GGUF file or a Hugging Face model directory.
    /// Blocking (file I/O): call it from `spawn_blocking` in async code.
    pub fn load(path: &Path) -> Result<Self, ModelMetaError> {
        if path.is_dir() {
            Self::load_hf_dir(path)
        } else {
            Self::load_gguf(path)
        }
    }

    fn load_gguf(path: &Path) -> Result<Self, ModelMetaError> {
        let file = File::open(path).map_err(|source| ModelMetaError::Io {
            path: path.to_owned(),
            source,
        })?;
        // Reads the header and tensor index only, never tensor data.
        let content =
            Content::read(&mut BufReader::new(file)).map_err(|e| ModelMetaError::Gguf {
                path: path.to_owned(),
                // candle appends a backtrace when RUST_BACKTRACE is set.
                message: e.to_string().lines().next().unwrap_or_default().to_owned(),
            })?;
        let max_context =
            gguf_context_length(&content).map_err(|key| ModelMetaError::ContextLength {
                path: path.to_owned(),
                key,
            })?;
        let tokenizer =
            Tokenizer::from_gguf(&content).map_err(|source| ModelMetaError::Tokenizer {
                path: path.to_owned(),
                source,
            })?;
        Ok(ModelMeta {
            tokenizer,
            max_context,
        })
    }

    fn load_hf_dir(dir: &Path) -> Result<Self, ModelMetaError> {
        let config_path = dir.join("config.json");
        let key = "max_position_embeddings";
        let bad_key = || ModelMetaError::ContextLength {
            path: config_path.clone(),
            key: key.to_owned(),
        };
        let raw = std::fs::read(&config_path).map_err(|source| ModelMetaError::Io {
            path: config_path.clone(),
            source,
        })?;
        let json: serde_json::Value = serde_json::from_slice(&raw).map_err(|_| bad_key())?;
        let max_context = json
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .filter(|&v| v > 0)
            .ok_or_else(bad_key)?;
        let tokenizer =
            Tokenizer::from_hf_dir(dir).map_err(|source| ModelMetaError::Tokenizer {
                path: dir.to_owned(),
                source,
            })?;
        Ok(ModelMeta {
            tokenizer,
            max_context,
        })
    }
}

/// `<arch>.context_length`, or the key that was missing or malformed.
fn gguf_context_length(content: &Content) -> Result<u32, String> {
    let arch = match content.metadata.get("general.architecture") {
        Some(Value::String(arch)) => arch.as_str(),
        _ => return Err("general.architecture".to_owned()),
    };
    let key = format!("{arch}.context_length");
    let value = match content.metadata.get(&key) {
        Some(Value::U32(v)) => u64::from(*v),
        Some(Value::U64(v)) => *v,
        Some(Value::I32(v)) => u64::try_from(*v).unwrap_or(0),
        Some(Value::I64(v)) => u64::try_from(*v).unwrap_or(0),
        _ => 0,
    };
    // A context beyond u32 cannot be addressed by the wire's u32 lengths.
    match u32::try_from(value.min(u64::from(u32::MAX))) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn a_gguf_header_gives_the_tokenizer_and_the_context() {
        let dir = tempfile::tempdir().unwrap();
        let path = testing::write_gguf(dir.path(), 64);
        let meta = ModelMeta::load(&path).unwrap();
        assert_eq!(meta.max_context, 64);
        assert_eq!(meta.tokenizer.vocab_size(), testing::VOCAB_SIZE);
    }

    #[test]
    fn a_missing_context_length_names_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = testing::write_gguf(dir.path(), 0);
        let err = ModelMeta::load(&path).unwrap_err().to_string();
        assert!(
            err.ends_with("metadata `llama.context_length` is missing or not a positive integer"),
            "{err}"
        );
    }

    #[test]
    fn an_unreadable_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junk.gguf");
        std::fs::write(&path, b"not a gguf file").unwrap();
        let err = ModelMeta::load(&path).unwrap_err().to_string();
        assert!(err.contains("is not a readable GGUF file"), "{err}");
        let err = ModelMeta::load(&dir.path().join("absent.gguf"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("failed to read"), "{err}");
    }
}
