//! A prompt as the model reads it: the text's token ids, with the model's
//! chat template applied to it as one user message for a chat prompt.
//! `specmesh generate --local`, `tokenize`, `token-ranking` and the
//! benchmarks (llama.cpp is handed these exact ids) encode through here.

use anyhow::{Result, bail};
use specmesh_tokenizer::{ChatMessage, Tokenizer};

/// The token ids of `prompt`, with the model's chat template applied to it
/// as one user message when `chat`.
pub fn encode_prompt(tokenizer: &Tokenizer, prompt: &str, chat: bool) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let ids = if chat {
        let rendered = tokenizer.apply_chat_template(&[ChatMessage::new("user", prompt)], true)?;
        tokenizer.encode_for_model(&rendered)?
    } else {
        tokenizer.encode_for_model(prompt)?
    };
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    Ok(ids)
}
