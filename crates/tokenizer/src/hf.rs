//! Building a tokenizer from a Hugging Face model directory:
//! `tokenizer.json` (the pipeline), `tokenizer_config.json` (chat template,
//! bos/eos, add_bos_token), `chat_template.jinja` and
//! `generation_config.json` (extra eos ids) when present.

use std::path::Path;

use serde_json::Value as Json;

use crate::pieces::{PieceEncoding, parse_byte_token, piece_bytes};
use crate::{Parts, TokenizerError};

const TEMPLATE_ORIGIN: &str =
    "tokenizer_config.json has no `chat_template` and there is no chat_template.jinja";

fn read_text(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidHfFile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read_json(path: &Path) -> Result<Json, TokenizerError> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|e| invalid(path, format!("not valid json: {e}")))
}

/// Read an optional JSON file: `Ok(None)` when it does not exist.
fn read_optional_json(path: &Path) -> Result<Option<Json>, TokenizerError> {
    if path.exists() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// A token in tokenizer_config.json: `"<s>"` or `{"content": "<s>", ...}`.
fn token_string<'a>(config: &'a Json, key: &str) -> Option<&'a str> {
    match config.get(key)? {
        Json::String(s) => Some(s),
        Json::Object(map) => map.get("content").and_then(Json::as_str),
        _ => None,
    }
}

/// Which byte convention the `decoder` section of tokenizer.json implies, and
/// whether it strips the space a SentencePiece normalizer prepended.
fn decoder_encoding(path: &Path, decoder: &Json) -> Result<(PieceEncoding, bool), TokenizerError> {
    let kind = decoder.get("type").and_then(Json::as_str).unwrap_or("none");
    let metaspace_strips = |d: &Json| {
        d.get("add_prefix_space").and_then(Json::as_bool) == Some(true)
            || matches!(
                d.get("prepend_scheme").and_then(Json::as_str),
                Some("always" | "first")
            )
    };
    match kind {
        "ByteLevel" => Ok((PieceEncoding::ByteLevel, false)),
        "Metaspace" => Ok((PieceEncoding::SentencePiece, metaspace_strips(decoder))),
        "Sequence" => {
            let steps = decoder
                .get("decoders")
                .and_then(Json::as_array)
                .ok_or_else(|| invalid(path, "decoder `Sequence` has no `decoders` list"))?;
            let kinds: Vec<&str> = steps
                .iter()
                .filter_map(|d| d.get("type").and_then(Json::as_str))
                .collect();
            if kinds.contains(&"ByteLevel") {
                return Ok((PieceEncoding::ByteLevel, false));
            }
            let spm = kinds
                .iter()
                .any(|k| matches!(*k, "ByteFallback" | "Replace" | "Metaspace"));
            if !spm {
                return Err(TokenizerError::Unsupported {
                    key: "tokenizer.json decoder".to_owned(),
                    value: format!("Sequence[{}]", kinds.join(", ")),
                    reason: "only byte-level and sentencepiece decoders are supported".to_owned(),
                });
            }
            let strips = steps
                .iter()
                .any(|d| match d.get("type").and_then(Json::as_str) {
                    Some("Strip") => d.get("start").and_then(Json::as_u64).unwrap_or(0) > 0,
                    Some("Metaspace") => metaspace_strips(d),
                    _ => false,
                });
            Ok((PieceEncoding::SentencePiece, strips))
        }
        other => Err(TokenizerError::Unsupported {
            key: "tokenizer.json decoder".to_owned(),
            value: other.to_owned(),
            reason: "only byte-level and sentencepiece decoders are supported".to_owned(),
        }),
    }
}

fn chat_template(dir: &Path, config: &Json) -> Result<Option<String>, TokenizerError> {
    let path = dir.join("tokenizer_config.json");
    match config.get("chat_template") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => return Ok(Some(s.clone())),
        // Several named templates: HF uses the one called "default".
        Some(Json::Array(named)) => {
            let pick = named
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .or_else(|| named.first())
                .and_then(|t| t.get("template"))
                .and_then(Json::as_str);
            return pick
                .map(|s| Some(s.to_owned()))
                .ok_or_else(|| invalid(&path, "`chat_template` list has no usable `template`"));
        }
        Some(_) => {
            return Err(invalid(
                &path,
                "`chat_template` is neither a string nor a list",
            ));
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return read_text(&jinja).map(Some);
    }
    Ok(None)
}

/// Ids listed as `eos_token_id` (a number or a list) in generation_config.json.
fn generation_eos(dir: &Path, vocab_size: usize) -> Result<Vec<u32>, TokenizerError> {
    let path = dir.join("generation_config.json");
    let Some(config) = read_optional_json(&path)? else {
        return Ok(Vec::new());
    };
    let ids: Vec<&Json> = match config.get("eos_token_id") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(items)) => items.iter().collect(),
        Some(one) => vec![one],
    };
    ids.into_iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|id| (*id as usize) < vocab_size)
                .ok_or_else(|| {
                    invalid(
                        &path,
                        format!("`eos_token_id` entry {v} is not a token id of the {vocab_size}-token vocabulary"),
                    )
                })
        })
        .collect()
}

pub(crate) fn parts_from_dir(dir: &Path) -> Result<Parts, TokenizerError> {
    let tokenizer_path = dir.join("tokenizer.json");
    let text = read_text(&tokenizer_path)?;
    let json: Json = serde_json::from_str(&text)
        .map_err(|e| invalid(&tokenizer_path, format!("not valid json: {e}")))?;
    let encoder = tokenizers::Tokenizer::from_bytes(text.as_bytes())
        .map_err(|e| invalid(&tokenizer_path, e.to_string()))?;
    let (encoding, strip_leading_space) =
        decoder_encoding(&tokenizer_path, json.get("decoder").unwrap_or(&Json::Null))?;

    let config_path = dir.join("tokenizer_config.json");
    let config = read_optional_json(&config_path)?.unwrap_or(Json::Null);

    let vocab = encoder.get_vocab(true);
    let size = vocab.values().max().map_or(0, |m| *m as usize + 1);
    let mut pieces = vec![None; size];
    for (token, id) in vocab {
        pieces[id as usize] = Some(token);
    }
    let mut special = vec![false; size];
    for (id, token) in encoder.get_added_tokens_decoder() {
        if let Some(slot) = special.get_mut(id as usize) {
            *slot = token.special;
        }
    }
    let piece_bytes = pieces
        .iter()
        .map(|p| match p {
            Some(p) => piece_bytes(encoding, p, false, parse_byte_token(p).is_some()),
            None => Vec::new(),
        })
        .collect();

    let lookup = |key: &str| -> Result<Option<u32>, TokenizerError> {
        match token_string(&config, key) {
            None => Ok(None),
            Some(s) => encoder.token_to_id(s).map(Some).ok_or_else(|| {
                invalid(
                    &config_path,
                    format!("`{key}` `{s}` is not in the vocabulary"),
                )
            }),
        }
    };
    let bos = lookup("bos_token")?;
    let eos = lookup("eos_token")?;
    let add_bos = match config.get("add_bos_token").and_then(Json::as_bool) {
        Some(add) => add,
        // No explicit flag: the post-processor decides, so ask it.
        None => match bos {
            Some(bos) => {
                let with = encoder
                    .encode_fast("a", true)
                    .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                with.get_ids().first() == Some(&bos)
            }
            None => false,
        },
    };

    Ok(Parts {
        encoder,
        pieces,
        piece_bytes,
        unused: vec![false; special.len()],
        special,
        strip_leading_space,
        bos,
        eos,
        extra_eos: generation_eos(dir, size)?,
        add_bos,
        chat_template: chat_template(dir, &config)?,
        template_origin: TEMPLATE_ORIGIN,
        warnings: Vec::new(),
    })
}
