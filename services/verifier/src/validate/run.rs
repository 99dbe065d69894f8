//! `RunRequest` from the wire: what a run asks, each field checked on its
//! own. [`super::ValidRun::from_wire`] then holds it to the verifier's
//! model (vocabulary, context) and limits.

use specmesh_grammar::Structured;
use specmesh_proto::field::{FieldError, check_id};
use specmesh_proto::{logprobs_from_wire, sources_from_wire, structured_from_wire, v1};
use specmesh_sampling::SamplingParams;
use specmesh_tree::Sources;

/// A `RunRequest` whose fields are each well formed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    pub session_id: String,
    pub epoch: u64,
    /// Prompt then output so far; never empty.
    pub tokens: Vec<u32>,
    /// In `1..=tokens.len()`.
    pub prompt_len: usize,
    /// At least 1.
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Where to draft from; `None` decodes without speculation.
    pub draft: Option<RunDraft>,
    /// Keep the session's KV under this key at its end (and take it at its
    /// start); `None`: no reuse.
    pub cache_key: Option<CacheKey>,
    /// Keep the session's KV under `cache_key` at its end: false without
    /// a key and on a conversation's last turn (`release_cache`).
    pub keep_cache: bool,
    /// The caller's tenant (empty: the anonymous one): the prefix cache's
    /// scope.
    pub tenant: String,
    /// Narrows the prefix cache's scope within the tenant.
    pub cache_salt: String,
    /// The constraint the output follows (not compiled yet).
    pub structured: Option<Structured>,
    /// Alternatives to report with each committed token's log-probability;
    /// `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// No end of sequence in this many first tokens; at most
    /// `max_new_tokens`.
    pub min_new_tokens: usize,
    pub ignore_eos: bool,
}

/// Where a kept KV cache is found: the caller's key, within its tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub tenant: String,
    pub key: String,
}

impl std::fmt::Display for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tenant, self.key)
    }
}

/// The drafter a run is placed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDraft {
    /// A URI (`http://host:port`).
    pub endpoint: String,
    /// The gateway's bound on drafted nodes per tree; `None`: the
    /// verifier's own.
    pub max_draft_tokens: Option<usize>,
    pub tenant: String,
    /// What the drafter drafts with.
    pub sources: Sources,
    /// Drafters to re-attach to when `endpoint` is lost, in order; URIs,
    /// at most [`MAX_FALLBACK_DRAFTERS`].
    pub fallbacks: Vec<String>,
    /// The caller's predicted output (token ids, not checked against a
    /// vocabulary here).
    pub prediction: Vec<u32>,
}

/// Most `DraftPlan.fallback_endpoints` a run may name: more drafters than a
/// gateway would ever list, few enough that cycling through them is cheap.
pub const MAX_FALLBACK_DRAFTERS: usize = 64;

impl TryFrom<v1::RunRequest> for RunSpec {
    type Error = FieldError;

    fn try_from(r: v1::RunRequest) -> Result<RunSpec, FieldError> {
        if r.tokens.is_empty() {
            return Err(FieldError::new("tokens", "must hold at least one token"));
        }
        let prompt_len = r.prompt_len as usize;
        if prompt_len == 0 || prompt_len > r.tokens.len() {
            return Err(FieldError::new(
                "prompt_len",
                format!("must be in 1..={}, got {prompt_len}", r.tokens.len()),
            ));
        }
        if r.max_new_tokens == 0 {
            return Err(FieldError::new("max_new_tokens", "must be >= 1"));
        }
        if r.min_new_tokens > r.max_new_tokens {
            return Err(FieldError::new(
                "min_new_tokens",
                format!(
                    "must be at most `max_new_tokens` ({}), got {}",
                    r.max_new_tokens, r.min_new_tokens
                ),
            ));
        }
        check_id("session_id", &r.session_id)?;
        check_id("cache_key", &r.cache_key)?;
        check_id("tenant", &r.tenant)?;
        check_id("cache_salt", &r.cache_salt)?;
        let sampling = SamplingParams::try_from(r.sampling.unwrap_or_default())?;
        let logprobs = logprobs_from_wire(r.logprobs, r.top_logprobs)?;
        let draft = match r.draft {
            Some(d) if !d.endpoint.is_empty() => {
                if d.endpoint.parse::<tonic::transport::Uri>().is_err() {
                    return Err(FieldError::new(
                        "draft.endpoint",
                        format!("is not a URI: `{}`", d.endpoint),
                    ));
                }
                check_id("draft.tenant", &d.tenant)?;
                let sources = sources_from_wire("draft.sources", d.sources)?;
                if d.fallback_endpoints.len() > MAX_FALLBACK_DRAFTERS {
                    return Err(FieldError::new(
                        "draft.fallback_endpoints",
                        format!(
                            "has {} endpoints, over the limit of {MAX_FALLBACK_DRAFTERS}",
                            d.fallback_endpoints.len()
                        ),
                    ));
                }
                for (i, e) in d.fallback_endpoints.iter().enumerate() {
                    if e.parse::<tonic::transport::Uri>().is_err() {
                        return Err(FieldError::new(
                            format!("draft.fallback_endpoints[{i}]"),
                            format!("is not a URI: `{e}`"),
                        ));
                    }
                }
                Some(RunDraft {
                    sources,
                    endpoint: d.endpoint,
                    fallbacks: d.fallback_endpoints,
                    prediction: d.prediction,
                    max_draft_tokens: (d.max_draft_tokens > 0)
                        .then_some(d.max_draft_tokens as usize),
                    tenant: d.tenant,
                })
            }
            _ => None,
        };
        Ok(RunSpec {
            session_id: r.session_id,
            epoch: r.epoch,
            tokens: r.tokens,
            prompt_len,
            max_new_tokens: r.max_new_tokens as usize,
            sampling,
            draft,
            keep_cache: !r.cache_key.is_empty() && !r.release_cache,
            cache_key: (!r.cache_key.is_empty()).then_some(CacheKey {
                tenant: r.tenant.clone(),
                key: r.cache_key,
            }),
            tenant: r.tenant,
            cache_salt: r.cache_salt,
            structured: structured_from_wire(r.structured),
            logprobs,
            min_new_tokens: r.min_new_tokens as usize,
            ignore_eos: r.ignore_eos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> v1::RunRequest {
        v1::RunRequest {
            session_id: "s".into(),
            tokens: vec![1, 2, 3],
            prompt_len: 2,
            max_new_tokens: 4,
            ..Default::default()
        }
    }

    #[test]
    fn a_well_formed_run_converts() {
        let mut r = request();
        r.draft = Some(v1::DraftPlan {
            endpoint: "http://127.0.0.1:9".into(),
            max_draft_tokens: 0,
            tenant: "t".into(),
            sources: v1::DraftSources::Combined as i32,
            fallback_endpoints: vec!["http://127.0.0.1:10".into()],
            prediction: vec![7, 8],
        });
        let s = RunSpec::try_from(r).unwrap();
        assert_eq!((s.prompt_len, s.max_new_tokens), (2, 4));
        assert_eq!(s.cache_key, None);
        let keyed = RunSpec::try_from(v1::RunRequest {
            cache_key: "chat".into(),
            tenant: "acme".into(),
            ..request()
        })
        .unwrap();
        assert_eq!(
            keyed.cache_key,
            Some(CacheKey {
                tenant: "acme".into(),
                key: "chat".into()
            })
        );
        assert!(keyed.keep_cache && !s.keep_cache);
        let last = RunSpec::try_from(v1::RunRequest {
            cache_key: "chat".into(),
            release_cache: true,
            ..request()
        })
        .unwrap();
        assert!(last.cache_key.is_some() && !last.keep_cache);
        let draft = s.draft.unwrap();
        assert_eq!(draft.max_draft_tokens, None);
        assert_eq!(draft.sources, Sources::Combined);
        assert_eq!(draft.fallbacks, ["http://127.0.0.1:10"]);
        assert_eq!(draft.prediction, [7, 8]);
    }

    #[test]
    fn each_bad_field_is_named() {
        let bad = |f: fn(&mut v1::RunRequest)| {
            let mut r = request();
            f(&mut r);
            RunSpec::try_from(r).unwrap_err().to_string()
        };
        assert_eq!(
            bad(|r| r.tokens.clear()),
            "`tokens` must hold at least one token"
        );
        assert_eq!(
            bad(|r| r.prompt_len = 4),
            "`prompt_len` must be in 1..=3, got 4"
        );
        assert_eq!(
            bad(|r| r.prompt_len = 0),
            "`prompt_len` must be in 1..=3, got 0"
        );
        assert_eq!(
            bad(|r| r.max_new_tokens = 0),
            "`max_new_tokens` must be >= 1"
        );
        assert_eq!(
            bad(|r| r.cache_key = "k".repeat(129)),
            "`cache_key` must be at most 128 bytes, got 129"
        );
        assert_eq!(
            bad(|r| r.cache_salt = "s".repeat(129)),
            "`cache_salt` must be at most 128 bytes, got 129"
        );
        assert_eq!(
            bad(|r| r.tenant = "t".repeat(129)),
            "`tenant` must be at most 128 bytes, got 129"
        );
        assert!(
            bad(|r| r.sampling = Some(v1::SamplingParams {
                top_p: 2.0,
                ..Default::default()
            }))
            .starts_with("`sampling.top_p`")
        );
        assert!(
            bad(|r| r.draft = Some(v1::DraftPlan {
                endpoint: "not a uri".into(),
                ..Default::default()
            }))
            .starts_with("`draft.endpoint` is not a URI")
        );
        assert_eq!(
            bad(|r| r.draft = Some(v1::DraftPlan {
                endpoint: "http://127.0.0.1:9".into(),
                fallback_endpoints: vec!["http://127.0.0.1:10".into(), "a b".into()],
                ..Default::default()
            })),
            "`draft.fallback_endpoints[1]` is not a URI: `a b`"
        );
        assert!(
            bad(|r| r.draft = Some(v1::DraftPlan {
                endpoint: "http://127.0.0.1:9".into(),
                fallback_endpoints: vec!["http://127.0.0.1:10".into(); 65],
                ..Default::default()
            }))
            .starts_with("`draft.fallback_endpoints` has 65 endpoints, over the limit of 64")
        );
        assert!(
            bad(|r| r.draft = Some(v1::DraftPlan {
                endpoint: "http://127.0.0.1:9".into(),
                sources: 9,
                ..Default::default()
            }))
            .starts_with("`draft.sources` is 9, not a DraftSources value")
        );
    }
}
