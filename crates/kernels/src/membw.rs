//! This machine's memory read bandwidth, measured the way a decode step
//! reads its weights: every thread of the pool streams its own share of a
//! buffer far larger than the last-level cache, once.
//!
//! A 1-token forward of a large model reads every weight byte once and does
//! little arithmetic per byte, so weight bytes ÷ this bandwidth is the floor
//! its step time cannot go below (`bench-model` reports the two side by
//! side).
//!
//! The read asks for its lines ahead in software, as the K-quant kernels
//! do: without that the hardware prefetchers alone measured 25–30 GB/s on
//! the Intel Xeon VM of docs/performance.md, below what the kernels
//! themselves then streamed (36 GB/s), and a floor the kernels beat is no
//! floor.

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

/// Bytes ahead of the line being summed that the read asks for.
const PREFETCH_BYTES: usize = 4096;

/// Wrapping sum with 8 independent chains, so loads, not the adds, bound
/// the loop (the compiler vectorises it to full-width loads); each 64-byte
/// line asks for the one [`PREFETCH_BYTES`] ahead.
fn sum(x: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        prefetch(c.as_ptr().wrapping_byte_add(PREFETCH_BYTES));
        for (a, v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*v);
        }
    }
    acc.iter().chain(tail).fold(0u64, |s, v| s.wrapping_add(*v))
}

#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64; a prefetch never faults, whatever the
    // address (this one may lie past the buffer).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
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
