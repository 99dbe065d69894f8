//! Verification under a constraint on the output (a grammar): the trait a
//! grammar engine implements, and the fitting of a drafted tree to it
//! before the target sees the tree.
//!
//! Under a constraint the target's distribution is its masked,
//! renormalised one (greedy takes the best allowed token). Three things
//! keep speculation exact and make the constraint pay:
//!
//! - a drafted node the constraint forbids is cut, with its subtree, before
//!   the forward ([`constrain`]): the target never computes a row for it;
//! - where a drafted node's children were drawn from a draft distribution
//!   `q` and some were cut, rejection sampling still runs over *every*
//!   drafted candidate with the drafted `q` ([`Rejection`]): a cut
//!   candidate has no mass under the masked target, so it is rejected with
//!   certainty, exactly as it would be had the target seen it, and the rule
//!   stays lossless (it is for any `q` its candidates were drawn from).
//!   Deciding otherwise where a child was cut (dropping `q`, say) would
//!   depend on which candidates were drawn, and bias the output;
//! - after each drafted leaf (and at the root), the bytes the constraint
//!   forces (`{"name": "`, a closing bracket, the rest of an enum value)
//!   are grafted as a chain of nodes, tokenised as the model would write
//!   them. Where the mask leaves one token, that node is certain under the
//!   masked distribution; elsewhere it is an ordinary, likely draft. Either
//!   way the target's forward decides it: nothing is committed without it.

use specmesh_tree::{TokenTree, TreeBuilder, TreeError, TreeLimits};

/// Why a constraint could not answer (its engine failed or hit a limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConstraintError(pub String);

impl From<TreeError> for ConstraintError {
    fn from(e: TreeError) -> Self {
        ConstraintError(format!("fitting the tree to the grammar: {e}"))
    }
}

/// A constraint on the tokens of the output, following the tokens it is
/// advanced by. Its position is that of the next token.
pub trait Constraint: Send + Sync + std::fmt::Debug {
    /// The tokens allowed next, as a bitset (see
    /// [`specmesh_sampling::Allowed`]). When the constraint is complete,
    /// the end-of-sequence tokens alone.
    fn allowed(&mut self) -> Result<&[u32], ConstraintError>;

    /// Whether `token` may come next (cheaper than a whole mask).
    fn allows(&mut self, token: u32) -> Result<bool, ConstraintError>;

    /// Moves past `token`, which must be allowed.
    fn advance(&mut self, token: u32) -> Result<(), ConstraintError>;

    /// Undoes the last `n` advances.
    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError>;

    /// The tokens the constraint forces next, tokenised canonically
    /// (jump-forward); empty when it forces nothing. Likely, and certain
    /// only where the mask leaves one choice.
    fn forced(&mut self) -> Result<Vec<u32>, ConstraintError>;
}

/// How a node that lost drafted children decides: rejection sampling over
/// all the candidates drafted there, with the distribution they were drawn
/// from (the cut ones are rejected with certainty).
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// Every drafted child's token, in drafted order.
    pub candidates: Vec<u32>,
    /// The draft distribution they were drawn from.
    pub q: Vec<(u32, f32)>,
}

/// A tree fitted to a constraint.
#[derive(Debug, Clone, PartialEq)]
pub struct Constrained {
    pub tree: TokenTree,
    /// For each node of `tree`, the node of the drafted tree it is;
    /// `None` for a node grafted from what the constraint forces.
    pub origin: Vec<Option<usize>>,
    /// For each node of `tree`: its [`Rejection`] when it had a draft
    /// distribution and lost drafted children (the tree then carries no
    /// distribution there).
    pub rejections: Vec<Option<Rejection>>,
}

impl Constrained {
    /// Grafted nodes in `tree`.
    pub fn grafted(&self) -> usize {
        self.origin.iter().filter(|o| o.is_none()).count()
    }
}

/// Fits `tree` to `constraint` (at the root's next position): cuts what it
/// forbids, grafts what it forces after each leaf, `max_grafted` nodes at
/// most. The constraint is left where it was.
pub fn constrain(
    tree: &TokenTree,
    constraint: &mut dyn Constraint,
    max_grafted: usize,
) -> Result<Constrained, ConstraintError> {
    let limits = tree.limits();
    let fit = TreeLimits::new(
        tree.len() + max_grafted,
        limits.max_depth.max(tree.max_depth()) + max_grafted,
        limits.vocab,
    );
    let mut out = Fit {
        builder: TreeBuilder::new(tree.root_token(), fit)?,
        origin: vec![Some(0)],
        budget: max_grafted,
        cut: Vec::new(),
    };
    out.walk(tree, 0, 0, constraint)?;
    let mut rejections = vec![None; out.origin.len()];
    for (node, r) in out.cut {
        rejections[node] = Some(r);
    }
    Ok(Constrained {
        tree: out.builder.build(),
        origin: out.origin,
        rejections,
    })
}

struct Fit {
    builder: TreeBuilder,
    origin: Vec<Option<usize>>,
    budget: usize,
    /// Nodes with a draft distribution that lost drafted children.
    cut: Vec<(usize, Rejection)>,
}

impl Fit {
    fn walk(
        &mut self,
        tree: &TokenTree,
        node: usize,
        at: usize,
        c: &mut dyn Constraint,
    ) -> Result<(), ConstraintError> {
        let kids = tree.children(node);
        let mut kept = 0;
        for &k in kids {
            let k = k as usize;
            let token = tree.token(k);
            if !c.allows(token)? {
                continue;
            }
            c.advance(token)?;
            let child = self.builder.push(at, token, tree.score(k))?;
            self.origin.push(Some(k));
            kept += 1;
            let walked = self.walk(tree, k, child, c);
            c.rollback(1)?;
            walked?;
        }
        if let Some(d) = tree.draft_dist(node)
            && !kids.is_empty()
        {
            if kept == kids.len() {
                self.builder.set_draft_dist(at, d.entries().to_vec())?;
            } else {
                self.cut.push((
                    at,
                    Rejection {
                        candidates: kids.iter().map(|&k| tree.token(k as usize)).collect(),
                        q: d.entries().to_vec(),
                    },
                ));
            }
        }
        if kept == 0 && self.budget > 0 {
            self.graft(at, c)?;
        }
        Ok(())
    }

    /// Grafts the constraint's forced tokens under `at`, as a chain.
    fn graft(&mut self, at: usize, c: &mut dyn Constraint) -> Result<(), ConstraintError> {
        let forced = c.forced()?;
        let score = self.builder.score(at);
        let mut parent = at;
        let mut advanced = 0;
        // Each grafted token is checked like a drafted one: the forced
        // bytes' tokenisation is the model's, which the grammar may not
        // allow token by token.
        for token in forced.into_iter().take(self.budget) {
            if token >= self.builder.limits().vocab || !c.allows(token)? {
                break;
            }
            c.advance(token)?;
            advanced += 1;
            parent = self.builder.push(parent, token, score)?;
            self.origin.push(None);
            self.budget -= 1;
        }
        c.rollback(advanced)
    }
}

#[cfg(test)]
mod tests;
