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
//! The implementation ([`AttnKernel`]) follows the model's [`Isa`], as the
//! matmuls do: portable Rust for `Isa::Scalar`, 256-bit FMA for AVX2 and
//! AVX-VNNI, and for the AVX-512 ISAs a 16-lane FMA chain per score over
//! the head dimension, four keys' lanes then summed together by one
//! shuffle tree of the same shape for each key (about half the
//! instructions of an 8-lane dot and horizontal sum per key). Value sums
//! are one fused multiply-add per slot and lane on every kernel, so they
//! are bit-identical across kernels; scores differ in summation order.

use crate::isa::Isa;

/// An implementation of the attention loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnKernel {
    /// Portable Rust: `Isa::Scalar`, head sizes other than 64 and 128, and
    /// builds or CPUs without the SIMD kernels.
    Portable,
    /// 256-bit FMA (`Isa::Avx2`, `Isa::AvxVnni`); in builds for x86-64-v3.
    Avx2,
    /// 512-bit FMA (`Isa::Avx512Vnni`, `Isa::AmxInt8`); needs AVX-512F.
    Avx512,
}

impl AttnKernel {
    pub const ALL: [AttnKernel; 3] = [AttnKernel::Portable, AttnKernel::Avx2, AttnKernel::Avx512];

    /// The kernel attention runs for matmul ISA `isa` and head size
    /// `head_dim`: the ISA's own width, else the widest narrower kernel
    /// this build and CPU can run (so an unsupported `isa` never reaches
    /// instructions the CPU lacks), and always [`AttnKernel::Portable`]
    /// for `Isa::Scalar` or a head size without a SIMD kernel.
    pub fn select(isa: Isa, head_dim: usize) -> AttnKernel {
        if !matches!(head_dim, 64 | 128) {
            return AttnKernel::Portable;
        }
        let widest_first: &[AttnKernel] = match isa {
            Isa::Scalar => &[],
            Isa::Avx2 | Isa::AvxVnni => &[AttnKernel::Avx2],
            Isa::Avx512Vnni | Isa::AmxInt8 => &[AttnKernel::Avx512, AttnKernel::Avx2],
        };
        widest_first
            .iter()
            .copied()
            .find(|k| k.supported())
            .unwrap_or(AttnKernel::Portable)
    }

    /// Whether this build and CPU can run the kernel.
    pub fn supported(self) -> bool {
        match self {
            AttnKernel::Portable => true,
            AttnKernel::Avx2 => cfg!(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma"
            )),
            #[cfg(target_arch = "x86_64")]
            AttnKernel::Avx512 => avx512::available(),
            #[cfg(not(target_arch = "x86_64"))]
            AttnKernel::Avx512 => false,
        }
    }
}

impl std::fmt::Display for AttnKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttnKernel::Portable => "portable",
            AttnKernel::Avx2 => "avx2",
            AttnKernel::Avx512 => "avx512",
        })
    }
}

/// `out[i] = scale · q · K[slots[i]]`, where row s of K starts at
/// `k[s * stride]` (`out.len()` = `slots.len()`), on the kernel
/// [`AttnKernel::select`] picks for `isa`.
pub fn qk_scores(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    stride: usize,
    slots: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    qk_on(
        AttnKernel::select(isa, q.len()),
        q,
        k,
        stride,
        slots,
        scale,
        out,
    );
}

/// `out += Σ_i p[i] · V[slots[i]]`, one fused multiply-add per slot in slot
/// order (`out.len()` = head_dim), on the kernel [`AttnKernel::select`]
/// picks for `isa`. Summing a list in pieces, in order, gives the bits of
/// summing it whole into zeros.
pub fn pv_accumulate(
    isa: Isa,
    p: &[f32],
    v: &[f32],
    stride: usize,
    slots: &[usize],
    out: &mut [f32],
) {
    pv_on(AttnKernel::select(isa, out.len()), p, v, stride, slots, out);
}

/// `out = Σ_i p[i] · V[slots[i]]` (overwrites `out`).
pub fn pv_sum(isa: Isa, p: &[f32], v: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) {
    out.fill(0.0);
    pv_accumulate(isa, p, v, stride, slots, out);
}

/// [`qk_scores`] on `kernel`; one the build, the CPU or the head size
/// cannot run falls back to the portable loop.
fn qk_on(
    kernel: AttnKernel,
    q: &[f32],
    k: &[f32],
    stride: usize,
    slots: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    assert_eq!(out.len(), slots.len(), "one score per slot");
    match (kernel, q.len()) {
        #[cfg(target_arch = "x86_64")]
        (AttnKernel::Avx512, d @ (64 | 128)) if avx512::available() => {
            // SAFETY: AVX-512F is present; the query has 16·N floats and
            // each slot's row of as many is bounds-checked inside.
            unsafe {
                match d {
                    64 => avx512::qk::<4>(q, k, stride, slots, scale, out),
                    _ => avx512::qk::<8>(q, k, stride, slots, scale, out),
                }
            }
        }
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        (AttnKernel::Avx2, d @ (64 | 128)) => {
            // SAFETY: the build enables AVX2 and FMA; the query has 8·N
            // floats and each slot's row of as many is bounds-checked
            // before the unchecked loads.
            unsafe {
                match d {
                    64 => x86::qk::<8>(q, k, stride, slots, scale, out),
                    _ => x86::qk::<16>(q, k, stride, slots, scale, out),
                }
            }
        }
        _ => {
            let d = q.len();
            for (o, &s) in out.iter_mut().zip(slots) {
                *o = crate::vec::dot_portable(q, &k[s * stride..s * stride + d]) * scale;
            }
        }
    }
}

/// [`pv_accumulate`] on `kernel`; one the build, the CPU or the head size
/// cannot run falls back to the portable loop.
fn pv_on(
    kernel: AttnKernel,
    p: &[f32],
    v: &[f32],
    stride: usize,
    slots: &[usize],
    out: &mut [f32],
) {
    assert_eq!(p.len(), slots.len(), "one probability per slot");
    match (kernel, out.len()) {
        #[cfg(target_arch = "x86_64")]
        (AttnKernel::Avx512, d @ (64 | 128)) if avx512::available() => {
            // SAFETY: as in `qk_on`.
            unsafe {
                match d {
                    64 => avx512::pv::<4>(p, v, stride, slots, out),
                    _ => avx512::pv::<8>(p, v, stride, slots, out),
                }
            }
        }
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        (AttnKernel::Avx2, d @ (64 | 128)) => {
            // SAFETY: as in `qk_on`.
            unsafe {
                match d {
                    64 => x86::pv::<8>(p, v, stride, slots, out),
                    _ => x86::pv::<16>(p, v, stride, slots, out),
                }
            }
        }
        _ => {
            let d = out.len();
            for (&s, &w) in slots.iter().zip(p) {
                for (o, x) in out.iter_mut().zip(&v[s * stride..s * stride + d]) {
                    *o = w.mul_add(*x, *o);
                }
            }
        }
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
    ///
    /// # Safety
    /// `q` must hold at least `8 · N` floats (head_dim; `N` even, ≥ 2), and
    /// the CPU must support AVX2 and FMA, which the build guarantees (this
    /// module is compiled only with those target features). Each slot's
    /// key row is bounds-checked (`k[s · stride..][..8 · N]`, panicking if
    /// out of range) before it is read.
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

    /// `out += Σ_i p[i] · V[slots[i]]`, `N` = head_dim / 8.
    ///
    /// # Safety
    /// `out` must hold at least `8 · N` floats (head_dim), and the CPU
    /// must support AVX2 and FMA, which the build guarantees (this module
    /// is compiled only with those target features). Each slot's value row
    /// is bounds-checked before it is read.
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
    ///
    /// # Safety
    /// The CPU must support AVX-512F ([`available`], checked by the
    /// dispatcher), `q` must hold at least `16 · N` floats (head_dim,
    /// N ≤ 8 so that the padding rows of [`ZEROS`] are long enough), and
    /// `out.len() >= slots.len()`. Each slot's key row is bounds-checked
    /// before it is read.
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
    ///
    /// # Safety
    /// The CPU must support AVX-512F ([`available`], checked by the
    /// dispatcher), and `out` must hold at least `16 · N` floats
    /// (head_dim). Each slot's value row is bounds-checked before it is
    /// read.
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

    /// The ISAs this CPU runs; each one it lacks is reported on stderr.
    fn isas() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| {
                let ok = isa.supported();
                if !ok {
                    eprintln!("skipped: this CPU lacks {isa}");
                }
                ok
            })
            .collect()
    }

    /// Every kernel this build and CPU can run, by name: the dispatching
    /// functions pick one per ISA, and the others must stay correct for
    /// the CPUs that get them. Each one that cannot run here is reported.
    fn kernels() -> Vec<AttnKernel> {
        AttnKernel::ALL
            .into_iter()
            .filter(|kernel| {
                let ok = kernel.supported();
                if !ok {
                    let lacks = match kernel {
                        AttnKernel::Avx512 => "this CPU lacks avx512f",
                        _ => "this build lacks avx2 and fma",
                    };
                    eprintln!("skipped: {lacks} (attention kernel {kernel})");
                }
                ok
            })
            .collect()
    }

    #[test]
    fn scores_and_sums_match_the_naive_loops() {
        for isa in isas() {
            for d in [64usize, 128, 24] {
                let stride = d * 3;
                let k: Vec<f32> = (0..stride * 10)
                    .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
                    .collect();
                let q: Vec<f32> = (0..d).map(|i| (i % 9) as f32 / 4.0 - 1.0).collect();
                let slots = [0usize, 3, 9, 4, 7, 1];
                let mut s = vec![0.0; slots.len()];
                qk_scores(isa, &q, &k, stride, &slots, 0.5, &mut s);
                for (i, &slot) in slots.iter().enumerate() {
                    let want: f32 = q
                        .iter()
                        .zip(&k[slot * stride..])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * 0.5;
                    assert!((s[i] - want).abs() < 1e-4, "{isa} d={d}");
                }
                let p = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
                let mut out = vec![9.0; d];
                pv_sum(isa, &p, &k, stride, &slots, &mut out);
                for j in 0..d {
                    let want: f32 = slots
                        .iter()
                        .zip(&p)
                        .map(|(&sl, w)| w * k[sl * stride + j])
                        .sum();
                    assert!((out[j] - want).abs() < 1e-5, "{isa} d={d}");
                }
            }
        }
    }

    #[test]
    fn a_score_does_not_depend_on_its_neighbours_or_place() {
        // The same key at every position of a group of four, among other
        // keys or padding, gives the same bits: a staged tree token and the
        // same token committed later score alike.
        for isa in isas() {
            for d in [64usize, 128] {
                let k: Vec<f32> = (0..d * 9)
                    .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                    .collect();
                let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
                let mut alone = [0.0];
                qk_scores(isa, &q, &k, d, &[5], 0.125, &mut alone);
                for len in 1..=8 {
                    for at in 0..len {
                        let slots: Vec<usize> = (0..len)
                            .map(|i| if i == at { 5 } else { (i * 3 + 1) % 9 })
                            .collect();
                        let mut s = vec![0.0; len];
                        qk_scores(isa, &q, &k, d, &slots, 0.125, &mut s);
                        assert_eq!(
                            s[at].to_bits(),
                            alone[0].to_bits(),
                            "{isa} d={d} len={len} at={at}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_value_sum_in_pieces_equals_the_sum_whole() {
        for isa in isas() {
            for d in [64usize, 128, 24] {
                let v: Vec<f32> = (0..d * 40)
                    .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                    .collect();
                let slots: Vec<usize> = (0..37).map(|i| (i * 11) % 40).collect();
                let p: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin().abs()).collect();
                let mut whole = vec![0.0; d];
                pv_sum(isa, &p, &v, d, &slots, &mut whole);
                let mut pieces = vec![0.0; d];
                for (s, w) in slots.chunks(8).zip(p.chunks(8)) {
                    pv_accumulate(isa, w, &v, d, s, &mut pieces);
                }
                assert_eq!(
                    whole.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    pieces.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa} d={d}"
                );
            }
        }
    }

    #[test]
    fn every_implementation_is_right_and_place_independent() {
        for kernel in kernels() {
            let name = kernel.to_string();
            for d in [64usize, 128] {
                let stride = d * 3;
                let k: Vec<f32> = (0..stride * 12)
                    .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                    .collect();
                let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
                let slots: Vec<usize> = (0..11).map(|i| (i * 5 + 2) % 12).collect();
                let mut s = vec![0.0; slots.len()];
                qk_on(kernel, &q, &k, stride, &slots, 0.25, &mut s);
                let mut alone = [0.0];
                for (i, &slot) in slots.iter().enumerate() {
                    let row = &k[slot * stride..slot * stride + d];
                    let want: f64 = q.iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum();
                    assert!((s[i] as f64 - want * 0.25).abs() < 1e-3, "{name} d={d}");
                    qk_on(kernel, &q, &k, stride, &[slot], 0.25, &mut alone);
                    assert_eq!(alone[0].to_bits(), s[i].to_bits(), "{name} d={d} slot {i}");
                }
                let p: Vec<f32> = (0..slots.len()).map(|i| 0.05 * (i + 1) as f32).collect();
                let mut out = vec![0.0; d];
                pv_on(kernel, &p, &k, stride, &slots, &mut out);
                let mut pieces = vec![0.0; d];
                pv_on(kernel, &p[..5], &k, stride, &slots[..5], &mut pieces);
                pv_on(kernel, &p[5..], &k, stride, &slots[5..], &mut pieces);
                assert_eq!(out, pieces, "{name} d={d}");
                for j in 0..d {
                    let want: f64 = slots
                        .iter()
                        .zip(&p)
                        .map(|(&sl, w)| *w as f64 * k[sl * stride + j] as f64)
                        .sum();
                    assert!((out[j] as f64 - want).abs() < 1e-4, "{name} d={d}");
                }
                // One fused multiply-add per slot and lane on every kernel.
                let mut portable = vec![0.0; d];
                pv_on(AttnKernel::Portable, &p, &k, stride, &slots, &mut portable);
                assert_eq!(
                    out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    portable.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{name} d={d}: value sums as the portable kernel's"
                );
            }
        }
    }

    #[test]
    fn attention_follows_the_isa() {
        // Scalar is portable at every head size; every ISA maps to a kernel
        // this machine runs (an unsupported ISA falls back rather than
        // reaching instructions the CPU lacks), and odd head sizes are
        // portable everywhere.
        for d in [24usize, 64, 128] {
            assert_eq!(AttnKernel::select(Isa::Scalar, d), AttnKernel::Portable);
            for isa in Isa::ALL {
                let kernel = AttnKernel::select(isa, d);
                assert!(kernel.supported(), "{isa} d={d}: {kernel}");
                if d == 24 {
                    assert_eq!(kernel, AttnKernel::Portable, "{isa} d={d}");
                }
            }
        }
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        {
            assert_eq!(AttnKernel::select(Isa::Avx2, 64), AttnKernel::Avx2);
            assert_eq!(AttnKernel::select(Isa::AvxVnni, 128), AttnKernel::Avx2);
        }
        let avx512 = AttnKernel::Avx512.supported();
        if !avx512 {
            eprintln!("skipped: this CPU lacks avx512f (attention for avx512-vnni, amx-int8)");
        }
        for isa in [Isa::Avx512Vnni, Isa::AmxInt8] {
            if avx512 {
                assert_eq!(AttnKernel::select(isa, 64), AttnKernel::Avx512, "{isa}");
            }
        }
        // The dispatching functions run the selected kernel, bit for bit.
        for isa in isas() {
            for d in [64usize, 128] {
                let kernel = AttnKernel::select(isa, d);
                let k: Vec<f32> = (0..d * 20)
                    .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                    .collect();
                let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
                let slots: Vec<usize> = (0..19).map(|i| (i * 7 + 3) % 20).collect();
                let (mut got, mut want) = (vec![0.0; 19], vec![0.0; 19]);
                qk_scores(isa, &q, &k, d, &slots, 0.125, &mut got);
                qk_on(kernel, &q, &k, d, &slots, 0.125, &mut want);
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa} d={d} runs {kernel}"
                );
            }
        }
        // Scalar really is the portable loop: its scores are those of the
        // portable dot product, which the SIMD kernels do not reproduce.
        let d = 64;
        let k: Vec<f32> = (0..d * 4)
            .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
            .collect();
        let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
        let mut s = vec![0.0; 4];
        qk_scores(Isa::Scalar, &q, &k, d, &[0, 1, 2, 3], 1.0, &mut s);
        for (i, s) in s.iter().enumerate() {
            let want = crate::vec::dot_portable(&q, &k[i * d..(i + 1) * d]);
            assert_eq!(s.to_bits(), want.to_bits(), "slot {i}");
        }
    }
}
