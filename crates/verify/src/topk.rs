//! The target's most likely tokens at a row, for token recycling.
//!
//! Recycling (Luo et al. 2024, "Turning Trash into Treasure: Accelerating
//! Inference of Large Language Models with Token Recycling", arXiv
//! 2408.08696) reuses the target's runner-up tokens as the next round's
//! drafts. They are ranked by the raw row (log-softmax at temperature 1,
//! before top-k/top-p), so a request's sampling settings do not change what
//! is recycled.

use specmesh_sampling::Allowed;

/// A committed token's log-probability and its position's most likely
/// tokens, as the APIs' `logprobs` report them: log-softmax of the raw
/// row at temperature 1 (before temperature, top-k and top-p, as OpenAI and
/// vLLM report them), over the tokens a constraint allows when there is
/// one.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// Most likely first, lower token id first on ties.
    pub top: Vec<(u32, f32)>,
}

/// `token`'s [`TokenLogprobs`] at `row`, with `n` alternatives.
pub(crate) fn token_logprobs(
    row: &[f32],
    allowed: Option<Allowed<'_>>,
    token: u32,
    n: usize,
) -> TokenLogprobs {
    let Some(a) = allowed else {
        let best = top_entries(row, n.max(1));
        let lse = log_sum_exp(row, best.first().map_or(f32::NEG_INFINITY, |b| b.0));
        let lp = |t: u32| {
            row.get(t as usize)
                .map_or(f32::NEG_INFINITY, |&v| (v as f64 - lse) as f32)
        };
        return TokenLogprobs {
            token,
            logprob: lp(token),
            top: best.into_iter().take(n).map(|(_, t)| (t, lp(t))).collect(),
        };
    };
    // Under a mask: the allowed logits alone, so the normaliser and the
    // ranking see nothing else.
    let kept: Vec<(u32, f32)> = (0..row.len() as u32)
        .filter(|&t| a.allows(t))
        .map(|t| (t, row[t as usize]))
        .collect();
    let values: Vec<f32> = kept.iter().map(|e| e.1).collect();
    let best = top_entries(&values, n.max(1));
    let lse = log_sum_exp(&values, best.first().map_or(f32::NEG_INFINITY, |b| b.0));
    let lp = |v: f32| (v as f64 - lse) as f32;
    let logprob = if a.allows(token) {
        row.get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| lp(v))
    } else {
        f32::NEG_INFINITY
    };
    TokenLogprobs {
        token,
        logprob,
        top: best
            .into_iter()
            .take(n)
            .map(|(v, i)| (kept[i as usize].0, lp(v)))
            .collect(),
    }
}

/// The `k` largest entries of `row` as (token, log-probability), most likely
/// first, lower token id first on ties.
///
/// One pass keeps the best `k` in a small sorted buffer: almost every entry
/// fails a single comparison with the buffer's smallest, so the pass costs
/// little more than reading the row (this runs for every accepted node of
/// every verify step). The log-sum-exp is one more, vectorised, pass. NaN
/// logits count as probability zero: they never enter the top and add
/// ~1e-38 to the normaliser.
pub(crate) fn top_logprobs(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let best = top_entries(row, k);
    let lse = log_sum_exp(row, best.first().map_or(f32::NEG_INFINITY, |b| b.0));
    best.into_iter()
        .map(|(v, t)| (t, (v as f64 - lse) as f32))
        .collect()
}

/// The `k` largest (logit, token), best first, lower token first on ties.
/// Ids arrive in increasing order, so a later equal logit loses the tie:
/// only a strictly larger one enters. Blocks of 16 with nothing above the
/// buffer's smallest are skipped on one vectorised test: 82 → 12 µs per
/// 49k-token row (the per-entry loop ran at 1.7 ns per entry).
fn top_entries(row: &[f32], k: usize) -> Vec<(f32, u32)> {
    let k = k.min(row.len());
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    let mut floor = f32::NEG_INFINITY;
    for (b, block) in row.chunks(BLOCK).enumerate() {
        // Once the buffer is full almost every block holds nothing above
        // its smallest: one vectorised test skips it.
        if best.len() == k && !specmesh_numeric::any_above(block, floor) {
            continue;
        }
        for (i, &v) in block.iter().enumerate() {
            if v.is_nan() || (best.len() == k && v <= floor) {
                continue;
            }
            let at = best.partition_point(|&(x, _)| x >= v);
            best.insert(at, (v, (b * BLOCK + i) as u32));
            if best.len() > k {
                best.pop();
            }
            if best.len() == k {
                floor = best[k - 1].0;
            }
        }
    }
    best
}

/// Entries per block of [`top_entries`]'s skip test.
const BLOCK: usize = 16;

/// `ln Σ exp(row)`, shifted by its maximum `max`: the reported
/// log-probabilities' normaliser (`specmesh_numeric::log_sum_exp`, within
/// 1e-6 of the exact one and twice as fast as the sampler's f64 sum: it
/// runs for every accepted node of every verify step).
fn log_sum_exp(row: &[f32], max: f32) -> f64 {
    specmesh_numeric::log_sum_exp(row, max)
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
    fn the_block_skip_keeps_the_exact_top_and_its_ties() {
        let mut x = 0x2545_f491u32;
        for len in [5usize, 16, 17, 100, 1000, 4099] {
            // Few distinct values, so ties cross block boundaries.
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if x.is_multiple_of(97) {
                        f32::NAN
                    } else {
                        (x % 23) as f32
                    }
                })
                .collect();
            for k in [1, 3, 8, 40] {
                let mut want: Vec<(f32, u32)> = row
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| !v.is_nan())
                    .map(|(t, &v)| (v, t as u32))
                    .collect();
                want.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                want.truncate(k);
                assert_eq!(top_entries(&row, k), want, "len {len} k {k}");
            }
        }
    }

    #[test]
    fn nan_is_left_out_and_large_logits_do_not_overflow() {
        let row = [f32::NAN, 1e30, 1e30 - 1.0];
        let top = top_logprobs(&row, 3);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, 1);
        assert!(top[0].1.is_finite() && top[0].1 <= 0.0);
    }
}
