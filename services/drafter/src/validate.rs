//! The edge: the verifier's `DraftStart` and `StepOutcome` messages become
//! validated [`StartSpec`] (each field checked in [`start`](mod@start), then
//! held to this drafter's context limit) and [`Report`] values here (tokens within
//! the vocabulary, top-k rows whole), and nothing past this module reads a
//! wire message. What a report says is then checked against the tree it
//! reports on ([`Outcome`], [`SpanOutcome`]), and a tree to send is written
//! as its message ([`SentTree`]).
//!
//! A message that breaks the protocol ends the stream with
//! INVALID_ARGUMENT naming the field, rather than being patched up: a
//! verifier that sends a bad path or a token outside the vocabulary has a
//! bug, and drafting on top of a corrupted context would only hide it.

use std::time::Duration;

use specmesh_draft::{Arm, TokenTree};
use specmesh_proto::field::check_tokens;
use specmesh_proto::{tree_to_wire, v1};

use crate::error::DrafterError;

mod start;

pub use start::{ANONYMOUS_TENANT, CacheScope, StartSpec, TargetModel};

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
    /// Tokens of `committed` after the path's accepted ones that the
    /// output's grammar forced (not drafted by us).
    pub forced: usize,
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
            forced: (o.forced as usize).min(o.committed.len()),
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
    /// The arm that drafted it; `None` for a run of steps sent ahead.
    pub drafted_by: Option<Arm>,
    /// The drafter's compute for it: just before sending, and ahead of
    /// the outcome before it (see [`Computed`]).
    pub computed: Computed,
}

/// What drafting a tree took the drafter, for the verifier's planner,
/// which prices drafting on the cores it shares.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Computed {
    /// Drafting just before the tree was sent.
    pub draft: Duration,
    /// Drafting ahead, while the target verified the previous step.
    pub ahead: Duration,
}

impl From<&SentTree> for v1::TokenTree {
    fn from(t: &SentTree) -> v1::TokenTree {
        match &t.tree {
            Some(tree) => v1::TokenTree {
                drafted_ahead: t.drafted_ahead,
                drafted_by: t.drafted_by.map_or(v1::DraftSources::Auto, drafted_by) as i32,
                draft_micros: micros(t.computed.draft),
                ahead_micros: micros(t.computed.ahead),
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

/// A duration as whole microseconds for the wire (saturating).
fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// An arm as the way of drafting the verifier's planner calibrates apart.
fn drafted_by(arm: Arm) -> v1::DraftSources {
    match arm {
        Arm::ModelFree => v1::DraftSources::ModelFree,
        Arm::Model => v1::DraftSources::DraftModel,
        Arm::Combined => v1::DraftSources::Combined,
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
            check_committed_follows_path(&o.committed, o.forced, &path, tree)?;
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
    /// Tokens of `committed` a grammar forced (beyond one per step).
    pub forced: usize,
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
        if o.committed.len() != steps + o.forced {
            let reason = format!(
                "has {} tokens, but the outcome reports {steps} steps that verified the root \
                 alone and {} tokens the grammar forced: one token each, and those",
                o.committed.len(),
                o.forced
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
            forced: o.forced,
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
    forced: usize,
    path: &[usize],
    tree: &TokenTree,
) -> Result<(), DrafterError> {
    if committed.len() > path.len() + forced {
        let reason = format!(
            "has {} tokens but the path accepts {} and the grammar forced {forced}: at most \
             one more than those",
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
mod tests;
