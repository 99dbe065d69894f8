//! The edge: the verifier's `DraftStart` and `StepOutcome` messages become
//! validated [`StartSpec`] (converted by `specmesh_proto`, then held to
//! this drafter's context limit) and [`Report`] values here (tokens within
//! the vocabulary, top-k rows whole), and nothing past this module reads a
//! wire message. What a report says is then checked against the tree it
//! reports on ([`Outcome`], [`SpanOutcome`]), and a tree to send is written
//! as its message ([`SentTree`]).
//!
//! A message that breaks the protocol ends the stream with
//! INVALID_ARGUMENT naming the field, rather than being patched up: a
//! verifier that sends a bad path or a token outside the vocabulary has a
//! bug, and drafting on top of a corrupted context would only hide it.

use specmesh_draft::TokenTree;
use specmesh_proto::field::check_tokens;
use specmesh_proto::{StartSpec, tree_to_wire, v1};

use crate::error::DrafterError;

/// Validates `start`; contexts (and predictions) longer than
/// `max_context` tokens are refused.
pub fn start(start: v1::DraftStart, max_context: usize) -> Result<StartSpec, DrafterError> {
    if start.tokens.len() > max_context {
        let reason = format!(
            "has {} tokens, over the drafter's context limit of {max_context}",
            start.tokens.len()
        );
        return Err(DrafterError::invalid("start.tokens", reason));
    }
    if start.prediction.len() > max_context {
        let reason = format!(
            "has {} tokens, over the drafter's context limit of {max_context}",
            start.prediction.len()
        );
        return Err(DrafterError::invalid("start.prediction", reason));
    }
    Ok(StartSpec::try_from(start)?)
}

/// A `StepOutcome` as read at the edge: every token below the vocabulary,
/// every top-k row as many tokens as log-probabilities and no NaN. Whether
/// it fits what was sent is the session's to check.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// The last step reported, and how many steps (at least 1).
    pub step: u64,
    pub span: u64,
    /// The accepted path in the reported tree's nodes.
    pub path: Vec<u32>,
    pub committed: Vec<u32>,
    /// (token, log-probability) rows.
    pub top_k: Vec<Vec<(u32, f32)>>,
    pub batch_size: u32,
    /// Microseconds the verifier waited for the tree, the forward's, and
    /// how long after it the verifier waits for the next tree.
    pub tree_wait_us: u64,
    pub forward_us: u32,
    pub tree_deadline_us: u32,
    /// The planner's forecast for the next tree.
    pub node_budget: Option<u32>,
    /// The verified nodes when only part of the tree was (`None`: all).
    pub granted: Option<Vec<u32>>,
}

impl Report {
    /// Reads `o` for a session of vocabulary `vocab`.
    pub fn from_wire(o: v1::StepOutcome, vocab: u32) -> Result<Report, DrafterError> {
        check_tokens("outcome.committed", &o.committed, vocab)?;
        let granted = if o.pruned {
            Some(o.granted)
        } else if !o.granted.is_empty() {
            return Err(DrafterError::invalid(
                "outcome.granted",
                "lists nodes, but `pruned` is false: the whole tree was verified",
            ));
        } else {
            None
        };
        Ok(Report {
            step: o.step,
            span: u64::from(o.span.max(1)),
            path: o.path,
            committed: o.committed,
            top_k: top_k_from_wire(o.top_k, vocab)?,
            batch_size: o.batch_size,
            tree_wait_us: o.tree_wait_us,
            forward_us: o.forward_us,
            tree_deadline_us: o.tree_deadline_us,
            node_budget: o.node_budget,
            granted,
        })
    }
}

/// A tree to send, as the session planned it.
#[derive(Debug, Clone, PartialEq)]
pub struct SentTree {
    pub epoch: u64,
    /// The step it is for; a tree with no nodes stands for `span` steps.
    pub step: u64,
    pub span: u32,
    /// Its nodes (the root alone when nothing was drafted); `None`: a run
    /// of steps sent ahead, whose root the drafter does not know yet.
    pub tree: Option<TokenTree>,
    /// Drafted ahead of the outcome before it.
    pub drafted_ahead: bool,
}

impl From<&SentTree> for v1::TokenTree {
    fn from(t: &SentTree) -> v1::TokenTree {
        match &t.tree {
            Some(tree) => v1::TokenTree {
                drafted_ahead: t.drafted_ahead,
                ..tree_to_wire(tree, t.epoch, t.step)
            },
            None => v1::TokenTree {
                epoch: t.epoch,
                step: t.step,
                span: t.span,
                ..Default::default()
            },
        }
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
    /// The part of the tree the verifier verified, when it verified only
    /// part of it (its goodput planner's grant).
    pub pruned: Option<Pruned>,
    /// Drafted nodes the verifier expects to grant the next tree; `None`:
    /// no forecast (the verifier plans no budget).
    pub node_budget: Option<usize>,
}

/// The nodes of a tree the verifier verified, as a tree of their own: what
/// the drafter learns from, since nodes left out were never judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Pruned {
    pub tree: TokenTree,
    /// The accepted path in `tree`'s indices, `[0]` when nothing was
    /// accepted.
    pub path: Vec<usize>,
}

impl Outcome {
    /// Checks `o` against `tree` (the tree sent for `o.step`).
    pub fn from_report(o: Report, tree: &TokenTree) -> Result<Outcome, DrafterError> {
        let path = check_path(&o.path, tree)?;
        if o.committed.is_empty() {
            return Err(DrafterError::invalid(
                "outcome.committed",
                "must not be empty: every step commits at least the target's own token",
            ));
        }
        if !path.is_empty() {
            check_committed_follows_path(&o.committed, &path, tree)?;
        }
        check_rows(&o.top_k, path.len().max(1), "path node")?;
        let pruned = match &o.granted {
            Some(granted) => Some(check_pruned(granted, &path, tree)?),
            None => None,
        };
        let top_k = o.top_k;
        Ok(Outcome {
            step: o.step,
            path,
            committed: o.committed,
            top_k,
            batch_size: (o.batch_size as usize).max(1),
            pruned,
            node_budget: o.node_budget.map(|b| b as usize),
        })
    }
}

/// The verified part of `tree`: `granted` must be ascending drafted nodes
/// of it, ancestor-closed, holding every node of the accepted `path`.
fn check_pruned(granted: &[u32], path: &[usize], tree: &TokenTree) -> Result<Pruned, DrafterError> {
    if let Some(w) = granted.windows(2).find(|w| w[1] <= w[0]) {
        let reason = format!("lists {} after {}: nodes must be ascending", w[1], w[0]);
        return Err(DrafterError::invalid("outcome.granted", reason));
    }
    if granted.first() == Some(&0) {
        return Err(DrafterError::invalid(
            "outcome.granted",
            "lists node 0: the root is always verified and is not listed",
        ));
    }
    let (pruned, kept) = tree.retain_listed(granted).map_err(|e| {
        DrafterError::invalid(
            "outcome.granted",
            format!("is not an ancestor-closed set of the tree's nodes: {e}"),
        )
    })?;
    let mut mapped = Vec::with_capacity(path.len());
    for &node in path {
        match kept.binary_search(&node) {
            Ok(i) => mapped.push(i),
            Err(_) => {
                let reason = format!("holds node {node}, which `granted` does not list");
                return Err(DrafterError::invalid("outcome.path", reason));
            }
        }
    }
    Ok(Pruned {
        tree: pruned,
        path: mapped,
    })
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
    /// See [`Outcome::node_budget`].
    pub node_budget: Option<usize>,
}

impl SpanOutcome {
    /// Checks `o`, which reports `steps` root-only steps (at least 1).
    pub fn from_report(o: Report, steps: usize) -> Result<SpanOutcome, DrafterError> {
        // A root-only step's path is its root, which a verifier may name
        // (`[0]`) or leave out, as it does for any tree with no nodes.
        let root_path = o.path.is_empty() || (steps == 1 && o.path == [0]);
        if !root_path {
            let reason = format!(
                "is {:?}, but the steps reported verified the root alone: it must be empty",
                o.path
            );
            return Err(DrafterError::invalid("outcome.path", reason));
        }
        if o.committed.len() != steps {
            let reason = format!(
                "has {} tokens, but the outcome reports {steps} steps that verified the root \
                 alone: one token each",
                o.committed.len()
            );
            return Err(DrafterError::invalid("outcome.committed", reason));
        }
        check_rows(&o.top_k, steps, "step reported")?;
        let top_k = o.top_k;
        if o.granted.is_some() {
            return Err(DrafterError::invalid(
                "outcome.granted",
                "is set, but the steps reported verified the root alone: nothing to prune",
            ));
        }
        Ok(SpanOutcome {
            committed: o.committed,
            top_k,
            batch_size: (o.batch_size as usize).max(1),
            node_budget: o.node_budget.map(|b| b as usize),
        })
    }
}

fn check_path(wire: &[u32], tree: &TokenTree) -> Result<Vec<usize>, DrafterError> {
    let mut path = Vec::with_capacity(wire.len());
    for (j, &node) in wire.iter().enumerate() {
        let node = node as usize;
        let field = || format!("outcome.path[{j}]");
        if node >= tree.len() {
            let reason = format!("is {node}, but the tree has {} nodes", tree.len());
            return Err(DrafterError::invalid(field(), reason));
        }
        let expected_parent = path.last().copied();
        if tree.parent(node) != expected_parent {
            let reason = match expected_parent {
                None => format!("is {node}: a path starts at the root, node 0"),
                Some(p) => format!("is {node}, which is not a child of node {p}"),
            };
            return Err(DrafterError::invalid(field(), reason));
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
) -> Result<(), DrafterError> {
    if committed.len() > path.len() {
        let reason = format!(
            "has {} tokens but the path accepts {}: at most one more than the accepted nodes",
            committed.len(),
            path.len() - 1
        );
        return Err(DrafterError::invalid("outcome.committed", reason));
    }
    for (i, (&c, &node)) in committed.iter().zip(&path[1..]).enumerate() {
        if c != tree.token(node) {
            let reason = format!(
                "is {c}, but the accepted node {node} has token {}",
                tree.token(node)
            );
            return Err(DrafterError::invalid(
                format!("outcome.committed[{i}]"),
                reason,
            ));
        }
    }
    Ok(())
}

/// Refuses more top-k rows than `max_rows`, one per `what`.
fn check_rows(rows: &[Vec<(u32, f32)>], max_rows: usize, what: &str) -> Result<(), DrafterError> {
    if rows.len() > max_rows {
        let reason = format!(
            "has {} rows, more than {max_rows}: one per {what}",
            rows.len()
        );
        return Err(DrafterError::invalid("outcome.top_k", reason));
    }
    Ok(())
}

/// The top-k rows of an outcome as (token, log-probability) pairs.
fn top_k_from_wire(
    rows: Vec<v1::TopTokens>,
    vocab: u32,
) -> Result<Vec<Vec<(u32, f32)>>, DrafterError> {
    rows.into_iter()
        .enumerate()
        .map(|(j, row)| {
            if row.tokens.len() != row.logprobs.len() {
                let reason = format!(
                    "has {} tokens but {} logprobs",
                    row.tokens.len(),
                    row.logprobs.len()
                );
                return Err(DrafterError::invalid(format!("outcome.top_k[{j}]"), reason));
            }
            check_tokens(&format!("outcome.top_k[{j}].tokens"), &row.tokens, vocab)?;
            if let Some(i) = row.logprobs.iter().position(|p| p.is_nan()) {
                return Err(DrafterError::invalid(
                    format!("outcome.top_k[{j}].logprobs[{i}]"),
                    "is NaN",
                ));
            }
            Ok(row.tokens.into_iter().zip(row.logprobs).collect())
        })
        .collect()
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    /// `w` read at the edge, then checked against `tree`.
    fn outcome_of(w: v1::StepOutcome, tree: &TokenTree) -> Result<Outcome, DrafterError> {
        Outcome::from_report(Report::from_wire(w, 10)?, tree)
    }

    /// `w` read at the edge, then checked as reporting `steps` root-only steps.
    fn span_of(w: v1::StepOutcome, steps: usize) -> Result<SpanOutcome, DrafterError> {
        SpanOutcome::from_report(Report::from_wire(w, 10)?, steps)
    }

    use specmesh_draft::{CostCurve, PolicyError, TreeLimits};
    use specmesh_proto::{ANONYMOUS_TENANT, CurveFallback};
    use specmesh_tree::TreeBuilder;

    use super::*;

    fn wire_start() -> v1::DraftStart {
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

    fn err(r: Result<StartSpec, DrafterError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn the_output_limit_is_known_only_when_sent() {
        assert_eq!(start(wire_start(), 100).unwrap().max_new_tokens, None);
        let limited = v1::DraftStart {
            max_new_tokens: 96,
            ..wire_start()
        };
        assert_eq!(start(limited, 100).unwrap().max_new_tokens, Some(96));
    }

    #[test]
    fn a_good_start_becomes_a_spec_with_the_default_curve() {
        let s = start(wire_start(), 100).unwrap();
        assert!(s.sampling.is_greedy(), "an unset sampling is greedy");
        assert_eq!(s.tenant.as_str(), ANONYMOUS_TENANT);
        assert_eq!(s.curve, CostCurve::cpu_default());
        assert_eq!(s.curve_fallback, Some(CurveFallback::Missing));
        assert_eq!((s.prompt_len, s.vocab), (2, 10));
    }

    #[test]
    fn bad_starts_name_the_field() {
        let bad = |f: fn(&mut v1::DraftStart)| {
            let mut s = wire_start();
            f(&mut s);
            err(start(s, 100))
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
        assert!(
            bad(|s| s.tenant = "t".repeat(300))
                .starts_with("`start.tenant` must be at most 128 bytes, got 300")
        );
        assert_eq!(
            bad(|s| {
                s.sampling = Some(v1::SamplingParams {
                    temperature: -1.0,
                    ..Default::default()
                })
            }),
            "`start.sampling.temperature` must be a finite number >= 0, got -1"
        );
        assert!(
            bad(|s| {
                s.sampling = Some(v1::SamplingParams {
                    top_k: 11,
                    ..Default::default()
                })
            })
            .starts_with("`start.sampling.top_k` must be at most the vocabulary size (10)")
        );
        let long = start(wire_start(), 2);
        assert!(err(long).contains("over the drafter's context limit of 2"));
    }

    #[test]
    fn an_invalid_curve_falls_back_and_says_why() {
        let mut s = wire_start();
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
        let s = start(s, 100).unwrap();
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
        let o = span_of(w, 3).unwrap();
        assert_eq!(o.committed, [4, 5, 6]);
        assert_eq!(o.top_k[1], [(5, -1.0), (1, -1.0)]);
        assert_eq!(o.batch_size, 1);
        // One step may name its root as the path.
        assert!(span_of(outcome(vec![0], vec![4]), 1).is_ok());
    }

    #[test]
    fn bad_span_outcomes_name_the_field() {
        let bad = |o, steps| span_of(o, steps).unwrap_err().to_string();
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
    fn a_pruned_outcome_reads_the_path_in_the_verified_part() {
        let mut w = outcome(vec![0, 1, 2], vec![6, 7, 9]);
        w.pruned = true;
        w.granted = vec![1, 2];
        w.node_budget = Some(4);
        let o = outcome_of(w, &tree()).unwrap();
        let p = o.pruned.expect("pruned");
        assert_eq!(p.tree.tokens(), &[5, 6, 7]);
        assert_eq!(p.path, [0, 1, 2]);
        assert_eq!(o.path, [0, 1, 2], "the path stays in the drafter's indices");
        assert_eq!(o.node_budget, Some(4));
        // Pruned to the root alone: nothing was verified but the root.
        let mut w = outcome(vec![0], vec![9]);
        w.pruned = true;
        let o = outcome_of(w, &tree()).unwrap();
        assert_eq!(o.pruned.unwrap().tree.len(), 1);
        assert_eq!(o.node_budget, None);
    }

    #[test]
    fn bad_grants_name_the_field() {
        let bad = |path: Vec<u32>, committed: Vec<u32>, pruned: bool, granted: Vec<u32>| {
            let mut w = outcome(path, committed);
            w.pruned = pruned;
            w.granted = granted;
            outcome_of(w, &tree()).unwrap_err().to_string()
        };
        let e = bad(vec![0, 1], vec![6, 9], true, vec![2, 1]);
        assert!(
            e.contains("outcome.granted") && e.contains("ascending"),
            "{e}"
        );
        let e = bad(vec![0], vec![9], true, vec![0, 1]);
        assert!(e.contains("outcome.granted") && e.contains("root"), "{e}");
        let e = bad(vec![0], vec![9], true, vec![2]);
        assert!(
            e.contains("outcome.granted") && e.contains("ancestor"),
            "{e}"
        );
        let e = bad(vec![0], vec![9], true, vec![9]);
        assert!(e.contains("outcome.granted"), "{e}");
        let e = bad(vec![0, 1, 2], vec![6, 7, 9], true, vec![1]);
        assert!(e.contains("outcome.path") && e.contains("granted"), "{e}");
        let e = bad(vec![0, 1], vec![6, 9], false, vec![1]);
        assert!(e.contains("outcome.granted") && e.contains("pruned"), "{e}");
        let mut w = outcome(vec![], vec![4]);
        w.pruned = true;
        let e = span_of(w, 1).unwrap_err().to_string();
        assert!(e.contains("outcome.granted"), "{e}");
    }

    #[test]
    fn a_good_outcome_is_accepted() {
        let o = outcome_of(outcome(vec![0, 1, 2], vec![6, 7, 9]), &tree()).unwrap();
        assert_eq!(o.path, [0, 1, 2]);
        assert_eq!(o.batch_size, 1);
        // Not our tree: any committed tokens, one top-k row (the root's).
        let mut w = outcome(vec![], vec![4]);
        w.top_k = vec![v1::TopTokens {
            tokens: vec![4, 3],
            logprobs: vec![-0.1, -3.0],
        }];
        let o = outcome_of(w, &tree()).unwrap();
        assert_eq!(o.top_k, [vec![(4, -0.1), (3, -3.0)]]);
    }

    #[test]
    fn bad_outcomes_name_the_field() {
        let bad = |o| outcome_of(o, &tree()).unwrap_err().to_string();
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
