//! The two inner loops of attention for one query: scores against a list of
//! key rows, and the probability-weighted sum of value rows.
//!
//! The query and the output accumulator stay in registers across all keys
//! (head_dim 64 or 128 with AVX2); rows are addressed by slot so the same
//! code serves committed prefix keys and a tree token's staged ancestors.
//! Per query the operations depend only on its own slots, never on other
//! queries: attention stays batch-invariant.

/// `out[i] = scale · q · K[slots[i]]`, where row s of K starts at `k[s * stride]`.
pub fn qk_scores(
    q: &[f32],
    k: &[f32],
    stride: usize,
    slots: &[usize],
    scale: f32,
    out: &mut Vec<f32>,
) {
    out.clear();
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the build enables AVX2 and FMA; each slot's row of
        // `q.len()` floats is bounds-checked before the unchecked loads.
        match q.len() {
            64 => return unsafe { x86::qk::<8>(q, k, stride, slots, scale, out) },
            128 => return unsafe { x86::qk::<16>(q, k, stride, slots, scale, out) },
            _ => {}
        }
    }
    let d = q.len();
    out.extend(
        slots
            .iter()
            .map(|&s| crate::vec::dot(q, &k[s * stride..s * stride + d]) * scale),
    );
}

/// `out = Σ_i p[i] · V[slots[i]]` (overwrites `out`, `out.len()` = head_dim).
pub fn pv_sum(p: &[f32], v: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) {
    assert_eq!(p.len(), slots.len(), "one probability per slot");
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: as in `qk_scores`.
        match out.len() {
            64 => return unsafe { x86::pv::<8>(p, v, stride, slots, out) },
            128 => return unsafe { x86::pv::<16>(p, v, stride, slots, out) },
            _ => {}
        }
    }
    let d = out.len();
    out.fill(0.0);
    for (&s, &w) in slots.iter().zip(p) {
        crate::vec::axpy(w, &v[s * stride..s * stride + d], out);
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod x86 {
    use std::arch::x86_64::*;

    use crate::vec::hsum256 as hsum;

    /// `N` = head_dim / 8.
    pub(super) unsafe fn qk<const N: usize>(
        q: &[f32],
        k: &[f32],
        stride: usize,
        slots: &[usize],
        scale: f32,
        out: &mut Vec<f32>,
    ) {
        unsafe {
            let qv: [__m256; N] = std::array::from_fn(|i| _mm256_loadu_ps(q.as_ptr().add(8 * i)));
            out.reserve(slots.len());
            for &s in slots {
                let row = &k[s * stride..s * stride + 8 * N];
                let mut a0 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(row.as_ptr()));
                let mut a1 = _mm256_mul_ps(qv[1], _mm256_loadu_ps(row.as_ptr().add(8)));
                for i in (2..N).step_by(2) {
                    a0 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(row.as_ptr().add(8 * i)), a0);
                    a1 = _mm256_fmadd_ps(
                        qv[i + 1],
                        _mm256_loadu_ps(row.as_ptr().add(8 * i + 8)),
                        a1,
                    );
                }
                out.push(hsum(_mm256_add_ps(a0, a1)) * scale);
            }
        }
    }

    pub(super) unsafe fn pv<const N: usize>(
        p: &[f32],
        v: &[f32],
        stride: usize,
        slots: &[usize],
        out: &mut [f32],
    ) {
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            for (&s, &w) in slots.iter().zip(p) {
                let row = &v[s * stride..s * stride + 8 * N];
                let wv = _mm256_set1_ps(w);
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(row.as_ptr().add(8 * i)), *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_and_sums_match_the_naive_loops() {
        for d in [64usize, 128, 24] {
            let stride = d * 3;
            let k: Vec<f32> = (0..stride * 10)
                .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
                .collect();
            let q: Vec<f32> = (0..d).map(|i| (i % 9) as f32 / 4.0 - 1.0).collect();
            let slots = [0usize, 3, 9, 4];
            let mut s = Vec::new();
            qk_scores(&q, &k, stride, &slots, 0.5, &mut s);
            for (i, &slot) in slots.iter().enumerate() {
                let want: f32 = q
                    .iter()
                    .zip(&k[slot * stride..])
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    * 0.5;
                assert!((s[i] - want).abs() < 1e-4, "d={d}");
            }
            let p = [0.1f32, 0.2, 0.3, 0.4];
            let mut out = vec![9.0; d];
            pv_sum(&p, &k, stride, &slots, &mut out);
            for j in 0..d {
                let want: f32 = slots
                    .iter()
                    .zip(&p)
                    .map(|(&sl, w)| w * k[sl * stride + j])
                    .sum();
                assert!((out[j] - want).abs() < 1e-5, "d={d}");
            }
        }
    }
}
