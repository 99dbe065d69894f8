//! What the decode loop sends a verifier and the caller: the `RunRequest`
//! that (re)starts a session after what was committed, and the final
//! token counts.

use specmesh_proto::v1::{self, DraftPlan, RunRequest, Usage};

use super::RequestContext;
use crate::placement::Placement;
use crate::validate::ValidGenerateRequest;

/// Token counts, the prompt's cached ones among them; with a prediction,
/// how much of it the output used (its tokens in the longest common
/// subsequence with the output).
pub(super) fn usage(
    request: &ValidGenerateRequest,
    output: &[u32],
    completion_tokens: u32,
    cached_tokens: u32,
) -> Usage {
    let accepted = crate::spec_stats::common_subsequence(&request.prediction, output);
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Usage {
        prompt_tokens: request.prompt_len(),
        completion_tokens,
        accepted_prediction_tokens: count(accepted),
        rejected_prediction_tokens: count(request.prediction.len() - accepted),
        cached_tokens,
    }
}

/// The `RunRequest` resuming after `committed` (empty on the first try).
pub(super) fn run_request(
    request: &ValidGenerateRequest,
    ctx: &RequestContext,
    placement: &Placement,
    committed: &[u32],
) -> RunRequest {
    let mut tokens = Vec::with_capacity(request.prompt_tokens.len() + committed.len());
    tokens.extend_from_slice(&request.prompt_tokens);
    tokens.extend_from_slice(committed);
    let done = u32::try_from(committed.len()).unwrap_or(u32::MAX);
    RunRequest {
        session_id: request
            .session_id
            .clone()
            .unwrap_or_else(|| ctx.request_id.clone()),
        epoch: placement.epoch,
        tokens,
        prompt_len: request.prompt_len(),
        max_new_tokens: request.max_new_tokens.saturating_sub(done),
        sampling: Some(v1::SamplingParams::from(&request.sampling)),
        draft: placement.drafter.as_ref().map(|endpoint| DraftPlan {
            endpoint: endpoint.clone(),
            max_draft_tokens: request.speculation.max_draft_tokens,
            tenant: request.tenant.clone(),
            sources: request.speculation.sources() as i32,
            fallback_endpoints: placement.fallback_drafters.clone(),
            prediction: request.prediction.clone(),
        }),
        // Reuse is by prefix within the tenant (and salt); the session's
        // key matters to verifiers whose prefix cache is off.
        cache_key: request.session_id.clone().unwrap_or_default(),
        tenant: request.tenant.clone(),
        release_cache: request.end_session,
        cache_salt: request.cache_salt.clone(),
        structured: request
            .structured
            .as_ref()
            .map(specmesh_proto::structured_to_wire),
        logprobs: request.logprobs.is_some(),
        top_logprobs: request.logprobs.unwrap_or(0) as u32,
        min_new_tokens: request.min_new_tokens.saturating_sub(done),
        ignore_eos: request.ignore_eos,
    }
}

/// The request asks what only verifiers serving
/// [`specmesh_server::capability::STRUCTURED`] honour.
pub(super) fn needs_capability(request: &ValidGenerateRequest) -> bool {
    request.structured.is_some()
        || request.logprobs.is_some()
        || request.min_new_tokens > 0
        || request.ignore_eos
}
