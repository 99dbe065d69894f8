//! The walk down the tree: at each node decide the target's token for that
//! output position, descend into the child carrying it, stop otherwise.

use specmesh_sampling::{Allowed, SamplingParams, sample_in, uniform_at};
use specmesh_tree::TokenTree;

use crate::constraint::{Constraint, Rejection};
use crate::rrs::{Decision, recursive_rejection};
use crate::topk::{TokenLogprobs, token_logprobs, top_logprobs};
use crate::{LogitRows, VerifyError};

/// What the target accepted of a tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Verification {
    /// Accepted nodes, root first (`[0]` when no draft token was accepted).
    pub path: Vec<usize>,
    /// Tokens of `path[1..]`.
    pub accepted: Vec<u32>,
    /// The target's own token after the last accepted node: every
    /// verification commits at least one token.
    pub bonus: u32,
    /// For each node of `path`, the target's `top_k` most likely tokens at
    /// that node's row as (token, log-probability), most likely first (the
    /// input of token recycling; see [`crate`] docs). Empty vectors when
    /// `top_k` is 0.
    pub top_k: Vec<Vec<(u32, f32)>>,
    /// With [`Extras::logprobs`]: for each committed token (the accepted
    /// ones, then the bonus), its log-probability and the most likely
    /// tokens at its position, under the constraint's mask when there is
    /// one. Empty otherwise.
    pub logprobs: Vec<TokenLogprobs>,
}

/// What a verification does beyond choosing tokens.
#[derive(Debug, Default)]
pub struct Extras<'a> {
    /// The output's constraint (a grammar), at the root's next position:
    /// every decision is taken from the masked distribution, and the
    /// constraint is advanced past every committed token.
    pub constraint: Option<&'a mut dyn Constraint>,
    /// Report log-probabilities of the committed tokens with this many
    /// alternatives each (at most 20 by the APIs).
    pub logprobs: Option<usize>,
    /// Per node of a tree fitted to the constraint: how a node that lost
    /// drafted children decides ([`crate::Constrained::rejections`]);
    /// empty for a tree as drafted.
    pub rejections: &'a [Option<crate::Rejection>],
}

impl Verification {
    /// Number of draft tokens accepted (the bonus not counted).
    pub fn accepted_len(&self) -> usize {
        self.accepted.len()
    }

    /// The tokens to commit: the accepted ones, then the bonus.
    pub fn committed(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.accepted.len() + 1);
        out.extend_from_slice(&self.accepted);
        out.push(self.bonus);
        out
    }
}

/// Verifies `tree` against the target's logits `rows` (row `i` for node
/// `i`).
///
/// `position` is the output index of the token that follows the root; a
/// node at depth `d` decides output position `position + d`, whose uniforms
/// are `uniform_at(params.seed, position + d, ·)`. At each node on the walk:
///
/// - greedy (`temperature == 0`): the argmax, so the committed tokens are
///   exactly those of plain greedy decoding; draft distributions are
///   ignored;
/// - sampling, node without a draft distribution (or without children):
///   the token plain sampling would draw at that position,
///   `sample(row, params, position + d)`, so a seeded request emits the
///   same tokens with and without speculation, whatever the tree;
/// - sampling, node with a draft distribution: recursive rejection sampling
///   without replacement over its children (see the crate docs); lossless
///   in distribution, and it accepts more often when the drafter's `q` is
///   close to `p`, but the tokens then differ from plain sampling's.
///
/// Only the rows of nodes on the walk are read: greedy costs one argmax per
/// visited row, sampling one `distribution()` per visited row, and `top_k`
/// a partial selection per path node.
pub fn verify<R: LogitRows + ?Sized>(
    tree: &TokenTree,
    rows: &R,
    params: &SamplingParams,
    position: u64,
    top_k: usize,
) -> Result<Verification, VerifyError> {
    verify_with(tree, rows, params, position, top_k, Extras::default())
}

/// [`verify`] under a constraint and with log-probabilities (see
/// [`Extras`]). A tree under a constraint must have been fitted to it
/// ([`crate::constrain`]): a node it forbids is never chosen, whatever its
/// row says.
pub fn verify_with<R: LogitRows + ?Sized>(
    tree: &TokenTree,
    rows: &R,
    params: &SamplingParams,
    position: u64,
    top_k: usize,
    mut extras: Extras<'_>,
) -> Result<Verification, VerifyError> {
    let mut advanced = 0;
    let result = walk(
        tree,
        rows,
        params,
        position,
        top_k,
        &mut extras,
        &mut advanced,
    );
    if result.is_err()
        && advanced > 0
        && let Some(c) = extras.constraint.as_deref_mut()
    {
        // A refused verification leaves the constraint where it was.
        c.rollback(advanced)?;
    }
    result
}

fn walk<R: LogitRows + ?Sized>(
    tree: &TokenTree,
    rows: &R,
    params: &SamplingParams,
    position: u64,
    top_k: usize,
    extras: &mut Extras<'_>,
    advanced: &mut usize,
) -> Result<Verification, VerifyError> {
    if rows.num_rows() < tree.len() {
        return Err(VerifyError::TooFewRows {
            nodes: tree.len(),
            rows: rows.num_rows(),
        });
    }
    let vocab = tree.limits().vocab as usize;
    let mut path = vec![0];
    let mut top = Vec::with_capacity(tree.max_depth() + 1);
    let mut node = 0;
    let mut logprobs = Vec::new();
    let bonus = loop {
        let row = rows.row(node);
        if row.len() != vocab {
            return Err(VerifyError::RowLength {
                node,
                len: row.len(),
                vocab,
            });
        }
        top.push(top_logprobs(row, top_k));
        // Wrapping: positions are keys of the random stream, not sizes.
        let at = position.wrapping_add(tree.depth(node) as u64);
        let (decided, token) = match extras.constraint.as_deref_mut() {
            None => {
                let rejection = extras.rejections.get(node).and_then(Option::as_ref);
                let decided = step(tree, node, row, params, at, None, rejection);
                let token = decided.token(tree);
                if let Some(n) = extras.logprobs {
                    logprobs.push(token_logprobs(row, None, token, n));
                }
                (decided, token)
            }
            Some(c) => {
                let words = c.allowed()?;
                let allowed = Allowed::new(words);
                if words.iter().all(|&w| w == 0) {
                    return Err(VerifyError::NothingAllowed { node });
                }
                let rejection = extras.rejections.get(node).and_then(Option::as_ref);
                let decided = step(tree, node, row, params, at, Some(allowed), rejection);
                let token = decided.token(tree);
                if let Some(n) = extras.logprobs {
                    logprobs.push(token_logprobs(row, Some(allowed), token, n));
                }
                c.advance(token)?;
                *advanced += 1;
                (decided, token)
            }
        };
        match decided {
            Step::Descend(child) => {
                path.push(child);
                node = child;
            }
            Step::Stop(_) => break token,
        }
    };
    let accepted = path[1..].iter().map(|&n| tree.token(n)).collect();
    Ok(Verification {
        path,
        accepted,
        bonus,
        top_k: top,
        logprobs,
    })
}

enum Step {
    Descend(usize),
    Stop(u32),
}

impl Step {
    fn token(&self, tree: &TokenTree) -> u32 {
        match *self {
            Step::Descend(child) => tree.token(child),
            Step::Stop(token) => token,
        }
    }
}

/// A node's draft distribution and the candidates drawn from it.
type Candidates<'a> = (&'a [(u32, f32)], Vec<u32>);

/// Decides the token at output position `at` from `node`'s row, among the
/// tokens `allowed` lets through; `rejection`: the node's drafted
/// candidates and `q` when a constraint cut some of them.
fn step(
    tree: &TokenTree,
    node: usize,
    row: &[f32],
    params: &SamplingParams,
    at: u64,
    allowed: Option<Allowed<'_>>,
    rejection: Option<&Rejection>,
) -> Step {
    let children = tree.children(node);
    let drafted: Option<Candidates<'_>> = match rejection {
        Some(r) => Some((&r.q, r.candidates.clone())),
        None => tree
            .draft_dist(node)
            .filter(|_| !children.is_empty())
            .map(|q| {
                let tokens = children.iter().map(|&c| tree.token(c as usize)).collect();
                (q.entries(), tokens)
            }),
    };
    if !params.is_greedy()
        && let Some((q, tokens)) = drafted
    {
        let p = params.distribution_in(row, allowed);
        let draw = |d| uniform_at(params.seed, at, d);
        // The token decided here descends into the child carrying it, if
        // any (a cut candidate has none, nor may the residual's draw).
        let decided = |token: u32| match tree.child_with(node, token) {
            Some(child) => Step::Descend(child),
            None => Step::Stop(token),
        };
        match recursive_rejection(&p, q, &tokens, row.len(), draw) {
            Decision::Accept(k) => return decided(tokens[k]),
            Decision::Bonus(token) => return decided(token),
            Decision::Fallback => {}
        }
    }
    // The probability-free rule (greedy is its temperature-0 case): the
    // token plain decoding emits here, kept if the tree drafted it.
    let y = sample_in(row, params, at, allowed);
    match tree.child_with(node, y) {
        Some(child) => Step::Descend(child),
        None => Step::Stop(y),
    }
}

#[cfg(test)]
mod tests;
