//! A block of new tokens for one forward: tokens, their positions, and which
//! other new tokens each one attends to.
//!
//! The attention structure is a forest given by parent indices. Token i sees
//! the committed prefix of its sequence plus its ancestors and itself:
//!
//! ```text
//!   committed prefix | block:  0:"The"  1:"cat"  2:"dog"  3:"sat"
//!                      parent:   -        0        0        1
//!   token 3 sees: prefix, 0, 1, 3        (positions: len+0, len+1, len+1, len+2)
//! ```
//!
//! A parent always precedes its child, so a `Block` is acyclic by
//! construction.

/// Rejected block descriptions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("a block needs at least one token")]
    Empty,
    #[error("`{field}` has {got} entries but the block has {tokens} tokens")]
    LengthMismatch {
        field: &'static str,
        got: usize,
        tokens: usize,
    },
    #[error("token {index} has parent {parent}: a parent must come before its child")]
    ParentOrder { index: usize, parent: usize },
    #[error(
        "token {index} has position {position} but its parent has position {parent_position}: a child must come after its parent"
    )]
    PositionOrder {
        index: usize,
        position: u32,
        parent_position: u32,
    },
}

/// Which rows of logits a forward returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every token of the block (verification).
    All,
    /// Only the last token (prefill, plain decoding): skips the lm_head for
    /// the others, which dominates the cost of a long prompt.
    Last,
}

/// New tokens for one sequence, valid by construction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    parents: Vec<Option<u32>>,
    /// Ancestors of each token within the block (0 for a root).
    depths: Vec<u32>,
    chain: bool,
    logits: LogitsFor,
}

impl Block {
    /// A chain: token i at position `start + i`, attending to all earlier ones.
    pub fn chain(tokens: Vec<u32>, start: usize) -> Result<Block, BlockError> {
        let n = tokens.len();
        let positions = (0..n).map(|i| (start + i) as u32).collect();
        let parents = (0..n).map(|i| i.checked_sub(1).map(|p| p as u32)).collect();
        Block::new(tokens, positions, parents)
    }

    /// A tree: token i at position `start + depth(i)` (depth 0 for roots).
    pub fn tree(
        tokens: Vec<u32>,
        parents: Vec<Option<usize>>,
        start: usize,
    ) -> Result<Block, BlockError> {
        check_len("parents", parents.len(), tokens.len())?;
        let mut positions = Vec::with_capacity(tokens.len());
        for (i, p) in parents.iter().enumerate() {
            let pos = match *p {
                None => start as u32,
                Some(p) if p < i => positions[p] + 1,
                Some(p) => {
                    return Err(BlockError::ParentOrder {
                        index: i,
                        parent: p,
                    });
                }
            };
            positions.push(pos);
        }
        let parents = parents.into_iter().map(|p| p.map(|p| p as u32)).collect();
        Block::new(tokens, positions, parents)
    }

    /// A block with explicit positions and parents.
    pub fn new(
        tokens: Vec<u32>,
        positions: Vec<u32>,
        parents: Vec<Option<u32>>,
    ) -> Result<Block, BlockError> {
        if tokens.is_empty() {
            return Err(BlockError::Empty);
        }
        check_len("positions", positions.len(), tokens.len())?;
        check_len("parents", parents.len(), tokens.len())?;
        let mut chain = true;
        let mut depths: Vec<u32> = Vec::with_capacity(tokens.len());
        for (i, p) in parents.iter().enumerate() {
            chain &= *p == i.checked_sub(1).map(|p| p as u32);
            depths.push(p.map_or(0, |p| depths.get(p as usize).map_or(0, |d| d + 1)));
            if let Some(p) = *p {
                let p = p as usize;
                if p >= i {
                    return Err(BlockError::ParentOrder {
                        index: i,
                        parent: p,
                    });
                }
                if positions[p] >= positions[i] {
                    return Err(BlockError::PositionOrder {
                        index: i,
                        position: positions[i],
                        parent_position: positions[p],
                    });
                }
            }
        }
        Ok(Block {
            tokens,
            positions,
            parents,
            depths,
            chain,
            logits: LogitsFor::All,
        })
    }

    /// Returns logits for the last token only.
    pub fn last_logits_only(mut self) -> Block {
        self.logits = LogitsFor::Last;
        self
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    pub fn parent(&self, i: usize) -> Option<usize> {
        self.parents[i].map(|p| p as usize)
    }

    /// Ancestors of token `i` within the block (0 for a root).
    pub fn depth(&self, i: usize) -> usize {
        self.depths[i] as usize
    }

    pub fn is_chain(&self) -> bool {
        self.chain
    }

    pub fn logits_for(&self) -> LogitsFor {
        self.logits
    }

    /// Indices of the rows whose logits are returned.
    pub fn logit_rows(&self) -> std::ops::Range<usize> {
        match self.logits {
            LogitsFor::All => 0..self.len(),
            LogitsFor::Last => self.len() - 1..self.len(),
        }
    }

    /// Fills `out` with i's ancestors and i itself, in increasing index order
    /// (the order keys are visited in attention; it must equal the order of
    /// the same tokens once committed, for bit-exactness).
    pub fn attended(&self, i: usize, out: &mut Vec<usize>) {
        out.clear();
        if self.chain {
            out.extend(0..=i);
            return;
        }
        let mut node = Some(i);
        while let Some(n) = node {
            out.push(n);
            node = self.parent(n);
        }
        out.reverse();
    }
}

fn check_len(field: &'static str, got: usize, tokens: usize) -> Result<(), BlockError> {
    if got != tokens {
        return Err(BlockError::LengthMismatch { field, got, tokens });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_positions_follow_depth() {
        let b = Block::tree(vec![1, 2, 3, 4], vec![None, Some(0), Some(0), Some(1)], 10).unwrap();
        assert_eq!(b.positions(), &[10, 11, 11, 12]);
        assert!(!b.is_chain());
        let mut v = Vec::new();
        b.attended(3, &mut v);
        assert_eq!(v, vec![0, 1, 3]);
    }

    #[test]
    fn chain_attends_to_everything_before() {
        let b = Block::chain(vec![5, 6, 7], 3).unwrap();
        assert!(b.is_chain());
        let mut v = Vec::new();
        b.attended(2, &mut v);
        assert_eq!(v, vec![0, 1, 2]);
        assert_eq!(b.positions(), &[3, 4, 5]);
    }

    #[test]
    fn bad_blocks_are_rejected() {
        assert_eq!(Block::chain(vec![], 0), Err(BlockError::Empty));
        assert!(matches!(
            Block::tree(vec![1, 2], vec![None, Some(1)], 0),
            Err(BlockError::ParentOrder {
                index: 1,
                parent: 1
            })
        ));
        assert!(matches!(
            Block::new(vec![1, 2], vec![5, 5], vec![None, Some(0)]),
            Err(BlockError::PositionOrder { .. })
        ));
        assert!(matches!(
            Block::new(vec![1], vec![0, 1], vec![None]),
            Err(BlockError::LengthMismatch {
                field: "positions",
                ..
            })
        ));
    }
}
