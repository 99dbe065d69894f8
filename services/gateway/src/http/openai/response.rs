//! OpenAI's response shapes: finish reasons, usage, our speculation
//! statistics and vLLM's, and a choice's log-probabilities.

use serde::Serialize;
use serde_json::{Map, Value};
use specmesh_proto::v1;

/// OpenAI's finish reasons: an EOS and a stop string are both `stop`.
pub fn finish_reason(reason: i32) -> Option<&'static str> {
    match v1::FinishReason::try_from(reason).ok()? {
        v1::FinishReason::Length => Some("length"),
        v1::FinishReason::Eos | v1::FinishReason::Stop => Some("stop"),
        v1::FinishReason::ToolCalls => Some("tool_calls"),
        _ => None,
    }
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: u32,
    pub rejected_prediction_tokens: u32,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV cache was reused, not computed.
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

impl From<v1::Usage> for Usage {
    fn from(u: v1::Usage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            completion_tokens_details: CompletionTokensDetails {
                accepted_prediction_tokens: u.accepted_prediction_tokens,
                rejected_prediction_tokens: u.rejected_prediction_tokens,
            },
        }
    }
}

/// Our extension field `specmesh`: how speculation went.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Speculation {
    pub verify_steps: u32,
    pub drafted_tokens: u32,
    pub accepted_tokens: u32,
    pub mean_accepted_per_step: f64,
    /// Tokens accepted from what `response_format` forced.
    pub forced_tokens: u32,
}

impl From<&v1::SpeculationStats> for Speculation {
    fn from(s: &v1::SpeculationStats) -> Speculation {
        Speculation {
            verify_steps: s.verify_steps,
            drafted_tokens: s.drafted_tokens,
            accepted_tokens: s.accepted_tokens,
            mean_accepted_per_step: s.mean_accepted_per_step,
            forced_tokens: s.forced_tokens,
        }
    }
}

/// vLLM's per-request speculation statistics, `metrics.speculative_decoding`,
/// which benchmark clients read from a response (and a stream's usage
/// chunk; NVIDIA AIPerf's vLLM adapter among them), with vLLM's meanings:
/// `mean_acceptance_length` is 1 + accepted drafts per step (our
/// `mean_accepted_per_step` also counts forced tokens), and the histogram
/// has no fixed draft length (`num_spec_tokens` is absent: trees vary).
pub fn vllm_metrics(s: &v1::SpeculationStats) -> Value {
    let rate = if s.drafted_tokens == 0 {
        0.0
    } else {
        f64::from(s.accepted_tokens) / f64::from(s.drafted_tokens)
    };
    let length = if s.verify_steps == 0 {
        0.0
    } else {
        1.0 + f64::from(s.accepted_tokens) / f64::from(s.verify_steps)
    };
    serde_json::json!({"speculative_decoding": {
        "num_spec_steps": s.verify_steps,
        "num_drafts": s.verify_steps,
        "num_draft_tokens": s.drafted_tokens,
        "num_accepted_draft_tokens": s.accepted_tokens,
        "mean_acceptance_length": length,
        "draft_acceptance_rate": rate,
        "acceptance_rate": rate,
        "acceptance_histogram": s.acceptance_histogram,
        "num_forced_tokens": s.forced_tokens,
    }})
}

/// A choice's `logprobs`: chat's `{"content": [...]}`, or completions'
/// legacy `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`
/// (`offset`: the text's length before these tokens). `null` when none
/// were asked.
pub fn choice_logprobs(l: &[v1::TokenLogprob], chat: bool, asked: bool, offset: usize) -> Value {
    if !asked {
        return Value::Null;
    }
    let bytes = |t: &v1::TokenLogprob| t.token.as_bytes().to_vec();
    if chat {
        let content: Vec<Value> = l
            .iter()
            .map(|t| {
                serde_json::json!({
                    "token": t.token, "logprob": t.logprob, "bytes": bytes(t),
                    "top_logprobs": t.top_logprobs.iter().map(|a| serde_json::json!({
                        "token": a.token, "logprob": a.logprob, "bytes": bytes(a),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        return serde_json::json!({"content": content, "refusal": null});
    }
    let mut at = offset;
    let mut text_offset = Vec::with_capacity(l.len());
    for t in l {
        text_offset.push(at);
        at += t.token.len();
    }
    serde_json::json!({
        "tokens": l.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": l.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": l.iter().map(|t| t.top_logprobs.iter()
            .map(|a| (a.token.clone(), Value::from(a.logprob)))
            .collect::<Map<String, Value>>()).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}
