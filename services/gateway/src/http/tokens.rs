//! vLLM's `/tokenize` and `/detokenize`, which benchmark clients and
//! agent frameworks call to count tokens with the served model's
//! tokenizer: `{"model", "prompt" | "messages", "add_special_tokens"}` →
//! `{"count", "max_model_len", "tokens"}`, and `{"model", "tokens"}` →
//! `{"prompt"}`.

use serde::Deserialize;
use serde_json::{Value, json};
use specmesh_tokenizer::{ChatMessage, Tokenizer};

use super::error::ApiError;

#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<super::openai::Message>>,
    /// With `prompt`: the model's BOS as a prompt gets it (default true).
    pub add_special_tokens: Option<bool>,
    /// With `messages`: open the assistant's turn (default true).
    pub add_generation_prompt: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

fn bad(param: &str, message: impl Into<String>) -> Box<ApiError> {
    Box::new(ApiError::from(super::openai::BadRequest {
        message: message.into(),
        param: Some(param.to_owned()),
    }))
}

/// The tokens of a prompt or a conversation, as generation would see them.
pub fn tokenize(
    tokenizer: &Tokenizer,
    max_model_len: u32,
    r: TokenizeRequest,
) -> Result<Value, Box<ApiError>> {
    let tokens = match (r.prompt, r.messages) {
        (Some(prompt), None) => {
            let encoded = if r.add_special_tokens.unwrap_or(true) {
                tokenizer.encode_for_model(&prompt)
            } else {
                tokenizer.encode(&prompt, false)
            };
            encoded.map_err(|e| bad("prompt", e.to_string()))?
        }
        (None, Some(messages)) => {
            let mut chat = Vec::with_capacity(messages.len());
            for (i, m) in messages.iter().enumerate() {
                let content = match &m.content {
                    Some(super::openai::Content::Text(t)) => t.clone(),
                    None => String::new(),
                    Some(_) => {
                        return Err(bad(
                            &format!("messages[{i}].content"),
                            "only text content is supported",
                        ));
                    }
                };
                chat.push(ChatMessage::new(m.role.clone(), content));
            }
            let rendered = tokenizer
                .apply_chat_template(&chat, r.add_generation_prompt.unwrap_or(true))
                .map_err(|e| bad("messages", e.to_string()))?;
            tokenizer
                .encode_for_model(&rendered)
                .map_err(|e| bad("messages", e.to_string()))?
        }
        _ => return Err(bad("prompt", "send exactly one of `prompt` or `messages`")),
    };
    Ok(json!({"count": tokens.len(), "max_model_len": max_model_len, "tokens": tokens}))
}

/// The text of token ids (special tokens included, as vLLM's).
pub fn detokenize(tokenizer: &Tokenizer, r: DetokenizeRequest) -> Result<Value, Box<ApiError>> {
    let n = tokenizer.vocab_size();
    if let Some(i) = r.tokens.iter().position(|&t| t as usize >= n) {
        return Err(bad(
            "tokens",
            format!(
                "`tokens[{i}]` is {}, outside the vocabulary of {n}",
                r.tokens[i]
            ),
        ));
    }
    let prompt = tokenizer
        .decode(&r.tokens, false)
        .map_err(|e| bad("tokens", e.to_string()))?;
    Ok(json!({"prompt": prompt}))
}
