//! `DraftStart` from the wire: the session a verifier asks this drafter
//! to draft for, each field checked on its own. [`super::start`] then
//! holds it to the drafter's own limits (context length).

use specmesh_draft::{CostCurve, PolicyError, Sources, TenantKey};
use specmesh_proto::field::{FieldError, check_id, check_tokens};
use specmesh_proto::limits::{MAX_CURVE_POINTS, MAX_DEPTH, MAX_DRAFT_TOKENS};
use specmesh_proto::{check_top_k, sources_from_wire, v1};
use specmesh_sampling::SamplingParams;

/// Longest `target_model` accepted: a path, with room to spare.
pub const MAX_MODEL_NAME_BYTES: usize = 4096;

/// The tenant of a start whose `tenant` is empty. A tenant that really is
/// named "anonymous" shares its index; the gateway never issues that name.
pub const ANONYMOUS_TENANT: &str = "anonymous";

/// Largest `DraftStart.first_step`: a session takes at most one step per
/// token of its context, so a step past this is a bug, and the bound keeps
/// step arithmetic (spans, their last step) far from overflow.
pub const MAX_FIRST_STEP: u64 = u32::MAX as u64;

/// A validated `DraftStart`.
#[derive(Debug, Clone)]
pub struct StartSpec {
    pub session_id: String,
    pub epoch: u64,
    pub tenant: TenantKey,
    /// Prompt then committed output; never empty, every token below `vocab`.
    pub tokens: Vec<u32>,
    /// At most `tokens.len()`.
    pub prompt_len: usize,
    /// At least 1.
    pub vocab: u32,
    /// The verifier's node bound, clamped to [`MAX_DRAFT_TOKENS`]; 0 means
    /// every tree is the root alone.
    pub max_draft_tokens: usize,
    /// The verifier's depth bound, clamped to [`MAX_DEPTH`].
    pub max_depth: usize,
    /// The verifier's cost curve, or [`CostCurve::cpu_default`].
    pub curve: CostCurve,
    /// Why `curve` is the default, when it is.
    pub curve_fallback: Option<CurveFallback>,
    /// The request's sampling; greedy when unset. Its `top_k` is at most
    /// `vocab`.
    pub sampling: SamplingParams,
    /// What to draft with.
    pub sources: Sources,
    /// The target model the verifier holds.
    pub target: TargetModel,
    /// The verifier's batch as the session starts, at least 1.
    pub batch_size: usize,
    /// The step of the first tree: 0 at a session's start, later when the
    /// verifier re-attaches a running session (see `DraftStart.first_step`).
    pub first_step: u64,
    /// The caller's predicted output; every token below `vocab`; may be
    /// empty.
    pub prediction: Vec<u32>,
    /// The session's output ends within this many tokens past
    /// `prompt_len`; `None`: unknown.
    pub max_new_tokens: Option<usize>,
    /// Where the draft model's KV of this session may be found and shared.
    pub cache_scope: CacheScope,
}

/// The scope of a prefix cache as the gateway hashes it: the tenant as
/// sent (empty for the anonymous tenant, unlike [`StartSpec::tenant`]) and
/// the request's `cache_salt`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheScope {
    pub tenant: String,
    pub salt: String,
}

/// The verifier's target model, as a drafter checks its draft model
/// against it.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetModel {
    /// As the verifier was told it (a catalog name or a path); may be
    /// empty (an older verifier).
    pub name: String,
    /// Fingerprint of the target's vocabulary, when the verifier sent one.
    pub vocab_fingerprint: Option<u64>,
    /// Seconds of one target forward over one token, when sent.
    pub step_seconds: Option<f64>,
}

impl TargetModel {
    /// The name for messages: "the target" when the verifier sent none.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            "the verifier's target"
        } else {
            &self.name
        }
    }
}

/// Why a session runs on the default cost curve.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CurveFallback {
    #[error("the verifier sent no cost curve")]
    Missing,
    #[error("the verifier's cost curve has {0} points, over the limit of {MAX_CURVE_POINTS}")]
    TooManyPoints(usize),
    #[error("the verifier's cost curve is invalid: {0}")]
    Invalid(#[from] PolicyError),
}

impl TryFrom<v1::DraftStart> for StartSpec {
    type Error = FieldError;

    fn try_from(start: v1::DraftStart) -> Result<StartSpec, FieldError> {
        let v1::DraftStart {
            session_id,
            epoch,
            tenant,
            tokens,
            prompt_len,
            vocab_size,
            max_draft_tokens,
            max_depth,
            cost_curve,
            sampling,
            sources,
            target_model,
            target_vocab_fingerprint,
            target_step_seconds,
            batch_size,
            first_step,
            prediction,
            max_new_tokens,
            cache_salt,
        } = start;
        check_id("start.session_id", &session_id)?;
        check_id("start.tenant", &tenant)?;
        check_id("start.cache_salt", &cache_salt)?;
        let sources = sources_from_wire("start.sources", sources)?;
        if target_model.len() > MAX_MODEL_NAME_BYTES {
            return Err(FieldError::new(
                "start.target_model",
                format!(
                    "is {} bytes long, over the limit of {MAX_MODEL_NAME_BYTES}",
                    target_model.len()
                ),
            ));
        }
        if !(target_step_seconds.is_finite() && target_step_seconds >= 0.0) {
            return Err(FieldError::new(
                "start.target_step_seconds",
                format!("is {target_step_seconds}: must be a finite number >= 0 (0: unknown)"),
            ));
        }
        let target = TargetModel {
            name: target_model,
            vocab_fingerprint: (target_vocab_fingerprint != 0).then_some(target_vocab_fingerprint),
            step_seconds: (target_step_seconds > 0.0).then_some(target_step_seconds),
        };
        if first_step > MAX_FIRST_STEP {
            return Err(FieldError::new(
                "start.first_step",
                format!("is {first_step}, over the limit of {MAX_FIRST_STEP}"),
            ));
        }
        if vocab_size == 0 {
            return Err(FieldError::new("start.vocab_size", "must be >= 1, got 0"));
        }
        if tokens.is_empty() {
            return Err(FieldError::new(
                "start.tokens",
                "must not be empty: its last token is the first tree's root",
            ));
        }
        check_tokens("start.tokens", &tokens, vocab_size)?;
        check_tokens("start.prediction", &prediction, vocab_size)?;
        let prompt_len = prompt_len as usize;
        if prompt_len > tokens.len() {
            return Err(FieldError::new(
                "start.prompt_len",
                format!(
                    "is {prompt_len}, more than the {} tokens sent",
                    tokens.len()
                ),
            ));
        }
        let sampling = SamplingParams::try_from(sampling.unwrap_or_default())
            .map_err(|e| FieldError::new(format!("start.{}", e.field), e.reason))?;
        check_top_k(&sampling, vocab_size as usize)
            .map_err(|e| FieldError::new(format!("start.{}", e.field), e.reason))?;
        let (curve, curve_fallback) = match curve_from_wire(&cost_curve) {
            Ok(curve) => (curve, None),
            Err(why) => (CostCurve::cpu_default(), Some(why)),
        };
        let cache_scope = CacheScope {
            tenant: tenant.clone(),
            salt: cache_salt,
        };
        let tenant = if tenant.is_empty() {
            TenantKey::new(ANONYMOUS_TENANT)
        } else {
            TenantKey::from(tenant)
        };
        Ok(StartSpec {
            session_id,
            epoch,
            tenant,
            tokens,
            prompt_len,
            vocab: vocab_size,
            max_draft_tokens: (max_draft_tokens as usize).min(MAX_DRAFT_TOKENS),
            max_depth: (max_depth as usize).min(MAX_DEPTH),
            curve,
            curve_fallback,
            sampling,
            sources,
            target,
            batch_size: (batch_size as usize).max(1),
            first_step,
            prediction,
            max_new_tokens: (max_new_tokens > 0).then_some(max_new_tokens as usize),
            cache_scope,
        })
    }
}

fn curve_from_wire(points: &[v1::CostPoint]) -> Result<CostCurve, CurveFallback> {
    if points.is_empty() {
        return Err(CurveFallback::Missing);
    }
    if points.len() > MAX_CURVE_POINTS {
        return Err(CurveFallback::TooManyPoints(points.len()));
    }
    let points = points
        .iter()
        .map(|p| (p.tokens as usize, p.relative_cost))
        .collect();
    Ok(CostCurve::new(points)?)
}
