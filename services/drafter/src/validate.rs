//! The edge: the verifier's `DraftStart` and `StepOutcome` messages become
//! validated [`SessionSpec`] and [`Outcome`] values here, and nothing past
//! this module reads a wire message.
//!
//! A message that breaks the protocol ends the stream with
//! INVALID_ARGUMENT naming the field, rather than being patched up: a
//! verifier that sends a bad path or a token outside the vocabulary has a
//! bug, and drafting on top of a corrupted context would only hide it.

use specmesh_draft::{CostCurve, PolicyError, TenantKey, TokenTree};
use specmesh_proto::v1;

use crate::error::SessionError;

/// The tenant of a start whose `tenant` is empty. A tenant that really is
/// named "anonymous" shares its index; the gateway never issues that name.
pub const ANONYMOUS_TENANT: &str = "anonymous";

/// Longest `session_id` and `tenant`, in bytes: both go into logs and
/// spans, and the tenant is a map key of the global index.
const MAX_ID_BYTES: usize = 256;

/// Drafted nodes per tree, at most, whatever the verifier asks: a bigger
/// tree costs the verifier more than any acceptance pays back.
pub const MAX_DRAFT_TOKENS: usize = 255;

/// Tree depth, at most, whatever the verifier asks.
pub const MAX_DEPTH: usize = 64;

/// Most cost-curve points used: the policy reads the curve a dozen times a
/// step, and a measured curve has about ten points.
pub const MAX_CURVE_POINTS: usize = 64;

/// A validated `DraftStart`.
#[derive(Debug, Clone)]
pub struct SessionSpec {
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

impl SessionSpec {
    /// Validates `start`; contexts longer than `max_context` tokens are
    /// refused.
    pub fn from_wire(
        start: v1::DraftStart,
        max_context: usize,
    ) -> Result<SessionSpec, SessionError> {
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
        } = start;
        for (field, value) in [("start.session_id", &session_id), ("start.tenant", &tenant)] {
            if value.len() > MAX_ID_BYTES {
                let reason = format!("is {} bytes, over the limit of {MAX_ID_BYTES}", value.len());
                return Err(SessionError::invalid(field, reason));
            }
        }
        if vocab_size == 0 {
            return Err(SessionError::invalid(
                "start.vocab_size",
                "must be >= 1, got 0",
            ));
        }
        if tokens.is_empty() {
            return Err(SessionError::invalid(
                "start.tokens",
                "must not be empty: its last token is the first tree's root",
            ));
        }
        if tokens.len() > max_context {
            let reason = format!(
                "has {} tokens, over the drafter's context limit of {max_context}",
                tokens.len()
            );
            return Err(SessionError::invalid("start.tokens", reason));
        }
        check_tokens("start.tokens", &tokens, vocab_size)?;
        let prompt_len = prompt_len as usize;
        if prompt_len > tokens.len() {
            let reason = format!(
                "is {prompt_len}, more than the {} tokens sent",
                tokens.len()
            );
            return Err(SessionError::invalid("start.prompt_len", reason));
        }
        let (curve, curve_fallback) = match curve_from_wire(&cost_curve) {
            Ok(curve) => (curve, None),
            Err(why) => (CostCurve::cpu_default(), Some(why)),
        };
        let tenant = if tenant.is_empty() {
            TenantKey::new(ANONYMOUS_TENANT)
        } else {
            TenantKey::from(tenant)
        };
        Ok(SessionSpec {
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

/// Refuses the first token of `tokens` at or above `vocab`.
fn check_tokens(field: &str, tokens: &[u32], vocab: u32) -> Result<(), SessionError> {
    match tokens.iter().position(|&t| t >= vocab) {
        Some(i) => Err(SessionError::invalid(
            format!("{field}[{i}]"),
            format!("is {}, outside the vocabulary of {vocab}", tokens[i]),
        )),
        None => Ok(()),
    }
}

/// A validated `StepOutcome`, checked against the tree it reports on.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub step: u64,
    /// A root-to-node path of that tree, `[0]` when nothing was accepted;
    /// empty when the verifier did not verify this drafter's tree.
    pub path: Vec<usize>,
    /// Never empty; every token below the vocabulary; when `path` is set,
    /// it starts with the path's drafted tokens and is no longer than it.
    pub committed: Vec<u32>,
    /// The target's top tokens after each path node, as (token,
    /// log-probability); at most one row per path node (one when the path
    /// is empty: the root's).
    pub top_k: Vec<Vec<(u32, f32)>>,
    /// The verifier's batch size that step, at least 1.
    pub batch_size: usize,
}

impl Outcome {
    /// Validates `o`, which reports on `tree` (the tree sent for `o.step`).
    pub fn from_wire(
        o: v1::StepOutcome,
        tree: &TokenTree,
        vocab: u32,
    ) -> Result<Outcome, SessionError> {
        let path = check_path(&o.path, tree)?;
        if o.committed.is_empty() {
            return Err(SessionError::invalid(
                "outcome.committed",
                "must not be empty: every step commits at least the target's own token",
            ));
        }
        check_tokens("outcome.committed", &o.committed, vocab)?;
        if !path.is_empty() {
            check_committed_follows_path(&o.committed, &path, tree)?;
        }
        let top_k = top_k_from_wire(o.top_k, path.len().max(1), "path node", vocab)?;
        Ok(Outcome {
            step: o.step,
            path,
            committed: o.committed,
            top_k,
            batch_size: (o.batch_size as usize).max(1),
        })
    }
}

/// A validated `StepOutcome` reporting `steps` steps that verified the root
/// alone, the steps of a tree with no nodes and a `span` (or some of them).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanOutcome {
    /// One token per step, in order: each step's own.
    pub committed: Vec<u32>,
    /// The root's top tokens of each step, in order, as (token,
    /// log-probability); at most one row per step.
    pub top_k: Vec<Vec<(u32, f32)>>,
    /// The verifier's batch size at the last step, at least 1.
    pub batch_size: usize,
}

impl SpanOutcome {
    /// Validates `o`, which reports `steps` root-only steps (at least 1).
    pub fn from_wire(
        o: v1::StepOutcome,
        steps: usize,
        vocab: u32,
    ) -> Result<SpanOutcome, SessionError> {
        // A root-only step's path is its root, which a verifier may name
        // (`[0]`) or leave out, as it does for any tree with no nodes.
        let root_path = o.path.is_empty() || (steps == 1 && o.path == [0]);
        if !root_path {
            let reason = format!(
                "is {:?}, but the steps reported verified the root alone: it must be empty",
                o.path
            );
            return Err(SessionError::invalid("outcome.path", reason));
        }
        if o.committed.len() != steps {
            let reason = format!(
                "has {} tokens, but the outcome reports {steps} steps that verified the root \
                 alone: one token each",
                o.committed.len()
            );
            return Err(SessionError::invalid("outcome.committed", reason));
        }
        check_tokens("outcome.committed", &o.committed, vocab)?;
        let top_k = top_k_from_wire(o.top_k, steps, "step reported", vocab)?;
        Ok(SpanOutcome {
            committed: o.committed,
            top_k,
            batch_size: (o.batch_size as usize).max(1),
        })
    }
}

fn check_path(wire: &[u32], tree: &TokenTree) -> Result<Vec<usize>, SessionError> {
    let mut path = Vec::with_capacity(wire.len());
    for (j, &node) in wire.iter().enumerate() {
        let node = node as usize;
        let field = || format!("outcome.path[{j}]");
        if node >= tree.len() {
            let reason = format!("is {node}, but the tree has {} nodes", tree.len());
            return Err(SessionError::invalid(field(), reason));
        }
        let expected_parent = path.last().copied();
        if tree.parent(node) != expected_parent {
            let reason = match expected_parent {
                None => format!("is {node}: a path starts at the root, node 0"),
                Some(p) => format!("is {node}, which is not a child of node {p}"),
            };
            return Err(SessionError::invalid(field(), reason));
        }
        path.push(node);
    }
    Ok(path)
}

/// The committed tokens are the accepted drafted tokens then the target's
/// own, so they must repeat the path's tokens (and may be cut short only
/// when a stop rule ended the session mid-path).
fn check_committed_follows_path(
    committed: &[u32],
    path: &[usize],
    tree: &TokenTree,
) -> Result<(), SessionError> {
    if committed.len() > path.len() {
        let reason = format!(
            "has {} tokens but the path accepts {}: at most one more than the accepted nodes",
            committed.len(),
            path.len() - 1
        );
        return Err(SessionError::invalid("outcome.committed", reason));
    }
    for (i, (&c, &node)) in committed.iter().zip(&path[1..]).enumerate() {
        if c != tree.token(node) {
            let reason = format!(
                "is {c}, but the accepted node {node} has token {}",
                tree.token(node)
            );
            return Err(SessionError::invalid(
                format!("outcome.committed[{i}]"),
                reason,
            ));
        }
    }
    Ok(())
}

/// The top-k rows of an outcome, at most `max_rows`, one per `what`.
fn top_k_from_wire(
    rows: Vec<v1::TopTokens>,
    max_rows: usize,
    what: &str,
    vocab: u32,
) -> Result<Vec<Vec<(u32, f32)>>, SessionError> {
    if rows.len() > max_rows {
        let reason = format!(
            "has {} rows, more than {max_rows}: one per {what}",
            rows.len()
        );
        return Err(SessionError::invalid("outcome.top_k", reason));
    }
    rows.into_iter()
        .enumerate()
        .map(|(j, row)| {
            if row.tokens.len() != row.logprobs.len() {
                let reason = format!(
                    "has {} tokens but {} logprobs",
                    row.tokens.len(),
                    row.logprobs.len()
                );
                return Err(SessionError::invalid(format!("outcome.top_k[{j}]"), reason));
            }
            check_tokens(&format!("outcome.top_k[{j}].tokens"), &row.tokens, vocab)?;
            if let Some(i) = row.logprobs.iter().position(|p| p.is_nan()) {
                return Err(SessionError::invalid(
                    format!("outcome.top_k[{j}].logprobs[{i}]"),
                    "is NaN",
                ));
            }
            Ok(row.tokens.into_iter().zip(row.logprobs).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use specmesh_draft::TreeLimits;
    use specmesh_tree::TreeBuilder;

    use super::*;

    fn start() -> v1::DraftStart {
        v1::DraftStart {
            session_id: "s".into(),
            tokens: vec![1, 2, 3],
            prompt_len: 2,
            vocab_size: 10,
            max_draft_tokens: 8,
            max_depth: 4,
            ..Default::default()
        }
    }

    fn err(r: Result<SessionSpec, SessionError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn a_good_start_becomes_a_spec_with_the_default_curve() {
        let s = SessionSpec::from_wire(start(), 100).unwrap();
        assert_eq!(s.tenant.as_str(), ANONYMOUS_TENANT);
        assert_eq!(s.curve, CostCurve::cpu_default());
        assert_eq!(s.curve_fallback, Some(CurveFallback::Missing));
        assert_eq!((s.prompt_len, s.vocab), (2, 10));
    }

    #[test]
    fn bad_starts_name_the_field() {
        let bad = |f: fn(&mut v1::DraftStart)| {
            let mut s = start();
            f(&mut s);
            err(SessionSpec::from_wire(s, 100))
        };
        assert!(bad(|s| s.tokens.clear()).starts_with("`start.tokens` must not be empty"));
        assert_eq!(
            bad(|s| s.vocab_size = 0),
            "`start.vocab_size` must be >= 1, got 0"
        );
        assert_eq!(
            bad(|s| s.tokens[1] = 10),
            "`start.tokens[1]` is 10, outside the vocabulary of 10"
        );
        assert!(bad(|s| s.prompt_len = 4).starts_with("`start.prompt_len` is 4"));
        assert!(bad(|s| s.tenant = "t".repeat(300)).starts_with("`start.tenant` is 300 bytes"));
        let long = SessionSpec::from_wire(start(), 2);
        assert!(err(long).contains("over the drafter's context limit of 2"));
    }

    #[test]
    fn an_invalid_curve_falls_back_and_says_why() {
        let mut s = start();
        s.cost_curve = vec![
            v1::CostPoint {
                tokens: 1,
                relative_cost: 1.0,
            },
            v1::CostPoint {
                tokens: 4,
                relative_cost: 0.5,
            },
        ];
        let s = SessionSpec::from_wire(s, 100).unwrap();
        assert_eq!(s.curve, CostCurve::cpu_default());
        assert!(matches!(
            s.curve_fallback,
            Some(CurveFallback::Invalid(PolicyError::DecreasingCost { .. }))
        ));
    }

    /// root 5 ─┬─ 6 ── 7
    ///         └─ 8
    fn tree() -> TokenTree {
        let mut b = TreeBuilder::new(5, TreeLimits::new(8, 4, 10)).unwrap();
        let a = b.push(0, 6, 0.9).unwrap();
        b.push(a, 7, 0.8).unwrap();
        b.push(0, 8, 0.3).unwrap();
        b.build()
    }

    fn outcome(path: Vec<u32>, committed: Vec<u32>) -> v1::StepOutcome {
        v1::StepOutcome {
            path,
            committed,
            ..Default::default()
        }
    }

    fn row(tokens: Vec<u32>) -> v1::TopTokens {
        v1::TopTokens {
            logprobs: vec![-1.0; tokens.len()],
            tokens,
        }
    }

    #[test]
    fn a_span_outcome_has_one_token_per_step() {
        let mut w = outcome(vec![], vec![4, 5, 6]);
        w.top_k = vec![row(vec![4]), row(vec![5, 1]), row(vec![6])];
        let o = SpanOutcome::from_wire(w, 3, 10).unwrap();
        assert_eq!(o.committed, [4, 5, 6]);
        assert_eq!(o.top_k[1], [(5, -1.0), (1, -1.0)]);
        assert_eq!(o.batch_size, 1);
        // One step may name its root as the path.
        assert!(SpanOutcome::from_wire(outcome(vec![0], vec![4]), 1, 10).is_ok());
    }

    #[test]
    fn bad_span_outcomes_name_the_field() {
        let bad = |o, steps| {
            SpanOutcome::from_wire(o, steps, 10)
                .unwrap_err()
                .to_string()
        };
        assert!(bad(outcome(vec![0], vec![4, 5]), 2).starts_with("`outcome.path` is [0]"));
        assert!(bad(outcome(vec![0, 1], vec![4]), 1).starts_with("`outcome.path`"));
        assert!(
            bad(outcome(vec![], vec![4, 5]), 3)
                .starts_with("`outcome.committed` has 2 tokens, but the outcome reports 3 steps")
        );
        assert_eq!(
            bad(outcome(vec![], vec![4, 10]), 2),
            "`outcome.committed[1]` is 10, outside the vocabulary of 10"
        );
        let mut w = outcome(vec![], vec![4, 5]);
        w.top_k = vec![row(vec![1]), row(vec![2]), row(vec![3])];
        assert_eq!(
            bad(w, 2),
            "`outcome.top_k` has 3 rows, more than 2: one per step reported"
        );
    }

    #[test]
    fn a_good_outcome_is_accepted() {
        let o = Outcome::from_wire(outcome(vec![0, 1, 2], vec![6, 7, 9]), &tree(), 10).unwrap();
        assert_eq!(o.path, [0, 1, 2]);
        assert_eq!(o.batch_size, 1);
        // Not our tree: any committed tokens, one top-k row (the root's).
        let mut w = outcome(vec![], vec![4]);
        w.top_k = vec![v1::TopTokens {
            tokens: vec![4, 3],
            logprobs: vec![-0.1, -3.0],
        }];
        let o = Outcome::from_wire(w, &tree(), 10).unwrap();
        assert_eq!(o.top_k, [vec![(4, -0.1), (3, -3.0)]]);
    }

    #[test]
    fn bad_outcomes_name_the_field() {
        let bad = |o| Outcome::from_wire(o, &tree(), 10).unwrap_err().to_string();
        assert_eq!(
            bad(outcome(vec![0, 9], vec![1])),
            "`outcome.path[1]` is 9, but the tree has 4 nodes"
        );
        assert!(bad(outcome(vec![1], vec![1])).contains("starts at the root"));
        assert!(bad(outcome(vec![0, 2], vec![1])).contains("not a child of node 0"));
        assert!(bad(outcome(vec![0], vec![])).starts_with("`outcome.committed` must not be empty"));
        assert_eq!(
            bad(outcome(vec![], vec![3, 12])),
            "`outcome.committed[1]` is 12, outside the vocabulary of 10"
        );
        assert!(bad(outcome(vec![0, 1], vec![8, 1])).starts_with("`outcome.committed[0]` is 8"));
        assert!(bad(outcome(vec![0, 1], vec![6, 1, 2])).starts_with("`outcome.committed` has 3"));
        let mut o = outcome(vec![0], vec![1]);
        o.top_k = vec![v1::TopTokens {
            tokens: vec![1],
            logprobs: vec![f32::NAN],
        }];
        assert_eq!(bad(o), "`outcome.top_k[0].logprobs[0]` is NaN");
    }
}
