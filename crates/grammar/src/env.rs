//! The token environment llguidance works over, built from our tokenizer
//! (not `toktrie_hf_tokenizers`, which wants another `tokenizers` major
//! and a Hugging Face `tokenizer.json`; ours comes from the GGUF).
//!
//! - Each id's bytes are its text; control tokens (`<|im_end|>`) are
//!   marked special (llguidance's 0xFF prefix), so a grammar reaches them
//!   only by name and never inside a string. Added tokens that are plain
//!   text (Qwen's `<tool_call>`) stay text: a literal `"<tool_call>"`
//!   matches the single token or its pieces.
//! - Unused ids (GGUF's padding up to the embedding width) and ids past the
//!   tokenizer's, up to the model's row width, have no bytes: never
//!   allowed.
//! - The end-of-sequence tokens are the tokenizer's: where the grammar may
//!   end, every one of them is allowed.
//! - Forced bytes are tokenised by our own encoder, so a grafted draft is
//!   what the model would write (canonical).

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use specmesh_tokenizer::Tokenizer;

use crate::GrammarError;

struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer.encode(text, false).unwrap_or_default()
        })
    }

    fn tokenize_is_canonical(&self) -> bool {
        true
    }
}

pub(crate) fn tok_env(tokenizer: &Tokenizer, n_vocab: usize) -> Result<TokEnv, GrammarError> {
    let size = n_vocab.max(tokenizer.vocab_size());
    let words: Vec<Vec<u8>> = (0..size as u32)
        .map(|id| {
            if tokenizer.is_unused(id) {
                return Vec::new();
            }
            let Some(bytes) = tokenizer.token_bytes(id) else {
                return Vec::new();
            };
            if tokenizer.is_special(id) {
                let mut w = Vec::with_capacity(bytes.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(bytes);
                w
            } else {
                bytes.to_vec()
            }
        })
        .collect();
    let eos = tokenizer.eos_token_ids();
    let Some(&first) = eos.first() else {
        return Err(GrammarError::Tokenizer(
            "the vocabulary names no end-of-sequence token".into(),
        ));
    };
    let info = TokRxInfo {
        vocab_size: size as u32,
        tok_eos: first,
        tok_bos: tokenizer.bos_token_id(),
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
    Ok(Arc::new(Env {
        trie,
        tokenizer: tokenizer.clone(),
    }))
}
