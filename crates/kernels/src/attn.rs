//! The two inner loops of attention for one query: scores against a list of
//! key rows, and the probability-weighted sum of value rows.
//!
//! The query and the output accumulator stay in registers across all keys
//! (head_dim 64 or 128); rows are addressed by slot so the same code serves
//! committed prefix keys and a tree token's staged ancestors. A score
//! depends only on its query and key row (never on which other keys share
//! its group of four, or on where the key sits in the list) and the value
//! sum runs in slot order, so attention stays batch-invariant: a token
//! committed earlier and the same token staged in a tree give the same bits.
//!
//! With AVX-512 (chosen at run time, once per process) a score is a 16-lane
//! FMA chain over the head dimension, then four keys' lanes are summed
//! together by one shuffle tree of the same shape for each key. That is
//! about half the instructions of an 8-lane dot and horizontal sum per key.

/// `out[i] = scale · q · K[slots[i]]`, where row s of K starts at
/// `k[s * stride]` (`out.len()` = `slots.len()`).
pub fn qk_scores(
    q: &[f32],
    k: &[f32],
    stride: usize,
    slots: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    assert_eq!(out.len(), slots.len(), "one score per slot");
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512F is present; rows are bounds-checked inside.
        match q.len() {
            64 => return unsafe { avx512::qk::<4>(q, k, stride, slots, scale, out) },
            128 => return unsafe { avx512::qk::<8>(q, k, stride, slots, scale, out) },
            _ => {}
        }
    }
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
    for (o, &s) in out.iter_mut().zip(slots) {
        *o = crate::vec::dot(q, &k[s * stride..s * stride + d]) * scale;
    }
}

/// `out += Σ_i p[i] · V[slots[i]]`, one fused multiply-add per slot in slot
/// order (`out.len()` = head_dim). Summing a list in pieces, in order, gives
/// the bits of summing it whole into zeros.
pub fn pv_accumulate(p: &[f32], v: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) {
    assert_eq!(p.len(), slots.len(), "one probability per slot");
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: as in `qk_scores`.
        match out.len() {
            64 => return unsafe { avx512::pv::<4>(p, v, stride, slots, out) },
            128 => return unsafe { avx512::pv::<8>(p, v, stride, slots, out) },
            _ => {}
        }
    }
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
    for (&s, &w) in slots.iter().zip(p) {
        for (o, x) in out.iter_mut().zip(&v[s * stride..s * stride + d]) {
            *o = w.mul_add(*x, *o);
        }
    }
}

/// `out = Σ_i p[i] · V[slots[i]]` (overwrites `out`).
pub fn pv_sum(p: &[f32], v: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) {
    out.fill(0.0);
    pv_accumulate(p, v, stride, slots, out);
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
        out: &mut [f32],
    ) {
        unsafe {
            let qv: [__m256; N] = std::array::from_fn(|i| _mm256_loadu_ps(q.as_ptr().add(8 * i)));
            for (o, &s) in out.iter_mut().zip(slots) {
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
                *o = hsum(_mm256_add_ps(a0, a1)) * scale;
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
            let mut acc: [__m256; N] =
                std::array::from_fn(|i| _mm256_loadu_ps(out.as_ptr().add(8 * i)));
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    /// Row `s` of `m` (`16 · N` floats), bounds-checked.
    #[inline(always)]
    fn row<const N: usize>(m: &[f32], stride: usize, s: usize) -> *const f32 {
        m[s * stride..s * stride + 16 * N].as_ptr()
    }

    /// Padding keys for a last group of fewer than four.
    static ZEROS: [f32; 128] = [0.0; 128];

    /// `N` = head_dim / 16.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn qk<const N: usize>(
        q: &[f32],
        k: &[f32],
        stride: usize,
        slots: &[usize],
        scale: f32,
        out: &mut [f32],
    ) {
        unsafe {
            let qv: [__m512; N] = std::array::from_fn(|i| _mm512_loadu_ps(q.as_ptr().add(16 * i)));
            let scale4 = _mm_set1_ps(scale);
            let lane0s = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
            for (i, group) in slots.chunks(4).enumerate() {
                let rows: [*const f32; 4] = std::array::from_fn(|j| match group.get(j) {
                    Some(&s) => row::<N>(k, stride, s),
                    None => ZEROS.as_ptr(),
                });
                // One FMA chain per key over the head dimension.
                let acc: [__m512; 4] = std::array::from_fn(|j| {
                    let mut a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(rows[j]));
                    for (n, qn) in qv.iter().enumerate().skip(1) {
                        a = _mm512_fmadd_ps(*qn, _mm512_loadu_ps(rows[j].add(16 * n)), a);
                    }
                    a
                });
                // Sum each key's 16 lanes: 256-bit halves, then 128-bit
                // quarters, then within a quarter; the same tree per key.
                let ab = _mm512_add_ps(
                    _mm512_shuffle_f32x4(acc[0], acc[1], 0b01_00_01_00),
                    _mm512_shuffle_f32x4(acc[0], acc[1], 0b11_10_11_10),
                );
                let cd = _mm512_add_ps(
                    _mm512_shuffle_f32x4(acc[2], acc[3], 0b01_00_01_00),
                    _mm512_shuffle_f32x4(acc[2], acc[3], 0b11_10_11_10),
                );
                let x = _mm512_add_ps(
                    _mm512_shuffle_f32x4(ab, cd, 0b10_00_10_00),
                    _mm512_shuffle_f32x4(ab, cd, 0b11_01_11_01),
                );
                let x = _mm512_add_ps(x, _mm512_permute_ps(x, 0b01_00_11_10));
                let x = _mm512_add_ps(x, _mm512_permute_ps(x, 0b10_11_00_01));
                let sums = _mm512_castps512_ps128(_mm512_permutexvar_ps(lane0s, x));
                let sums = _mm_mul_ps(sums, scale4);
                if group.len() == 4 {
                    _mm_storeu_ps(out.as_mut_ptr().add(4 * i), sums);
                } else {
                    let mut tail = [0.0f32; 4];
                    _mm_storeu_ps(tail.as_mut_ptr(), sums);
                    out[4 * i..].copy_from_slice(&tail[..group.len()]);
                }
            }
        }
    }

    /// Same per-lane operations as the AVX2 `pv` (one FMA per slot, in slot
    /// order), 16 lanes at a time.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pv<const N: usize>(
        p: &[f32],
        v: &[f32],
        stride: usize,
        slots: &[usize],
        out: &mut [f32],
    ) {
        unsafe {
            let mut acc: [__m512; N] =
                std::array::from_fn(|n| _mm512_loadu_ps(out.as_ptr().add(16 * n)));
            for (&s, &w) in slots.iter().zip(p) {
                let r = row::<N>(v, stride, s);
                let wv = _mm512_set1_ps(w);
                for (n, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(r.add(16 * n)), *a);
                }
            }
            for (n, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * n), *a);
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
            let slots = [0usize, 3, 9, 4, 7, 1];
            let mut s = vec![0.0; slots.len()];
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
            let p = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
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

    #[test]
    fn a_score_does_not_depend_on_its_neighbours_or_place() {
        // The same key at every position of a group of four, among other
        // keys or padding, gives the same bits: a staged tree token and the
        // same token committed later score alike.
        for d in [64usize, 128] {
            let k: Vec<f32> = (0..d * 9)
                .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                .collect();
            let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
            let mut alone = [0.0];
            qk_scores(&q, &k, d, &[5], 0.125, &mut alone);
            for len in 1..=8 {
                for at in 0..len {
                    let slots: Vec<usize> = (0..len)
                        .map(|i| if i == at { 5 } else { (i * 3 + 1) % 9 })
                        .collect();
                    let mut s = vec![0.0; len];
                    qk_scores(&q, &k, d, &slots, 0.125, &mut s);
                    assert_eq!(
                        s[at].to_bits(),
                        alone[0].to_bits(),
                        "d={d} len={len} at={at}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_value_sum_in_pieces_equals_the_sum_whole() {
        for d in [64usize, 128, 24] {
            let v: Vec<f32> = (0..d * 40)
                .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                .collect();
            let slots: Vec<usize> = (0..37).map(|i| (i * 11) % 40).collect();
            let p: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin().abs()).collect();
            let mut whole = vec![0.0; d];
            pv_sum(&p, &v, d, &slots, &mut whole);
            let mut pieces = vec![0.0; d];
            for (s, w) in slots.chunks(8).zip(p.chunks(8)) {
                pv_accumulate(w, &v, d, s, &mut pieces);
            }
            assert_eq!(
                whole.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                pieces.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "d={d}"
            );
        }
    }

    /// Every implementation of the two loops this machine can run, by name:
    /// the dispatching functions pick one, and the others must stay
    /// correct for the CPUs that get them.
    type Qk = fn(&[f32], &[f32], usize, &[usize], f32, &mut [f32]);
    type Pv = fn(&[f32], &[f32], usize, &[usize], &mut [f32]);

    fn implementations() -> Vec<(&'static str, Qk, Pv)> {
        let mut v: Vec<(&'static str, Qk, Pv)> = vec![("dispatch", qk_scores, pv_accumulate)];
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        v.push((
            "avx2",
            |q, k, st, sl, sc, o| match q.len() {
                64 => unsafe { x86::qk::<8>(q, k, st, sl, sc, o) },
                _ => unsafe { x86::qk::<16>(q, k, st, sl, sc, o) },
            },
            |p, v, st, sl, o| match o.len() {
                64 => unsafe { x86::pv::<8>(p, v, st, sl, o) },
                _ => unsafe { x86::pv::<16>(p, v, st, sl, o) },
            },
        ));
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            v.push((
                "avx512",
                |q, k, st, sl, sc, o| match q.len() {
                    64 => unsafe { avx512::qk::<4>(q, k, st, sl, sc, o) },
                    _ => unsafe { avx512::qk::<8>(q, k, st, sl, sc, o) },
                },
                |p, v, st, sl, o| match o.len() {
                    64 => unsafe { avx512::pv::<4>(p, v, st, sl, o) },
                    _ => unsafe { avx512::pv::<8>(p, v, st, sl, o) },
                },
            ));
        }
        v
    }

    #[test]
    fn every_implementation_is_right_and_place_independent() {
        for (name, qk, pv) in implementations() {
            for d in [64usize, 128] {
                let stride = d * 3;
                let k: Vec<f32> = (0..stride * 12)
                    .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                    .collect();
                let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
                let slots: Vec<usize> = (0..11).map(|i| (i * 5 + 2) % 12).collect();
                let mut s = vec![0.0; slots.len()];
                qk(&q, &k, stride, &slots, 0.25, &mut s);
                let mut alone = [0.0];
                for (i, &slot) in slots.iter().enumerate() {
                    let row = &k[slot * stride..slot * stride + d];
                    let want: f64 = q.iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum();
                    assert!((s[i] as f64 - want * 0.25).abs() < 1e-3, "{name} d={d}");
                    qk(&q, &k, stride, &[slot], 0.25, &mut alone);
                    assert_eq!(alone[0].to_bits(), s[i].to_bits(), "{name} d={d} slot {i}");
                }
                let p: Vec<f32> = (0..slots.len()).map(|i| 0.05 * (i + 1) as f32).collect();
                let mut out = vec![0.0; d];
                pv(&p, &k, stride, &slots, &mut out);
                let mut pieces = vec![0.0; d];
                pv(&p[..5], &k, stride, &slots[..5], &mut pieces);
                pv(&p[5..], &k, stride, &slots[5..], &mut pieces);
                assert_eq!(out, pieces, "{name} d={d}");
                for j in 0..d {
                    let want: f64 = slots
                        .iter()
                        .zip(&p)
                        .map(|(&sl, w)| *w as f64 * k[sl * stride + j] as f64)
                        .sum();
                    assert!((out[j] as f64 - want).abs() < 1e-4, "{name} d={d}");
                }
            }
        }
    }
}
