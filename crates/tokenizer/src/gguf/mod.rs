//! Building a tokenizer from GGUF `tokenizer.*` metadata the way llama.cpp
//! interprets it: `gpt2` (byte-level BPE with merges and a named
//! pre-tokenizer) and `llama` (SentencePiece-style BPE driven by scores,
//! `▁` for spaces, `<0xNN>` byte fallback).

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormSequence};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

mod meta;

use meta::{Meta, int_value};

use crate::pieces::{PieceEncoding, piece_bytes};
use crate::{Parts, TokenizerError, pretok};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_TEMPLATE: &str = "tokenizer.chat_template";

/// GGUF token types (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_code(index: usize, code: i64) -> Result<Self, TokenizerError> {
        Ok(match code {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            value => return Err(TokenizerError::InvalidTokenType { index, value }),
        })
    }
}

/// Read a GGUF header and metadata (not the tensor data).
pub(crate) fn read_header(path: &Path) -> Result<Content, TokenizerError> {
    let file = File::open(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Content::read(&mut BufReader::new(file)).map_err(|e| TokenizerError::GgufParse {
        path: path.to_path_buf(),
        // candle appends a backtrace when RUST_BACKTRACE is set: keep the
        // message to its first line.
        message: e.to_string().lines().next().unwrap_or_default().to_owned(),
    })
}

/// Build the tokenizer parts from GGUF metadata.
pub(crate) fn parts_from_metadata(
    metadata: &HashMap<String, Value>,
) -> Result<Parts, TokenizerError> {
    let meta = Meta(metadata);
    let model = meta
        .str(KEY_MODEL)?
        .ok_or_else(|| TokenizerError::MissingKey {
            key: KEY_MODEL.to_owned(),
        })?;
    let encoding = match model {
        "gpt2" => PieceEncoding::ByteLevel,
        "llama" => PieceEncoding::SentencePiece,
        other => {
            return Err(TokenizerError::Unsupported {
                key: KEY_MODEL.to_owned(),
                value: other.to_owned(),
                reason: "only \"gpt2\" (byte-level bpe) and \"llama\" (sentencepiece bpe) \
                         vocabularies are supported"
                    .to_owned(),
            });
        }
    };
    let tokens = meta
        .strings(KEY_TOKENS)?
        .ok_or_else(|| TokenizerError::MissingKey {
            key: KEY_TOKENS.to_owned(),
        })?;
    if tokens.is_empty() {
        return Err(TokenizerError::InvalidValue {
            key: KEY_TOKENS.to_owned(),
            reason: "the vocabulary is empty".to_owned(),
        });
    }
    let n = tokens.len();
    let types: Vec<TokenType> = match meta.per_token(KEY_TYPES, n)? {
        None => vec![TokenType::Normal; n],
        Some(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match int_value(v) {
                Some(code) => TokenType::from_code(i, i64::try_from(code).unwrap_or(i64::MAX)),
                None => Err(Meta::element_error(KEY_TYPES, i, "integer", v)),
            })
            .collect::<Result<_, _>>()?,
    };

    let mut warnings = Vec::new();
    // llama.cpp: later duplicates of a string win the string -> id lookup.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), i as u32))
        .collect();

    let space_prefix = meta.bool(KEY_SPACE_PREFIX)?;
    let (bpe, default_add_bos, strip_leading_space, normalizer, pre_tokenizer) = match encoding {
        PieceEncoding::ByteLevel => {
            let spec = pretok::lookup(meta.str(KEY_PRE)?);
            warnings.extend(spec.warning.clone());
            let merges = gpt2_merges(&meta, &vocab, &mut warnings)?;
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .ignore_merges(spec.ignore_merges)
                .build();
            let pre = byte_level_pre_tokenizer(&spec.regexes)?;
            (bpe, spec.default_add_bos, false, None, Some(pre))
        }
        PieceEncoding::SentencePiece => {
            let scores = spm_scores(&meta, n)?;
            let merges = spm_merges(&tokens, &scores, &vocab);
            let unk = meta.token_id("tokenizer.ggml.unknown_token_id", n)?;
            let mut builder = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .byte_fallback(true);
            if let Some(unk) = unk {
                builder = builder.unk_token(tokens[unk as usize].to_owned());
            }
            let add_prefix = space_prefix.unwrap_or(true);
            let normalizer = spm_normalizer(add_prefix)?;
            (builder.build(), true, add_prefix, Some(normalizer), None)
        }
    };
    let bpe = bpe.map_err(|e| TokenizerError::Build(e.to_string()))?;

    let mut encoder = tokenizers::Tokenizer::new(bpe);
    encoder.with_normalizer(normalizer);
    encoder.with_pre_tokenizer(pre_tokenizer);
    if encoding == PieceEncoding::ByteLevel {
        encoder.with_decoder(Some(ByteLevel::new(false, false, false)));
    }
    add_special_tokens(&mut encoder, &tokens, &types);

    let piece_bytes = tokens
        .iter()
        .zip(&types)
        .map(|(t, ty)| {
            let raw = matches!(ty, TokenType::Control | TokenType::UserDefined);
            piece_bytes(encoding, t, raw, *ty == TokenType::Byte)
        })
        .collect();
    let special = types
        .iter()
        .map(|ty| matches!(ty, TokenType::Control | TokenType::Unknown))
        .collect();
    let unused = types.iter().map(|ty| *ty == TokenType::Unused).collect();

    let extra_eos = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
        .iter()
        .filter_map(|key| meta.token_id(key, n).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    // Checked only so that a malformed id is reported; neither is needed to encode.
    meta.token_id("tokenizer.ggml.padding_token_id", n)?;
    meta.token_id("tokenizer.ggml.unknown_token_id", n)?;

    Ok(Parts {
        encoder,
        pieces: tokens.iter().map(|t| Some((*t).to_owned())).collect(),
        piece_bytes,
        special,
        unused,
        strip_leading_space,
        bos: meta.token_id("tokenizer.ggml.bos_token_id", n)?,
        eos: meta.token_id("tokenizer.ggml.eos_token_id", n)?,
        extra_eos,
        add_bos: meta.bool(KEY_ADD_BOS)?.unwrap_or(default_add_bos),
        chat_template: meta.str(KEY_TEMPLATE)?.map(str::to_owned),
        template_origin: "gguf metadata key `tokenizer.chat_template` is missing",
        warnings,
    })
}

/// Parse `tokenizer.ggml.merges` ("left right" pairs, ranked by position).
fn gpt2_merges(
    meta: &Meta<'_>,
    vocab: &Vocab,
    warnings: &mut Vec<String>,
) -> Result<Vec<(String, String)>, TokenizerError> {
    let lines = meta
        .strings(KEY_MERGES)?
        .ok_or_else(|| TokenizerError::MissingKey {
            key: KEY_MERGES.to_owned(),
        })?;
    let mut merges = Vec::with_capacity(lines.len());
    let mut skipped = 0usize;
    for (i, line) in lines.iter().enumerate() {
        // llama.cpp splits at the first space after the first byte, so a
        // merge whose left side is a lone space still parses.
        let split = line
            .char_indices()
            .skip(1)
            .find(|(_, c)| *c == ' ')
            .map(|(pos, _)| pos);
        let (left, right) = match split {
            Some(pos) => (&line[..pos], &line[pos + 1..]),
            None => ("", ""),
        };
        if left.is_empty() || right.is_empty() {
            return Err(TokenizerError::InvalidValue {
                key: KEY_MERGES.to_owned(),
                reason: format!("element {i} `{line}` is not two tokens separated by a space"),
            });
        }
        // A merge that can never produce a vocabulary token has no effect in
        // llama.cpp either; `tokenizers` would reject the whole model.
        let merged = format!("{left}{right}");
        if vocab.contains_key(left) && vocab.contains_key(right) && vocab.contains_key(&merged) {
            merges.push((left.to_owned(), right.to_owned()));
        } else {
            skipped += 1;
        }
    }
    if skipped > 0 {
        warnings.push(format!(
            "gguf metadata key `{KEY_MERGES}` has {skipped} merges whose tokens are not in the \
             vocabulary; they were ignored"
        ));
    }
    Ok(merges)
}

fn spm_scores(meta: &Meta<'_>, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let Some(items) = meta.per_token(KEY_SCORES, n)? else {
        return Ok(vec![0.0; n]);
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::F32(s) => Ok(*s),
            Value::F64(s) => Ok(*s as f32),
            other => Err(Meta::element_error(KEY_SCORES, i, "float", other)),
        })
        .collect()
}

/// llama.cpp's SentencePiece tokenizer repeatedly merges the adjacent pair
/// whose concatenation is the highest-scoring vocabulary token. A BPE merge
/// list ranked by that score reproduces it (as Hugging Face's converter does).
fn spm_merges(tokens: &[&str], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, u32, String, String)> = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        if vocab.get(*token) != Some(&(id as u32)) {
            continue;
        }
        for (pos, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(pos);
            if vocab.contains_key(left) && vocab.contains_key(right) {
                ranked.push((scores[id], id as u32, left.to_owned(), right.to_owned()));
            }
        }
    }
    // Highest score first; ties keep vocabulary order so the result is deterministic.
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.into_iter().map(|(_, _, l, r)| (l, r)).collect()
}

fn spm_normalizer(add_prefix: bool) -> Result<NormalizerWrapper, TokenizerError> {
    let replace =
        Replace::new(" ", "\u{2581}").map_err(|e| TokenizerError::Build(e.to_string()))?;
    let mut steps: Vec<NormalizerWrapper> = Vec::new();
    if add_prefix {
        // llama.cpp prefixes a space to every text fragment that starts the
        // input or follows a special token; per-segment normalization does that.
        steps.push(Prepend::new("\u{2581}".to_owned()).into());
    }
    steps.push(replace.into());
    Ok(NormSequence::new(steps).into())
}

fn byte_level_pre_tokenizer(regexes: &[&str]) -> Result<PreTokenizerWrapper, TokenizerError> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in regexes {
        let pattern = SplitPattern::Regex((*re).to_owned());
        let split = Split::new(pattern, SplitDelimiterBehavior::Isolated, false).map_err(|e| {
            TokenizerError::Build(format!("pre-tokenizer regex `{re}` does not compile: {e}"))
        })?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    Ok(PreSequence::new(steps).into())
}

/// Control and unknown tokens become special added tokens (matched in the text
/// only when special parsing is on); user-defined ones are always matched,
/// as in llama.cpp's `tokenizer_st_partition`.
fn add_special_tokens(encoder: &mut tokenizers::Tokenizer, tokens: &[&str], types: &[TokenType]) {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (token, ty) in tokens.iter().zip(types) {
        if token.is_empty() {
            continue;
        }
        match ty {
            TokenType::Control | TokenType::Unknown => {
                special.push(AddedToken::from(*token, true).normalized(false));
            }
            TokenType::UserDefined => user.push(AddedToken::from(*token, false).normalized(false)),
            _ => {}
        }
    }
    encoder.add_special_tokens(&special);
    encoder.add_tokens(&user);
}
