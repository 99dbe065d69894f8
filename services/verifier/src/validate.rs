//! The edge: a `RunRequest`, each field checked on its own ([`RunSpec`],
//! in [`run`](mod@run)), becomes a [`ValidRun`] here, held to this verifier's model and
//! limits. Nothing past this module reads a wire request.

use specmesh_proto::field::check_tokens;
use specmesh_proto::{FieldError, check_top_k, last_step, tree_from_wire, tree_span, v1};
use specmesh_sampling::SamplingParams;
use specmesh_tree::{Sources, TreeLimits};

use crate::error::VerifierError;
use crate::outcome::Outcome;
use crate::step::{Answer, Committed, Drafted};

mod run;

pub use run::{CacheKey, RunSpec};

/// What a run is validated against.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    pub vocab: u32,
    /// The model's context: tokens plus new tokens must fit.
    pub max_context: usize,
    /// The verifier's bound on drafted nodes per tree.
    pub max_draft_tokens: usize,
}

/// A run every later stage may trust.
#[derive(Debug, Clone)]
pub struct ValidRun {
    pub session_id: String,
    pub epoch: u64,
    /// Never empty; every token below the vocabulary.
    pub tokens: Vec<u32>,
    /// In `1..=tokens.len()`.
    pub prompt_len: usize,
    /// At least 1; `tokens.len() + max_new_tokens` fits the context.
    pub max_new_tokens: usize,
    pub params: SamplingParams,
    pub draft: Option<DraftPlan>,
    /// Where the session's kept cache is found.
    pub cache_key: Option<CacheKey>,
    /// Keep the session's KV under `cache_key` when it ends.
    pub keep_cache: bool,
    /// The prefix cache's scope: the tenant and the caller's salt.
    pub tenant: String,
    pub cache_salt: String,
    /// The constraint the output follows, compiled by the service
    /// ([`ValidRun::compile`]) before the run is admitted.
    pub structured: Option<specmesh_grammar::Structured>,
    pub grammar: Option<specmesh_grammar::Grammar>,
    /// Alternatives per committed token's log-probability; `None`: none.
    pub logprobs: Option<usize>,
    /// No end of sequence in this many first tokens.
    pub min_new_tokens: usize,
    pub ignore_eos: bool,
}

/// The drafter a run drafts with.
#[derive(Debug, Clone)]
pub struct DraftPlan {
    pub endpoint: String,
    /// At least 1, at most the verifier's bound.
    pub max_draft_tokens: usize,
    pub tenant: String,
    pub sources: specmesh_tree::Sources,
    /// Where to re-attach the session when the drafter is lost, in order.
    pub fallbacks: Vec<String>,
    /// The caller's predicted output; tokens below the vocabulary, at most
    /// the context.
    pub prediction: Vec<u32>,
}

impl ValidRun {
    /// Validates `r` against `limits`.
    pub fn from_wire(r: v1::RunRequest, limits: RunLimits) -> Result<ValidRun, VerifierError> {
        let spec = RunSpec::try_from(r)?;
        check_tokens("tokens", &spec.tokens, limits.vocab)?;
        let total = spec.tokens.len() + spec.max_new_tokens;
        if total > limits.max_context {
            return Err(FieldError::new(
                "max_new_tokens",
                format!(
                    "({}) + `tokens` ({}) exceed the model's context of {} tokens",
                    spec.max_new_tokens,
                    spec.tokens.len(),
                    limits.max_context
                ),
            )
            .into());
        }
        check_top_k(&spec.sampling, limits.vocab as usize)?;
        if let Some(d) = &spec.draft {
            check_tokens("draft.prediction", &d.prediction, limits.vocab)?;
            if d.prediction.len() > limits.max_context {
                return Err(FieldError::new(
                    "draft.prediction",
                    format!(
                        "is {} tokens, over the model's context of {} tokens",
                        d.prediction.len(),
                        limits.max_context
                    ),
                )
                .into());
            }
        }
        // A plan whose bound is 0 on this verifier drafts nothing: no plan.
        let draft = spec.draft.and_then(|d| {
            let max = d
                .max_draft_tokens
                .map_or(limits.max_draft_tokens, |m| m.min(limits.max_draft_tokens));
            (max > 0).then_some(DraftPlan {
                endpoint: d.endpoint,
                max_draft_tokens: max,
                tenant: d.tenant,
                sources: d.sources,
                fallbacks: d.fallbacks,
                prediction: d.prediction,
            })
        });
        Ok(ValidRun {
            session_id: spec.session_id,
            epoch: spec.epoch,
            tokens: spec.tokens,
            prompt_len: spec.prompt_len,
            max_new_tokens: spec.max_new_tokens,
            params: spec.sampling,
            draft,
            cache_key: spec.cache_key,
            keep_cache: spec.keep_cache,
            tenant: spec.tenant,
            cache_salt: spec.cache_salt,
            structured: spec.structured,
            grammar: None,
            logprobs: spec.logprobs,
            min_new_tokens: spec.min_new_tokens,
            ignore_eos: spec.ignore_eos,
        })
    }

    /// Compiles the run's constraint with `grammars` (cached by its text;
    /// a new one costs milliseconds, so off the runtime's threads) and
    /// checks that the output already committed follows it.
    pub async fn compile(
        &mut self,
        grammars: &std::sync::Arc<specmesh_grammar::Grammars>,
    ) -> Result<(), VerifierError> {
        let Some(spec) = self.structured.clone() else {
            return Ok(());
        };
        let g = std::sync::Arc::clone(grammars);
        let grammar = tokio::task::spawn_blocking(move || g.compile(&spec))
            .await
            .map_err(|e| VerifierError::Internal(format!("compiling the grammar: {e}")))?
            .map_err(|e| VerifierError::invalid("structured", e.to_string()))?;
        grammar
            .start()
            .resume(&self.tokens[self.prompt_len..])
            .map_err(|e| VerifierError::invalid("tokens", e.to_string()))?;
        self.grammar = Some(grammar);
        Ok(())
    }
}

/// A drafter's tree, read within `limits`: [`Answer::Tree`], or
/// [`Answer::Invalid`] saying why the drafter is dropped.
pub fn drafted(wire: v1::TokenTree, limits: TreeLimits) -> Answer {
    let invalid = |e: &dyn std::fmt::Display| {
        Answer::Invalid(format!("the drafter sent an invalid tree: {e}"))
    };
    let span = match tree_span(&wire) {
        Ok(span) => span,
        Err(e) => return invalid(&e),
    };
    if wire.nodes.is_empty() {
        return Answer::Tree(Drafted {
            tree: None,
            last: last_step(wire.step, span),
            drafted_ahead: false,
            drafted_by: None,
            drafting: None,
        });
    }
    match tree_from_wire(&wire, limits) {
        Ok(tree) => Answer::Tree(Drafted {
            tree: Some(tree),
            last: wire.step,
            drafted_ahead: wire.drafted_ahead,
            drafted_by: drafted_by(wire.drafted_by),
            drafting: drafting(&wire),
        }),
        Err(e) => invalid(&e),
    }
}

/// Seconds the drafter computed for a tree; `None` when it did not say
/// (an older drafter).
fn drafting(wire: &v1::TokenTree) -> Option<f64> {
    let micros = u64::from(wire.draft_micros) + u64::from(wire.ahead_micros);
    (micros > 0).then_some(micros as f64 * 1e-6)
}

/// The way of drafting a tree names; `None` (the session's own sources)
/// when unset or a value this verifier does not know, as from a newer
/// drafter: it only steers the planner's calibration.
fn drafted_by(wire: i32) -> Option<Sources> {
    match v1::DraftSources::try_from(wire).ok()? {
        v1::DraftSources::Auto => None,
        known => Some(known.into()),
    }
}

impl From<Committed> for v1::Committed {
    fn from(c: Committed) -> v1::Committed {
        v1::Committed {
            step: c.step,
            tokens: c.tokens,
            drafted: c.drafted,
            accepted: c.accepted,
            finished: c.finished,
            eos: c.eos,
            tree_wait_us: c.tree_wait_us,
            drafted_ahead: c.drafted_ahead,
            forced: c.forced,
            logprobs: c.logprobs.into_iter().map(logprob_to_wire).collect(),
        }
    }
}

fn logprob_to_wire(l: specmesh_verify::TokenLogprobs) -> v1::TokenLogprob {
    v1::TokenLogprob {
        token_id: l.token,
        logprob: l.logprob,
        token: String::new(),
        top_logprobs: l
            .top
            .into_iter()
            .map(|(token_id, logprob)| v1::TokenLogprob {
                token_id,
                logprob,
                ..Default::default()
            })
            .collect(),
    }
}

impl From<Outcome> for v1::StepOutcome {
    fn from(o: Outcome) -> v1::StepOutcome {
        v1::StepOutcome {
            step: o.step,
            path: o.path,
            committed: o.committed,
            forced: o.forced,
            top_k: o
                .top_k
                .into_iter()
                .map(|row| v1::TopTokens {
                    tokens: row.iter().map(|t| t.0).collect(),
                    logprobs: row.iter().map(|t| t.1).collect(),
                })
                .collect(),
            batch_size: o.batch_size,
            span: o.span,
            tree_wait_us: o.tree_wait_us,
            node_budget: o.node_budget,
            pruned: o.granted.is_some(),
            granted: o.granted.unwrap_or_default(),
            forward_us: o.forward_us,
            tree_deadline_us: o.tree_deadline_us,
        }
    }
}

#[cfg(test)]
pub(crate) fn test_plan(endpoint: &str, fallbacks: &[&str]) -> DraftPlan {
    DraftPlan {
        endpoint: endpoint.into(),
        max_draft_tokens: 8,
        tenant: String::new(),
        sources: specmesh_tree::Sources::Auto,
        fallbacks: fallbacks.iter().map(|s| s.to_string()).collect(),
        prediction: Vec::new(),
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RunLimits = RunLimits {
        vocab: 10,
        max_context: 8,
        max_draft_tokens: 16,
    };

    fn request() -> v1::RunRequest {
        v1::RunRequest {
            tokens: vec![1, 2, 3],
            prompt_len: 3,
            max_new_tokens: 5,
            draft: Some(v1::DraftPlan {
                endpoint: "http://127.0.0.1:1".into(),
                max_draft_tokens: 64,
                tenant: String::new(),
                sources: 0,
                fallback_endpoints: Vec::new(),
                prediction: vec![4, 5],
            }),
            ..Default::default()
        }
    }

    fn err(r: v1::RunRequest) -> String {
        ValidRun::from_wire(r, LIMITS).unwrap_err().to_string()
    }

    #[test]
    fn a_run_that_fits_is_valid_and_its_draft_bound_is_clamped() {
        let run = ValidRun::from_wire(request(), LIMITS).unwrap();
        assert_eq!(run.draft.unwrap().max_draft_tokens, 16);
        let mut r = request();
        r.draft.as_mut().unwrap().max_draft_tokens = 0;
        let run = ValidRun::from_wire(r, LIMITS).unwrap();
        assert_eq!(run.draft.unwrap().max_draft_tokens, 16);
        let mut r = request();
        r.draft = None;
        assert!(ValidRun::from_wire(r, LIMITS).unwrap().draft.is_none());
    }

    #[test]
    fn what_the_model_cannot_take_is_refused_with_the_field() {
        let mut r = request();
        r.tokens[1] = 10;
        assert_eq!(err(r), "`tokens[1]` is 10, outside the vocabulary of 10");
        let mut r = request();
        r.max_new_tokens = 6;
        assert_eq!(
            err(r),
            "`max_new_tokens` (6) + `tokens` (3) exceed the model's context of 8 tokens"
        );
        let mut r = request();
        r.sampling = Some(v1::SamplingParams {
            top_k: 11,
            ..Default::default()
        });
        assert!(err(r).starts_with("`sampling.top_k` must be at most the vocabulary size (10)"));
        let mut r = request();
        r.prompt_len = 0;
        assert!(err(r).starts_with("`prompt_len`"));
    }
}
