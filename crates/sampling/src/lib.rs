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

pub use params::{SORTED_HEAD, SamplingError, SamplingParams};
pub use rng::{uniform, uniform_at};

/// Picks the next token from one row of logits at output position `position`.
///
/// Greedy (temperature 0) returns the argmax, lowest id on ties. Otherwise
/// the processed distribution is sampled by inverse CDF with
/// `uniform(seed, position)`.
pub fn sample(logits: &[f32], params: &SamplingParams, position: u64) -> u32 {
    if params.is_greedy() {
        return argmax(logits);
    }
    let probs = params.distribution(logits);
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

/// Index of the largest value; the lowest index wins ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

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
