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
/// `k[s * stride]` (`out.len()` = `slots.len()`), on `kernel` (chosen once
/// by [`AttnKernel::select`], not per call); a kernel the build, the CPU or
/// the head size cannot run falls back to the portable loop.
pub fn qk_scores(
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

/// `out += Σ_i p[i] · V[slots[i]]`, one fused multiply-add per slot in slot
/// order (`out.len()` = head_dim), on `kernel` as in [`qk_scores`]. Summing
/// a list in pieces, in order, gives the bits of summing it whole into
/// zeros.
pub fn pv_accumulate(
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
            // SAFETY: as in `qk_scores`.
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
            // SAFETY: as in `qk_scores`.
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

/// `out = Σ_i p[i] · V[slots[i]]` (overwrites `out`).
pub fn pv_sum(
    kernel: AttnKernel,
    p: &[f32],
    v: &[f32],
    stride: usize,
    slots: &[usize],
    out: &mut [f32],
) {
    out.fill(0.0);
    pv_accumulate(kernel, p, v, stride, slots, out);
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
mod tests;
