//! The tokenizer as Hugging Face's files, for clients that want a
//! `transformers` tokenizer of the served model (benchmark clients count
//! tokens with one) when the model is a GGUF and no hub is reachable.
//!
//! `tokenizer.json` is the `tokenizers` pipeline this crate itself runs
//! (vocabulary, merges, the pre-tokenizer's splits, special and
//! user-defined tokens), serialised by `tokenizers`, plus what the GGUF
//! leaves to llama.cpp: the BOS a model adds (a template post-processor)
//! and, for SentencePiece vocabularies, the decoder. `tokenizer_config.json`
//! names the class (`PreTrainedTokenizerFast`), the special tokens, the chat
//! template and the context length.

use serde_json::{Value, json};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::normalizers::Replace;
use tokenizers::processors::template::TemplateProcessing;

use crate::{Tokenizer, TokenizerError};

/// `tokenizer.json` and `tokenizer_config.json`.
#[derive(Debug, Clone)]
pub struct HuggingFaceFiles {
    pub tokenizer_json: String,
    pub tokenizer_config: Value,
}

impl Tokenizer {
    /// See the module docs; `model_max_length`: the model's context.
    pub fn hugging_face_files(
        &self,
        model_max_length: Option<u32>,
    ) -> Result<HuggingFaceFiles, TokenizerError> {
        let inner = &self.inner;
        let mut encoder = inner.encoder.clone();
        let build = |e: &dyn std::fmt::Display| TokenizerError::Build(e.to_string());
        let piece = |id: Option<u32>| id.and_then(|id| self.token_piece(id));
        let bos = piece(inner.bos);
        if inner.add_bos
            && let (Some(id), Some(token)) = (inner.bos, bos.as_deref())
        {
            let post = TemplateProcessing::builder()
                .try_single(format!("{token}:0 $A:0"))
                .and_then(|b| b.try_pair(format!("{token}:0 $A:0 {token}:1 $B:1")))
                .map_err(|e| build(&e))?
                .special_tokens(vec![(token.to_owned(), id)])
                .build()
                .map_err(|e| build(&e))?;
            encoder.with_post_processor(Some(post));
        }
        if encoder.get_decoder().is_none() {
            // SentencePiece pieces: '▁' is a space, <0xNN> a byte, and the
            // prefixed space of the first word goes (Llama's decoder).
            let steps = vec![
                Replace::new("\u{2581}", " ").map_err(|e| build(&e))?.into(),
                ByteFallback::new().into(),
                Fuse::new().into(),
                Strip::new(' ', usize::from(inner.strip_leading_space), 0).into(),
            ];
            encoder.with_decoder(Some(DecoderSequence::new(steps)));
        }
        let tokenizer_json = encoder.to_string(true).map_err(|e| build(&e))?;
        let eos = piece(inner.eos.or_else(|| inner.eos_ids.first().copied()));
        let mut config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "add_bos_token": inner.add_bos,
            "add_eos_token": false,
            "clean_up_tokenization_spaces": false,
        });
        if let Some(template) = &inner.chat_template {
            config["chat_template"] = Value::from(template.clone());
        }
        if let Some(n) = model_max_length {
            config["model_max_length"] = Value::from(n);
        }
        Ok(HuggingFaceFiles {
            tokenizer_json,
            tokenizer_config: config,
        })
    }
}
