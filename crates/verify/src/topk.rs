//! The target's most likely tokens at a row, for token recycling.
//!
//! Recycling (Luo et al. 2024, "Turning Trash into Treasure: Accelerating
//! Inference of Large Language Models with Token Recycling", arXiv
//! 2408.08696) reuses the target's runner-up tokens as the next round's
//! drafts. They are ranked by the raw row (log-softmax at temperature 1,
//! before top-k/top-p), so a request's sampling settings do not change what
//! is recycled.

use std::cmp::Ordering;

/// The `k` largest entries of `row` as (token, log-probability), most likely
/// first, lower token id first on ties.
///
/// A partial selection (`select_nth_unstable_by`) finds them in O(vocab)
/// and only those `k` are sorted; the log-sum-exp is one more pass. NaN
/// logits count as probability zero: they rank below every number and are
/// left out of the normaliser, and their own log-probability stays NaN (the
/// verifier reports what the model produced rather than refusing it).
pub(crate) fn top_logprobs(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(row.len());
    if k == 0 {
        return Vec::new();
    }
    let by_rank = |a: &u32, b: &u32| rank(row, *a, *b);
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_rank);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_rank);
    let lse = log_sum_exp(row);
    idx.into_iter()
        .map(|t| (t, (row[t as usize] as f64 - lse) as f32))
        .collect()
}

/// Higher logit first, NaN last, lower id first on ties.
fn rank(row: &[f32], a: u32, b: u32) -> Ordering {
    let (x, y) = (row[a as usize], row[b as usize]);
    match (x.is_nan(), y.is_nan()) {
        (false, false) => y.total_cmp(&x),
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (true, true) => Ordering::Equal,
    }
    .then(a.cmp(&b))
}

/// `ln Σ exp(row)` over the non-NaN entries, in f64 and shifted by the
/// maximum so it cannot overflow.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    if !max.is_finite() {
        // All -inf (or +inf present): nothing sensible to shift by.
        return max;
    }
    let sum: f64 = row
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (v as f64 - max).exp())
        .sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_largest_in_order_with_log_softmax_values() {
        let row = [0.0f32, 3.0, 1.0, 3.0, -2.0];
        let top = top_logprobs(&row, 3);
        let tokens: Vec<u32> = top.iter().map(|e| e.0).collect();
        assert_eq!(tokens, [1, 3, 2]);
        let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
        for (t, lp) in top {
            let want = (row[t as usize] as f64).exp() / z;
            assert!((lp as f64 - want.ln()).abs() < 1e-6);
        }
    }

    #[test]
    fn k_beyond_the_vocabulary_returns_everything_and_zero_nothing() {
        let row = [1.0f32, 2.0];
        assert_eq!(top_logprobs(&row, 10).len(), 2);
        assert!(top_logprobs(&row, 0).is_empty());
        assert!(top_logprobs(&[], 3).is_empty());
    }

    #[test]
    fn nan_ranks_last_and_large_logits_do_not_overflow() {
        let row = [f32::NAN, 1e30, 1e30 - 1.0];
        let top = top_logprobs(&row, 3);
        assert_eq!(top[0].0, 1);
        assert_eq!(top[2].0, 0);
        assert!(top[0].1.is_finite() && top[0].1 <= 0.0);
    }
}
