//! This machine's memory read bandwidth, measured the way a decode step
//! reads its weights: every thread of the pool streams its own share of a
//! buffer far larger than the last-level cache, once.
//!
//! A 1-token forward of a large model reads every weight byte once and does
//! little arithmetic per byte, so weight bytes ÷ this bandwidth is the floor
//! its step time cannot go below (`bench-model` reports the two side by
//! side).

use std::time::Instant;

use crate::threads::ThreadPool;

/// Best read bandwidth, in bytes per second, of `reps` passes over a buffer
/// of `bytes` bytes (rounded down to whole 4 KiB pages, at least 64 MiB
/// recommended: several times the L3 of a server CPU).
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, reps: usize) -> f64 {
    let words = (bytes / 4096).max(1) * 512;
    // Written first so every page is really mapped (a fresh zeroed page
    // would read from the shared zero page, i.e. from cache).
    let buf: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9))
        .collect();
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        pool.for_ranges(words, &|r| {
            std::hint::black_box(sum(&buf[r]));
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}

/// Wrapping sum with 8 independent chains, so loads, not the adds, bound
/// the loop (the compiler vectorises it to full-width loads).
fn sum(x: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*v);
        }
    }
    acc.iter().chain(tail).fold(0u64, |s, v| s.wrapping_add(*v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_is_positive_and_finite() {
        let pool = ThreadPool::new(2);
        let bw = read_bandwidth(&pool, 8 << 20, 2);
        assert!(bw.is_finite() && bw > 1e8, "{bw}");
    }
}
