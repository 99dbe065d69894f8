//! Text ⇄ token ids for specmesh: builds a tokenizer from a GGUF file's
//! metadata (or a Hugging Face tokenizer directory) that tokenizes exactly
//! like llama.cpp, decodes token streams without ever splitting a UTF-8
//! character, and renders the model's chat template the way Hugging Face's
//! `apply_chat_template` does.
//!
//! Encoding runs through a `tokenizers` pipeline (BPE model, llama.cpp's
//! pre-tokenizer regexes, control/user-defined tokens as added tokens).
//! Decoding uses a per-token byte table owned by this crate, so that
//! [`IncrementalDecoder`] and [`Tokenizer::decode`] agree byte for byte.

#![forbid(unsafe_code)]

mod chat;
mod decoder;
mod error;
mod export;
mod gguf;
mod hf;
mod pieces;
mod pretok;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

pub use decoder::IncrementalDecoder;
pub use error::TokenizerError;
pub use export::HuggingFaceFiles;

/// One chat turn, as passed to a chat template (`messages` in Jinja), in
/// the shape Hugging Face's `apply_chat_template` is given: the optional
/// fields are absent (undefined in the template) unless set.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A tool message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with the given role ("system", "user", "assistant", ...).
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A tool call in a template's history: `{"id", "type": "function",
/// "function": {"name", "arguments"}}` with the arguments as an object,
/// which is what templates expect (they serialise it with `tojson`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: ToolCallFunction,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolCallFunction {
    pub name: String,
    pub arguments: serde_json::Value,
}

impl ToolCall {
    pub fn function(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        ToolCall {
            id: id.into(),
            kind: "function".to_owned(),
            function: ToolCallFunction {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// End-of-turn markers used by common chat templates; when a template uses
/// one and it is in the vocabulary, generating it ends the turn.
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|endofturn|>",
];

/// Tokens that end a generation wherever the vocabulary has them as special
/// tokens, whatever the template: llama.cpp's end-of-generation list (its
/// `special_eog_ids`, matched by text), so that a model stops where
/// llama.cpp stops it (Qwen2.5 ends documents with `<|endoftext|>` and
/// turns with `<|im_end|>`).
const END_OF_GENERATION_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// What a loader (GGUF or Hugging Face) hands over to build a [`Tokenizer`].
pub(crate) struct Parts {
    pub encoder: tokenizers::Tokenizer,
    /// Vocabulary string per id; `None` for ids the vocabulary skips.
    pub pieces: Vec<Option<String>>,
    /// Bytes each id decodes to.
    pub piece_bytes: Vec<Vec<u8>>,
    /// Ids dropped by `decode(.., skip_special = true)`.
    pub special: Vec<bool>,
    /// Ids the vocabulary marks unused (GGUF type 5: the padding up to the
    /// embedding width); a model should never emit them.
    pub unused: Vec<bool>,
    /// SentencePiece models prepend a space when encoding; decoding drops it.
    pub strip_leading_space: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Further ids that end generation (eot/eom ids, generation_config.json).
    pub extra_eos: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
    /// Where the chat template was looked for, for the "no template" error.
    pub template_origin: &'static str,
    pub warnings: Vec<String>,
}

struct Inner {
    /// Parses special tokens out of the text.
    encoder: tokenizers::Tokenizer,
    /// Same pipeline, but special tokens in the text are tokenized as plain text.
    plain_encoder: tokenizers::Tokenizer,
    pieces: Vec<Option<String>>,
    piece_bytes: Vec<Vec<u8>>,
    special: Vec<bool>,
    unused: Vec<bool>,
    strip_leading_space: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    template_origin: &'static str,
    warnings: Vec<String>,
}

/// A tokenizer loaded from a model. Cheap to clone (shared internals).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token_id", &self.inner.bos)
            .field("eos_token_ids", &self.inner.eos_ids)
            .field("add_bos_token", &self.inner.add_bos)
            .field("has_chat_template", &self.has_chat_template())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Build from the metadata of an already-parsed GGUF file.
    pub fn from_gguf(
        content: &candle_core::quantized::gguf_file::Content,
    ) -> Result<Self, TokenizerError> {
        gguf::parts_from_metadata(&content.metadata).and_then(Self::from_parts)
    }

    /// Open a GGUF file and build from its metadata; tensor data is not read.
    pub fn from_gguf_path(path: &Path) -> Result<Self, TokenizerError> {
        let content = gguf::read_header(path)?;
        Self::from_gguf(&content)
    }

    /// Build from a Hugging Face model directory: `tokenizer.json`, plus
    /// `tokenizer_config.json` (chat template, bos/eos, add_bos_token),
    /// `chat_template.jinja` and `generation_config.json` when present.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        hf::parts_from_dir(dir).and_then(Self::from_parts)
    }

    /// The tokenizer of a model path as every `--model` flag takes it: a
    /// directory is a Hugging Face checkpoint (`tokenizer.json`), a file a
    /// GGUF (its metadata).
    pub fn from_model_path(path: &Path) -> Result<Self, TokenizerError> {
        if path.is_dir() {
            Self::from_hf_dir(path)
        } else {
            Self::from_gguf_path(path)
        }
    }

    fn from_parts(parts: Parts) -> Result<Self, TokenizerError> {
        let mut plain_encoder = parts.encoder.clone();
        plain_encoder.set_encode_special_tokens(true);

        let mut eos_ids: Vec<u32> = parts.eos.into_iter().chain(parts.extra_eos).collect();
        if let Some(template) = &parts.chat_template {
            for marker in END_OF_TURN_TOKENS {
                if template.contains(marker)
                    && let Some(id) = parts.encoder.token_to_id(marker)
                {
                    eos_ids.push(id);
                }
            }
        }
        for marker in END_OF_GENERATION_TOKENS {
            if let Some(id) = parts.encoder.token_to_id(marker)
                && parts.special.get(id as usize).copied().unwrap_or(false)
            {
                eos_ids.push(id);
            }
        }
        let mut seen = std::collections::HashSet::new();
        eos_ids.retain(|id| seen.insert(*id));

        if parts.add_bos && parts.bos.is_none() {
            return Err(TokenizerError::MissingBos);
        }

        Ok(Self {
            inner: Arc::new(Inner {
                encoder: parts.encoder,
                plain_encoder,
                pieces: parts.pieces,
                piece_bytes: parts.piece_bytes,
                special: parts.special,
                unused: parts.unused,
                strip_leading_space: parts.strip_leading_space,
                bos: parts.bos,
                eos: parts.eos,
                eos_ids,
                add_bos: parts.add_bos,
                chat_template: parts.chat_template,
                template_origin: parts.template_origin,
                warnings: parts.warnings,
            }),
        })
    }

    /// Tokenize `text`. With `parse_special`, control tokens written in the
    /// text (e.g. `<|im_start|>`) become their single id; without it they are
    /// tokenized as ordinary characters. Never adds BOS.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoder = if parse_special {
            &self.inner.encoder
        } else {
            &self.inner.plain_encoder
        };
        let encoding = encoder
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Tokenize a prompt as the model expects it: special tokens parsed, BOS
    /// prepended iff the model's metadata says `add_bos_token`.
    pub fn encode_for_model(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let ids = self.encode(text, true)?;
        match (self.inner.add_bos, self.inner.bos) {
            (true, Some(bos)) => Ok(std::iter::once(bos).chain(ids).collect()),
            (true, None) => Err(TokenizerError::MissingBos),
            (false, _) => Ok(ids),
        }
    }

    /// Turn ids back into text. Bytes that are not valid UTF-8 become U+FFFD.
    /// With `skip_special`, control (and unknown) tokens produce no text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(piece) = self.bytes_of(id, skip_special)? {
                bytes.extend_from_slice(piece);
            }
        }
        if self.inner.strip_leading_space && bytes.first() == Some(&b' ') {
            bytes.remove(0);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes `id` contributes to decoded text, `None` when skipped.
    pub(crate) fn bytes_of(
        &self,
        id: u32,
        skip_special: bool,
    ) -> Result<Option<&[u8]>, TokenizerError> {
        let index = id as usize;
        if !matches!(self.inner.pieces.get(index), Some(Some(_))) {
            return Err(TokenizerError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size(),
            });
        }
        if skip_special && self.is_special(id) {
            return Ok(None);
        }
        Ok(self.inner.piece_bytes.get(index).map(Vec::as_slice))
    }

    /// The bytes `id` stands for in text, special tokens' own text
    /// included (without the leading-space strip a whole [`Self::decode`]
    /// may apply); `None` for an unused id. What a text bridge between two
    /// vocabularies concatenates: a token may end in the middle of a UTF-8
    /// character.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        match self.inner.pieces.get(id as usize) {
            Some(Some(_)) => self.inner.piece_bytes.get(id as usize).map(Vec::as_slice),
            _ => None,
        }
    }

    pub(crate) fn strips_leading_space(&self) -> bool {
        self.inner.strip_leading_space
    }

    /// The vocabulary string of `id` (e.g. `Ġworld`), for debugging output.
    pub fn token_piece(&self, id: u32) -> Option<String> {
        self.inner.pieces.get(id as usize).cloned().flatten()
    }

    /// The id whose vocabulary string is exactly `piece`.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.inner.encoder.token_to_id(piece)
    }

    /// Number of ids (one past the largest id).
    pub fn vocab_size(&self) -> usize {
        self.inner.pieces.len()
    }

    /// A 64-bit fingerprint of the vocabulary: every id's piece, in id
    /// order (FNV-1a over the pieces with a separator, an unused id marked
    /// apart from an empty piece). Two tokenizers that map every id to the
    /// same piece ([`Self::token_piece`]) have the same fingerprint, so a
    /// drafter can check a verifier's target against its draft model
    /// without the whole vocabulary on the wire. Never 0 (0 means
    /// "unknown" on the wire).
    pub fn vocab_fingerprint(&self) -> u64 {
        vocab_fingerprint(self.inner.pieces.iter().map(Option::as_deref))
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos
    }

    /// Whether [`Tokenizer::encode_for_model`] prepends BOS.
    pub fn add_bos_token(&self) -> bool {
        self.inner.add_bos
    }

    /// Every id that ends generation: the eos id, the eot/eom ids, and the
    /// chat template's end-of-turn token when it is in the vocabulary.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// Whether `id` is a control/special token (dropped by `skip_special`).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .special
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Whether `id` is a padding id the vocabulary marks unused (GGUF type
    /// 5), or no id at all: text never contains it.
    pub fn is_unused(&self, id: u32) -> bool {
        self.inner.unused.get(id as usize).copied().unwrap_or(false)
            || !matches!(self.inner.pieces.get(id as usize), Some(Some(_)))
    }

    pub fn has_chat_template(&self) -> bool {
        self.inner.chat_template.is_some()
    }

    /// The raw Jinja chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }

    /// Render `messages` with the model's chat template, like Hugging Face's
    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=..)`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_with_tools(messages, &[], add_generation_prompt)
    }

    /// Whether the chat template reads a `tools` variable, i.e. renders the
    /// tools a request offers (SmolLM2's does not, Qwen2.5's does).
    pub fn template_declares_tools(&self) -> bool {
        self.inner
            .chat_template
            .as_deref()
            .is_some_and(chat::declares_tools)
    }

    /// [`Self::apply_chat_template`] with `tools` in the template's
    /// context (each as the caller gave it, OpenAI's `{"type": "function",
    /// "function": {...}}`), as `apply_chat_template(..., tools=...)`
    /// does; an empty list leaves `tools` undefined.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template =
            self.inner
                .chat_template
                .as_deref()
                .ok_or(TokenizerError::NoChatTemplate {
                    origin: self.inner.template_origin,
                })?;
        let piece = |id: Option<u32>| id.and_then(|id| self.token_piece(id));
        let eos = self
            .inner
            .eos
            .or_else(|| self.inner.eos_ids.first().copied());
        chat::render(
            template,
            messages,
            tools,
            add_generation_prompt,
            piece(self.inner.bos).as_deref(),
            piece(eos).as_deref(),
        )
    }

    /// A streaming decoder that keeps special tokens in the text, like
    /// `decode(ids, false)`.
    pub fn incremental_decoder(&self) -> IncrementalDecoder {
        IncrementalDecoder::new(self.clone(), false)
    }

    /// A streaming decoder equivalent to `decode(ids, skip_special)`.
    pub fn incremental_decoder_with(&self, skip_special: bool) -> IncrementalDecoder {
        IncrementalDecoder::new(self.clone(), skip_special)
    }

    /// Non-fatal problems found while loading (e.g. an unknown
    /// `tokenizer.ggml.pre` that fell back to GPT-2 splitting).
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }
}

/// [`Tokenizer::vocab_fingerprint`] over a piece list (`None`: an unused
/// id).
pub fn vocab_fingerprint<'a>(pieces: impl IntoIterator<Item = Option<&'a str>>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    };
    for piece in pieces {
        match piece {
            // 0xFF and 0xFE never occur in UTF-8: unambiguous separators.
            Some(p) => p.bytes().chain([0xFF]).for_each(&mut eat),
            None => eat(0xFE),
        }
    }
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_tells_vocabularies_apart() {
        let a = [Some("a"), None, Some("Ġb")];
        assert_eq!(vocab_fingerprint(a), vocab_fingerprint(a));
        assert_ne!(
            vocab_fingerprint(a),
            vocab_fingerprint([Some("a"), Some(""), Some("Ġb")])
        );
        assert_ne!(
            vocab_fingerprint(a),
            vocab_fingerprint([Some("a"), None, Some("Ġc")])
        );
        assert_ne!(vocab_fingerprint(a), vocab_fingerprint([Some("a"), None]));
        // Pieces do not run together: "ab","c" is not "a","bc".
        assert_ne!(
            vocab_fingerprint([Some("ab"), Some("c")]),
            vocab_fingerprint([Some("a"), Some("bc")])
        );
        assert_ne!(vocab_fingerprint([]), 0);
    }

    #[test]
    fn handles_are_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync + Clone + fmt::Debug>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<IncrementalDecoder>();
    }
}
