//! Why a verification was refused. The logits come from the model runtime
//! and the tree often from another process, so messages name the node and
//! the sizes that disagree.

/// A tree and its logits that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the tree has {nodes} nodes but only {rows} logit rows were given")]
    TooFewRows { nodes: usize, rows: usize },
    #[error("logit row {node} has {len} entries, but the tree's vocabulary has {vocab} tokens")]
    RowLength {
        node: usize,
        len: usize,
        vocab: usize,
    },
    #[error("a logits buffer of {len} floats is not a whole number of rows of {vocab}")]
    RaggedBuffer { len: usize, vocab: usize },
    #[error("a logits buffer needs a vocabulary of at least one token")]
    EmptyVocab,
    #[error("the grammar allows no token of the vocabulary at node {node}")]
    NothingAllowed { node: usize },
    #[error("the grammar failed: {0}")]
    Constraint(#[from] crate::constraint::ConstraintError),
}
