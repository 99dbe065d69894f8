//! Sampling for specmesh: validated parameters, the target's processed
//! distribution (temperature → top-k → top-p), and randomness keyed by
//! (request seed, output position).
//!
//! The uniform used for the token at output position `i` is a pure function
//! of `(seed, i)` — a counter-based generator, not a stream consumed step by
//! step. Plain decoding and speculative decoding that samples y at each
//! position from the same distribution with the same uniform therefore emit
//! the same tokens, whatever the drafters proposed. Procedures that need
//! more randomness at a position (rejection sampling's accept tests) take
//! [`uniform_at`] draws 1, 2, ..., leaving draw 0 to plain sampling.

#![forbid(unsafe_code)]

mod params;
mod rng;

pub use params::{Allowed, SORTED_HEAD, SamplingError, SamplingParams};
pub use rng::{uniform, uniform_at};

/// Picks the next token from one row of logits at output position `position`.
///
/// Greedy (temperature 0) returns the argmax, lowest id on ties. Otherwise
/// the processed distribution is sampled by inverse CDF with
/// `uniform(seed, position)`.
pub fn sample(logits: &[f32], params: &SamplingParams, position: u64) -> u32 {
    sample_in(logits, params, position, None)
}

/// [`sample`] among the tokens `allowed` lets through (a grammar's mask):
/// greedy takes the best allowed token, sampling draws from the masked,
/// renormalised distribution with the same uniform. The mask must allow at
/// least one token of the row; otherwise token 0 is returned.
pub fn sample_in(
    logits: &[f32],
    params: &SamplingParams,
    position: u64,
    allowed: Option<Allowed<'_>>,
) -> u32 {
    if params.is_greedy() {
        return match allowed {
            None => argmax(logits),
            Some(a) => argmax_allowed(logits, a),
        };
    }
    let probs = params.distribution_in(logits, allowed);
    let u = uniform(params.seed, position);
    let mut acc = 0.0f64;
    for &(token, p) in &probs {
        acc += p;
        if u < acc {
            return token;
        }
    }
    // Rounding left u above the final cumulative sum: take the last candidate.
    probs.last().map_or(0, |&(t, _)| t)
}

/// Index of the largest value; the lowest index wins ties (see
/// [`specmesh_numeric::argmax`]).
pub fn argmax(logits: &[f32]) -> u32 {
    specmesh_numeric::argmax(logits) as u32
}

/// Index of the largest value among the allowed ones; the lowest index
/// wins ties (0 when none is allowed).
pub fn argmax_allowed(logits: &[f32], allowed: Allowed<'_>) -> u32 {
    let mut best: Option<usize> = None;
    for (wi, &w) in allowed.words().iter().enumerate() {
        let mut bits = w;
        while bits != 0 {
            let i = wi * 32 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let Some(&v) = logits.get(i) else {
                break;
            };
            if best.is_none_or(|b| v > logits[b]) {
                best = Some(i);
            }
        }
    }
    best.unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_confines_greedy_and_sampling_to_its_tokens() {
        let logits = [3.0f32, 1.0, 2.0, 2.0, 0.5];
        let words = [0b11010u32]; // tokens 1, 3, 4
        let a = Allowed::new(&words);
        assert_eq!(a.count(), 3);
        assert_eq!(a.single(), None);
        assert_eq!(Allowed::new(&[0, 1 << 5]).single(), Some(37));
        assert_eq!(sample_in(&logits, &SamplingParams::greedy(), 0, Some(a)), 3);
        let p = SamplingParams::new(1.0, 1.0, 0, 3).unwrap();
        let dist = p.distribution_in(&logits, Some(a));
        let ids: Vec<u32> = dist.iter().map(|e| e.0).collect();
        assert_eq!(ids, [3, 1, 4]);
        let z: f64 = [1.0f64, 2.0, 0.5].iter().map(|l| l.exp()).sum();
        assert!((dist[0].1 - 2f64.exp() / z).abs() < 1e-6);
        for i in 0..2000 {
            assert!(a.allows(sample_in(&logits, &p, i, Some(a))));
        }
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let p = SamplingParams::greedy();
        assert_eq!(sample(&[0.1, 2.0, 2.0, -1.0], &p, 0), 1);
    }

    #[test]
    fn sampling_is_a_function_of_seed_and_position() {
        let p = SamplingParams::new(1.0, 1.0, 0, 1234).unwrap();
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let a: Vec<u32> = (0..20).map(|i| sample(&logits, &p, i)).collect();
        let b: Vec<u32> = (0..20).map(|i| sample(&logits, &p, i)).collect();
        assert_eq!(a, b);
        let other = SamplingParams::new(1.0, 1.0, 0, 99).unwrap();
        let c: Vec<u32> = (0..20).map(|i| sample(&logits, &other, i)).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn empirical_frequencies_follow_the_softmax() {
        let p = SamplingParams::new(1.0, 1.0, 0, 7).unwrap();
        let logits = [0.0f32, 1.0, 2.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let mut counts = [0usize; 3];
        let n = 60_000;
        for i in 0..n {
            counts[sample(&logits, &p, i) as usize] += 1;
        }
        for (c, l) in counts.iter().zip(logits) {
            let want = (l as f64).exp() / z;
            // 5 standard deviations: a false alarm about once in 3.5 million runs.
            let sd = (want * (1.0 - want) / n as f64).sqrt();
            assert!((*c as f64 / n as f64 - want).abs() < 5.0 * sd, "{counts:?}");
        }
    }
}
