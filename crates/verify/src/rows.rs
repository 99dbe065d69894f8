//! Where the verifier reads the target's logits: one row per tree node.
//!
//! A trait rather than a slice so that the runtime's contiguous
//! `rows × vocab` buffer ([`RowMajor`]) and lazily computed rows (tests that
//! count which rows were touched, a runtime that copies rows off the device
//! on demand) go through the same code.

use crate::VerifyError;

/// The target's logits for the nodes of a tree: row `i` is its distribution
/// for the token that follows the path root → node `i`.
///
/// The verifier reads only the rows of nodes on the path it walks, so an
/// implementation may compute rows on first access.
pub trait LogitRows {
    /// How many rows there are (at least the tree's node count to verify).
    fn num_rows(&self) -> usize;

    /// Row `node`; called only with `node < self.num_rows()`.
    fn row(&self, node: usize) -> &[f32];
}

/// A contiguous row-major `rows × vocab` buffer, as the model runtime
/// returns it.
#[derive(Clone, Copy, Debug)]
pub struct RowMajor<'a> {
    data: &'a [f32],
    vocab: usize,
}

impl<'a> RowMajor<'a> {
    /// Views `data` as rows of `vocab` logits; refuses a buffer that is not
    /// a whole number of rows.
    pub fn new(data: &'a [f32], vocab: usize) -> Result<RowMajor<'a>, VerifyError> {
        if vocab == 0 {
            return Err(VerifyError::EmptyVocab);
        }
        if !data.len().is_multiple_of(vocab) {
            return Err(VerifyError::RaggedBuffer {
                len: data.len(),
                vocab,
            });
        }
        Ok(RowMajor { data, vocab })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

impl LogitRows for RowMajor<'_> {
    fn num_rows(&self) -> usize {
        self.data.len() / self.vocab
    }

    fn row(&self, node: usize) -> &[f32] {
        &self.data[node * self.vocab..(node + 1) * self.vocab]
    }
}

/// Rows held separately, one vector per node.
impl LogitRows for [Vec<f32>] {
    fn num_rows(&self) -> usize {
        self.len()
    }

    fn row(&self, node: usize) -> &[f32] {
        &self[node]
    }
}

impl LogitRows for Vec<Vec<f32>> {
    fn num_rows(&self) -> usize {
        self.len()
    }

    fn row(&self, node: usize) -> &[f32] {
        &self[node]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_slices_whole_rows() {
        let data = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        let rows = RowMajor::new(&data, 3).unwrap();
        assert_eq!(rows.num_rows(), 2);
        assert_eq!(rows.row(1), &[3.0, 4.0, 5.0]);
        assert_eq!(rows.vocab(), 3);
    }

    #[test]
    fn row_major_refuses_ragged_and_empty_vocab() {
        let data = [0.0f32; 5];
        assert_eq!(
            RowMajor::new(&data, 3).unwrap_err(),
            VerifyError::RaggedBuffer { len: 5, vocab: 3 }
        );
        assert_eq!(
            RowMajor::new(&data, 0).unwrap_err(),
            VerifyError::EmptyVocab
        );
        assert_eq!(RowMajor::new(&[], 4).unwrap().num_rows(), 0);
    }

    #[test]
    fn vectors_of_rows_are_rows() {
        let rows = vec![vec![1.0f32], vec![2.0]];
        assert_eq!(rows.num_rows(), 2);
        assert_eq!(rows.as_slice().row(1), &[2.0]);
    }
}
