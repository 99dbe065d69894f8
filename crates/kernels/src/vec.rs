//! Vector ops of a transformer layer, written with a fixed evaluation order
//! (8 independent lanes, then a fixed pairwise reduction) so they vectorize
//! and still give the same bits for a row whatever the batch around it.

const LANES: usize = 8;

#[inline(always)]
fn reduce(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// Σ a\[i\]·b\[i\].
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    // SAFETY: the build enables AVX2 and FMA (x86-64-v3), so every CPU the
    // binary runs on has them.
    return unsafe { dot_avx2(a, b) };
    #[allow(unreachable_code)]
    dot_portable(a, b)
}

/// Sum of the 8 lanes of `v` in a fixed order.
///
/// # Safety
/// The CPU must support AVX; callers are AVX2 kernels (compiled for it or
/// entered after run-time detection), into which this inlines.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    unsafe {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_movehdup_ps(h));
        _mm_cvtss_f32(h)
    }
}

/// Two 8-lane FMA accumulators; LLVM does not vectorize the portable
/// version well for head-sized (64) vectors.
///
/// # Safety
/// The CPU must support AVX2 and FMA, which the build guarantees: this
/// function is compiled only with those target features. Loads stay below
/// `min(a.len(), b.len())`.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // SAFETY: every load reads 8 floats at i < n - 7 of both slices.
    unsafe {
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
            i += 16;
        }
        if i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
        let mut s = hsum256(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }
}

/// [`dot`] in portable Rust: 8 independent lanes, then the fixed pairwise
/// reduction and the tail in order (attention's portable kernel).
#[inline]
pub(crate) fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = reduce(acc);
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

/// y += a·x.
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// out = x / rms(x) · w, rms over the row (RMSNorm, Zhang & Sennrich 2019).
#[inline]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, x), w) in out.iter_mut().zip(x).zip(w) {
        *o = x * scale * w;
    }
}

/// gate = silu(gate) · up, in place (SwiGLU, Shazeer 2020).
#[inline]
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// e^x for x ≤ 0 (softmax arguments), branch-free and deterministic; it
/// lives in `specmesh-numeric`, shared with the samplers (see there).
pub use specmesh_numeric::exp_neg;

/// In-place softmax; leaves probabilities summing to 1.
#[inline]
pub fn softmax(x: &mut [f32]) {
    let (_, sum) = softmax_unnormalized(x);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x_i ← e^(x_i − max)`; returns `(max, Σ x_i)`, what a softmax over
/// several ranges of scores combines (an empty `x` gives `(−∞, 0)`).
#[inline]
pub fn softmax_unnormalized(x: &mut [f32]) -> (f32, f32) {
    // Lane-wise, so it vectorises (a serial fold waits on each `max`);
    // the maximum is the same whatever the order.
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for c in chunks {
        for l in 0..LANES {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    let max = lanes.iter().fold(rest, |m, &v| m.max(v));
    for v in x.iter_mut() {
        *v = exp_neg(*v - max);
    }
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    (max, reduce(acc) + tail)
}

/// Asks the CPU to bring the cache lines of `data` into L1 ahead of their
/// use: a hint, with no effect on any result. Attention reads one KV head's
/// rows at a stride of all heads, a pattern the hardware prefetchers follow
/// poorly, so it asks for the next chunk while the current one is used.
#[inline]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = data.as_ptr() as usize & !63;
        let end = data.as_ptr() as usize + std::mem::size_of_val(data);
        for line in (start..end).step_by(64) {
            // SAFETY: a prefetch never faults; every line holds part of
            // `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_sum_closely() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 5) as f32 - 2.0).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-3);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1e30];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] < 1e-30);
    }
}
