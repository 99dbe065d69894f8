//! Logits returned by a forward, one row per requested token.
//!
//! A row has one column per token the lm_head scores: the whole vocabulary
//! (column i is token i), or, for a draft model loaded with
//! `LoadOptions::head_tokens`, only those tokens ([`Logits::token`] maps a
//! column back to its id; [`Logits::argmax`] and [`Logits::top_k`] return
//! ids).

use std::sync::Arc;

/// A token with its log-probability under the row's softmax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopToken {
    pub token: u32,
    pub logprob: f32,
}

/// `rows × vocab` logits, row-major (`vocab`: columns per row).
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    vocab: usize,
    data: Vec<f32>,
    /// Each column's token when the head scores only some tokens.
    tokens: Option<Arc<[u32]>>,
}

impl Logits {
    pub(crate) fn new(vocab: usize, data: Vec<f32>, tokens: Option<Arc<[u32]>>) -> Logits {
        debug_assert_eq!(data.len() % vocab, 0);
        debug_assert!(tokens.as_ref().is_none_or(|t| t.len() == vocab));
        Logits {
            vocab,
            data,
            tokens,
        }
    }

    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab
    }

    /// Columns per row: the vocabulary size, or the number of tokens a
    /// subset head scores.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The token id of column `col`.
    pub fn token(&self, col: usize) -> u32 {
        match &self.tokens {
            Some(t) => t[col],
            None => col as u32,
        }
    }

    /// Each column's token id when the head scores only some tokens.
    pub fn tokens(&self) -> Option<&[u32]> {
        self.tokens.as_deref()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// The highest-scoring token of row i; the first column wins ties (the
    /// lowest id over the whole vocabulary), so greedy decoding is
    /// deterministic.
    pub fn argmax(&self, i: usize) -> u32 {
        self.token(specmesh_numeric::argmax(self.row(i)))
    }

    /// The `k` most likely tokens of row i with their log-probabilities,
    /// most likely first.
    pub fn top_k(&self, i: usize, k: usize) -> Vec<TopToken> {
        let row = self.row(i);
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let lse = max
            + row
                .iter()
                .map(|&v| ((v - max) as f64).exp())
                .sum::<f64>()
                .ln() as f32;
        let mut idx: Vec<u32> = (0..row.len() as u32).collect();
        let k = k.min(row.len());
        let by_score =
            |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        if k < idx.len() && k > 0 {
            idx.select_nth_unstable_by(k - 1, by_score);
        }
        idx.truncate(k);
        idx.sort_by(by_score);
        idx.into_iter()
            .map(|t| TopToken {
                token: self.token(t as usize),
                logprob: row[t as usize] - lse,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lowest_id_on_ties() {
        let l = Logits::new(4, vec![1.0, 3.0, 3.0, 0.0], None);
        assert_eq!(l.argmax(0), 1);
    }

    #[test]
    fn a_subset_head_answers_in_token_ids() {
        let l = Logits::new(3, vec![0.5, 2.0, 1.0], Some(Arc::from(vec![40, 7, 9])));
        assert_eq!(l.argmax(0), 7);
        assert_eq!((l.token(0), l.token(2)), (40, 9));
        let top: Vec<u32> = l.top_k(0, 3).iter().map(|t| t.token).collect();
        assert_eq!(top, vec![7, 9, 40]);
    }

    #[test]
    fn top_k_is_sorted_and_normalised() {
        let l = Logits::new(4, vec![0.0, 2.0, 1.0, 2.0], None);
        let top = l.top_k(0, 3);
        assert_eq!(
            top.iter().map(|t| t.token).collect::<Vec<_>>(),
            vec![1, 3, 2]
        );
        let total: f32 = l.top_k(0, 4).iter().map(|t| t.logprob.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}
