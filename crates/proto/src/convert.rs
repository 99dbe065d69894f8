//! Wire ↔ domain conversions.

use specmesh_tree::{TokenTree, TreeError, TreeLimits};

use crate::limits::MAX_TREE_SPAN;
use crate::v1;

/// Wire data that does not make a valid domain value.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("invalid token tree: {0}")]
    Tree(#[from] TreeError),
    #[error("draft distribution of node {node}: {tokens} tokens but {probs} probabilities")]
    DistLengths {
        node: u32,
        tokens: usize,
        probs: usize,
    },
    #[error(
        "span {span} on a tree with {nodes} drafted nodes: only a tree with no nodes stands for more than one step"
    )]
    SpanWithNodes { nodes: usize, span: u32 },
    #[error("span {span} is over the limit of {MAX_TREE_SPAN} steps")]
    SpanTooLong { span: u32 },
}

/// How many verify steps a tree received from a drafter stands for,
/// validated: its `span` (0 read as 1) for a tree with no nodes, at most
/// [`MAX_TREE_SPAN`]; exactly 1 for a tree with nodes.
pub fn tree_span(t: &v1::TokenTree) -> Result<u32, ConvertError> {
    let span = t.span.max(1);
    if span > 1 && !t.nodes.is_empty() {
        return Err(ConvertError::SpanWithNodes {
            nodes: t.nodes.len(),
            span,
        });
    }
    if span > MAX_TREE_SPAN {
        return Err(ConvertError::SpanTooLong { span });
    }
    Ok(span)
}

/// Validates a tree received from a drafter.
pub fn tree_from_wire(t: &v1::TokenTree, limits: TreeLimits) -> Result<TokenTree, ConvertError> {
    let mut dists = Vec::with_capacity(t.dists.len());
    for d in &t.dists {
        if d.tokens.len() != d.probs.len() {
            return Err(ConvertError::DistLengths {
                node: d.node,
                tokens: d.tokens.len(),
                probs: d.probs.len(),
            });
        }
        let entries = d
            .tokens
            .iter()
            .copied()
            .zip(d.probs.iter().copied())
            .collect();
        dists.push((d.node, entries));
    }
    // Refuse an oversized tree before building anything of it.
    if t.nodes.len() >= limits.max_nodes {
        return Err(TreeError::TooManyNodes {
            nodes: t.nodes.len() + 1,
            max: limits.max_nodes,
        }
        .into());
    }
    Ok(TokenTree::from_untrusted(
        t.root_token,
        t.nodes.iter().map(|n| (n.parent, n.token, n.score)),
        dists,
        limits,
    )?)
}

/// Encodes a tree for the wire.
pub fn tree_to_wire(tree: &TokenTree, epoch: u64, step: u64) -> v1::TokenTree {
    let nodes = (1..tree.len())
        .map(|i| v1::TreeNode {
            parent: tree.parent(i).unwrap_or(0) as u32,
            token: tree.token(i),
            score: tree.score(i),
        })
        .collect();
    let dists = (0..tree.len())
        .filter_map(|i| {
            tree.draft_dist(i).map(|d| v1::DraftDist {
                node: i as u32,
                tokens: d.entries().iter().map(|e| e.0).collect(),
                probs: d.entries().iter().map(|e| e.1).collect(),
            })
        })
        .collect();
    v1::TokenTree {
        epoch,
        step,
        root_token: tree.root_token(),
        nodes,
        dists,
        span: 0,
        drafted_ahead: false,
        drafted_by: v1::DraftSources::Auto as i32,
        draft_micros: 0,
        ahead_micros: 0,
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use specmesh_tree::TreeBuilder;

    #[test]
    fn a_tree_survives_the_round_trip() {
        let limits = TreeLimits::new(8, 4, 100);
        let mut b = TreeBuilder::new(7, limits).unwrap();
        let a = b.push(0, 8, 0.9).unwrap();
        b.push(0, 9, 0.5).unwrap();
        b.push(a, 10, 0.4).unwrap();
        b.set_draft_dist(0, vec![(8, 0.6), (9, 0.3), (11, 0.1)])
            .unwrap();
        let tree = b.build();
        let wire = tree_to_wire(&tree, 3, 12);
        assert_eq!((wire.epoch, wire.step), (3, 12));
        assert_eq!(tree_from_wire(&wire, limits).unwrap(), tree);
    }

    #[test]
    fn a_bad_tree_names_the_problem() {
        let limits = TreeLimits::new(8, 4, 100);
        let mut wire = v1::TokenTree {
            root_token: 1,
            nodes: vec![v1::TreeNode {
                parent: 3,
                token: 2,
                score: 0.5,
            }],
            ..Default::default()
        };
        let err = tree_from_wire(&wire, limits).unwrap_err().to_string();
        assert!(err.contains("node 1 names parent 3"), "{err}");
        wire.nodes = (0..20)
            .map(|i| v1::TreeNode {
                parent: 0,
                token: i,
                score: 0.1,
            })
            .collect();
        let err = tree_from_wire(&wire, limits).unwrap_err().to_string();
        assert!(err.contains("over the budget of 8"), "{err}");
    }

    #[test]
    fn a_span_is_for_empty_trees_and_bounded() {
        let mut wire = v1::TokenTree::default();
        assert_eq!(tree_span(&wire).unwrap(), 1);
        wire.span = 1;
        assert_eq!(tree_span(&wire).unwrap(), 1);
        wire.span = MAX_TREE_SPAN;
        assert_eq!(tree_span(&wire).unwrap(), MAX_TREE_SPAN);
        wire.span = MAX_TREE_SPAN + 1;
        let err = tree_span(&wire).unwrap_err().to_string();
        assert_eq!(err, "span 65 is over the limit of 64 steps");
        wire.span = 2;
        wire.nodes.push(v1::TreeNode {
            parent: 0,
            token: 1,
            score: 0.5,
        });
        let err = tree_span(&wire).unwrap_err().to_string();
        assert!(
            err.starts_with("span 2 on a tree with 1 drafted nodes"),
            "{err}"
        );
        wire.span = 1;
        assert_eq!(tree_span(&wire).unwrap(), 1);
    }
}
