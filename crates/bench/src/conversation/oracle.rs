//! The reuse oracle: how many prompt tokens of a pass a prefix cache that
//! knew every verifier's blocks could have reused, against what our
//! verifiers reported reusing (`cached_tokens`). It measures placement:
//! a follow-up placed away from its history reuses less than the oracle.
//!
//! Each turn's prompt is rendered and tokenized as the gateway does (the
//! model's chat template, its BOS rule). What a turn leaves cached is its
//! prompt and its answer; the oracle's reusable tokens for a turn are the
//! longest common prefix, in whole blocks of 16 and short of the last
//! token (the verifier computes that one), with what any turn of the same
//! tenant left before it: an earlier turn, or the same turn of a
//! conversation before it (concurrent ones publish their blocks as they
//! prefill).

use anyhow::Result;
use serde::Serialize;
use specmesh_tokenizer::{ChatMessage, Tokenizer};

use super::build::{Conversation, SYSTEM_PROMPT};
use super::drive::Pass;

/// Tokens per block of the verifiers' prefix cache.
const BLOCK: usize = 16;

/// One pass's reuse against the oracle.
#[derive(Debug, Clone, Serialize)]
pub struct Reuse {
    pub target: String,
    pub concurrency: usize,
    pub repeat: usize,
    /// Prompt tokens the oracle could reuse.
    pub reusable_tokens: usize,
    /// Prompt tokens our verifiers reported reusing.
    pub cached_tokens: usize,
    /// `cached / reusable`.
    pub share: f64,
}

/// The oracle's account of `pass` (ours, with cached tokens reported).
pub fn reuse(
    pass: &Pass,
    conversations: &[Conversation],
    tenants: usize,
    tokenizer: &Tokenizer,
) -> Result<Option<Reuse>> {
    if pass.peer || pass.turns.iter().all(|t| t.cached_tokens.is_none()) {
        return Ok(None);
    }
    let tenants = tenants.max(1);
    // Each answered turn's prompt and what it left cached.
    let mut turns = Vec::new();
    for c in conversations {
        let mut answered: Vec<_> = pass
            .turns
            .iter()
            .filter(|t| t.conversation == c.id)
            .collect();
        answered.sort_by_key(|t| t.turn);
        let mut history = vec![ChatMessage::new("system", SYSTEM_PROMPT)];
        for t in answered {
            history.push(ChatMessage::new("user", c.user_turns[t.turn].clone()));
            let prompt = encode(tokenizer, &history, true)?;
            history.push(ChatMessage::new("assistant", t.text.clone()));
            let left = encode(tokenizer, &history, false)?;
            turns.push((
                c.id % tenants,
                t.turn,
                c.id,
                prompt,
                left,
                t.cached_tokens.unwrap_or(0),
            ));
        }
    }
    let (mut reusable, mut cached) = (0, 0);
    for (tenant, turn, conversation, prompt, _, got) in &turns {
        let limit = prompt.len().saturating_sub(1);
        let best = turns
            .iter()
            .filter(|(t2, turn2, c2, ..)| {
                t2 == tenant && (turn2 < turn || (turn2 == turn && c2 < conversation))
            })
            .map(|(.., left, _)| common(prompt, left).min(limit) / BLOCK * BLOCK)
            .max()
            .unwrap_or(0);
        reusable += best;
        cached += got;
    }
    Ok(Some(Reuse {
        target: pass.target.clone(),
        concurrency: pass.concurrency,
        repeat: pass.repeat,
        reusable_tokens: reusable,
        cached_tokens: cached,
        share: if reusable == 0 {
            0.0
        } else {
            cached as f64 / reusable as f64
        },
    }))
}

fn encode(tokenizer: &Tokenizer, history: &[ChatMessage], open: bool) -> Result<Vec<u32>> {
    let rendered = tokenizer.apply_chat_template(history, open)?;
    Ok(tokenizer.encode_for_model(&rendered)?)
}

fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_prefix_stops_at_the_first_difference() {
        assert_eq!(common(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common(&[1], &[]), 0);
    }
}
