//! Why a tree was refused. Messages name the node and the bound, because the
//! tree usually came from another process and its author has to fix it.

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TreeError {
    #[error(
        "node {index} names parent {parent}: a parent must be an earlier node (a later one would allow a cycle)"
    )]
    BadParent { index: usize, parent: usize },
    #[error("the tree has {nodes} nodes, over the budget of {max}")]
    TooManyNodes { nodes: usize, max: usize },
    #[error("node {index} is at depth {depth}, over the depth budget of {max}")]
    TooDeep {
        index: usize,
        depth: usize,
        max: usize,
    },
    #[error("node {index} has token {token}, but the vocabulary has {vocab} tokens")]
    TokenOutOfVocab {
        index: usize,
        token: u32,
        vocab: u32,
    },
    #[error("node {index} repeats token {token} of its sibling {sibling}")]
    DuplicateSibling {
        index: usize,
        sibling: usize,
        token: u32,
    },
    #[error("node {index} has score {score}: a score must be in [0, 1]")]
    BadScore { index: usize, score: f32 },
    #[error("the draft distribution of node {index} is invalid: {reason}")]
    BadDraftDist { index: usize, reason: String },
    #[error("trees to merge have different roots ({first} and {other})")]
    RootMismatch { first: u32, other: u32 },
    #[error("nothing to merge")]
    NothingToMerge,
    #[error("node {index} does not exist: the tree has {len} nodes")]
    NoSuchNode { index: usize, len: usize },
}
