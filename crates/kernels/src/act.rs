//! Activation rows quantized to int8 blocks, the left operand of every
//! quantized matmul: 32-element blocks (GGML's Q8_1 idea, with f32 copies
//! of its f16 scales) for the 32-element weight formats, and 256-element
//! blocks with an f32 scale and sums per 16 (GGML's Q8_K) for the K-quants.
//!
//! Each row is quantized on its own, from its own values only, so a row's
//! int8 image never depends on which other rows are in the batch.

use half::f16;

use crate::format::{BLOCK, SUPER_BLOCK};

/// One 32-element block of a quantized activation row.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(16))]
pub struct BlockQ8 {
    /// Scale: element i ≈ d · qs\[i\].
    pub d: f32,
    /// d · Σ qs, the block sum that Q4_1's offset `m` multiplies.
    pub s: f32,
    /// Σ qs as an integer, for Q4_0's −8 bias.
    pub qsum: i32,
    _pad: i32,
    pub qs: [i8; BLOCK],
}

/// One 256-element block of a quantized activation row, for the K-quant
/// kernels (GGML's `block_q8_K` recipe and values).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct BlockQ8K {
    pub qs: [i8; SUPER_BLOCK],
    /// Scale: element i ≈ d · qs\[i\] (f32, as GGML keeps it).
    pub d: f32,
    /// Σ qs over each 16 elements (Q6_K's sub-blocks).
    pub bsums: [i16; 16],
    /// Σ qs over each 32 elements (Q4_K's sub-blocks).
    pub bsums32: [i16; 8],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            qs: [0; SUPER_BLOCK],
            d: 0.0,
            bsums: [0; 16],
            bsums32: [0; 8],
        }
    }
}

/// Which block size a [`QuantizedRows`] currently holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Layout {
    #[default]
    Blocks32,
    Blocks256,
}

/// `rows` activation rows of `cols` elements, quantized block-wise.
///
/// The buffer is reused across calls ([`QuantizedRows::quantize`] resizes in
/// place) so the decode loop does not allocate.
#[derive(Clone, Debug, Default)]
pub struct QuantizedRows {
    rows: usize,
    blocks_per_row: usize,
    layout: Layout,
    blocks: Vec<BlockQ8>,
    kblocks: Vec<BlockQ8K>,
}

impl QuantizedRows {
    /// Quantizes `x` (`rows × cols`, row-major) into `self`.
    ///
    /// # Panics
    /// If `cols` is not a multiple of 32 or `x.len()` is not a multiple of
    /// `cols`; callers check shapes when the weights are loaded.
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        assert!(
            cols.is_multiple_of(BLOCK) && x.len().is_multiple_of(cols),
            "bad activation shape"
        );
        self.rows = x.len() / cols;
        self.blocks_per_row = cols / BLOCK;
        self.layout = Layout::Blocks32;
        self.blocks
            .resize(self.rows * self.blocks_per_row, BlockQ8::default());
        for (chunk, blk) in x.chunks_exact(BLOCK).zip(self.blocks.iter_mut()) {
            quantize_block(chunk, blk);
        }
    }

    /// Quantizes `x` (`rows × cols`, row-major) into 256-element blocks.
    ///
    /// # Panics
    /// If `cols` is not a multiple of 256 or `x.len()` is not a multiple of
    /// `cols` (K-quant weights have rows of whole super-blocks).
    pub fn quantize_k(&mut self, x: &[f32], cols: usize) {
        assert!(
            cols.is_multiple_of(SUPER_BLOCK) && x.len().is_multiple_of(cols),
            "bad activation shape"
        );
        self.rows = x.len() / cols;
        self.blocks_per_row = cols / SUPER_BLOCK;
        self.layout = Layout::Blocks256;
        self.kblocks
            .resize(self.rows * self.blocks_per_row, BlockQ8K::default());
        for (chunk, blk) in x.chunks_exact(SUPER_BLOCK).zip(self.kblocks.iter_mut()) {
            quantize_super_block(chunk, blk);
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.blocks_per_row
            * match self.layout {
                Layout::Blocks32 => BLOCK,
                Layout::Blocks256 => SUPER_BLOCK,
            }
    }

    /// The 32-element blocks of row `r`.
    #[inline(always)]
    pub fn row(&self, r: usize) -> &[BlockQ8] {
        debug_assert_eq!(self.layout, Layout::Blocks32);
        &self.blocks[r * self.blocks_per_row..(r + 1) * self.blocks_per_row]
    }

    /// Rows `r0..r0 + t` of 32-element blocks, back to back: a pointer to
    /// their first block, from which the tile kernels read the t rows
    /// `blocks_per_row` blocks apart.
    ///
    /// # Panics
    /// If the rows do not exist.
    pub(crate) fn rows_ptr(&self, r0: usize, t: usize) -> *const BlockQ8 {
        debug_assert_eq!(self.layout, Layout::Blocks32);
        self.blocks[r0 * self.blocks_per_row..(r0 + t) * self.blocks_per_row].as_ptr()
    }

    /// [`QuantizedRows::rows_ptr`] for 256-element blocks.
    pub(crate) fn rows_k_ptr(&self, r0: usize, t: usize) -> *const BlockQ8K {
        debug_assert_eq!(self.layout, Layout::Blocks256);
        self.kblocks[r0 * self.blocks_per_row..(r0 + t) * self.blocks_per_row].as_ptr()
    }

    /// The 256-element blocks of row `r` (after [`QuantizedRows::quantize_k`]).
    #[inline(always)]
    pub fn row_k(&self, r: usize) -> &[BlockQ8K] {
        debug_assert_eq!(self.layout, Layout::Blocks256);
        &self.kblocks[r * self.blocks_per_row..(r + 1) * self.blocks_per_row]
    }
}

/// GGML's `quantize_row_q8_K`: the scale from the block's largest |x|,
/// values rounded to nearest with ties to even (its `nearest_int`), the
/// scale kept in f32 as `1 / iscale`. GGML divides by the signed extreme,
/// which flips every value and the scale's sign together; rounding to
/// nearest-even is symmetric, so products come out bit for bit the same.
fn quantize_super_block(x: &[f32], out: &mut BlockQ8K) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    // SAFETY: the build enables AVX2; each chunk holds one 32-value block.
    let amax = x
        .chunks_exact(BLOCK)
        .map(|c| unsafe { x86::abs_max(c) })
        .fold(0.0f32, f32::max);
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        *out = BlockQ8K::default();
        return;
    }
    let iscale = 127.0 / amax;
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    // SAFETY: the build enables AVX2; `x` holds 256 values.
    unsafe {
        x86::round_even_block(x, iscale, &mut out.qs)
    };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    round_even_block(x, iscale, &mut out.qs);
    for (j, s) in out.bsums.iter_mut().enumerate() {
        *s = out.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
    }
    for (j, s) in out.bsums32.iter_mut().enumerate() {
        *s = out.bsums[2 * j] + out.bsums[2 * j + 1];
    }
    out.d = 1.0 / iscale;
}

/// `q[i] = round_ties_even(x[i] · iscale)`; |x · iscale| ≤ 127 by construction.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2"), allow(dead_code))]
fn round_even_block(x: &[f32], iscale: f32, q: &mut [i8; SUPER_BLOCK]) {
    for (q, v) in q.iter_mut().zip(x) {
        *q = (v * iscale).round_ties_even() as i8;
    }
}

/// GGML's `quantize_row_q8_1`: scale from the block maximum, values rounded
/// to nearest, and the scale and block sum stored through f16 as GGML's
/// block format does. Keeping GGML's exact recipe keeps our logits within
/// rounding noise of llama.cpp's on the same GGUF, which users compare to.
#[inline]
fn quantize_block(x: &[f32], out: &mut BlockQ8) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    // SAFETY: the build enables AVX2; `x` holds one 32-value block.
    let amax = unsafe { x86::abs_max(x) };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    // SAFETY: the build enables AVX2; `x` holds one 32-value block.
    let qsum = unsafe { x86::round_block(x, id, &mut out.qs) };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    let qsum = round_block(x, id, &mut out.qs);
    out.d = f16::from_f32(d).to_f32();
    out.qsum = qsum;
    out.s = f16::from_f32(d * qsum as f32).to_f32();
}

/// `q[i] = round(x[i] · id)`, half away from zero; returns Σ q.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2"), allow(dead_code))]
fn round_block(x: &[f32], id: f32, q: &mut [i8; BLOCK]) -> i32 {
    let mut qsum = 0i32;
    for (q, v) in q.iter_mut().zip(x) {
        // |v · id| <= 127 by construction.
        let r = (v * id).round() as i32;
        *q = r as i8;
        qsum += r;
    }
    qsum
}

/// The same rounding, 8 values per instruction: activations are quantized
/// before every matmul, on the calling thread, so this loop is serial time.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod x86 {
    use std::arch::x86_64::*;

    use crate::format::{BLOCK, SUPER_BLOCK};

    /// max |x[i]| of one block (order does not matter for a maximum).
    ///
    /// # Safety
    /// The CPU must support AVX2, which the build guarantees: this module is
    /// compiled only with `target_feature = "avx2"`. `x` must hold one
    /// 32-value block; the length is asserted before any load.
    pub(super) unsafe fn abs_max(x: &[f32]) -> f32 {
        assert_eq!(x.len(), BLOCK);
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            let mut m = _mm256_setzero_ps();
            for i in 0..4 {
                m = _mm256_max_ps(
                    m,
                    _mm256_andnot_ps(sign, _mm256_loadu_ps(x.as_ptr().add(8 * i))),
                );
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
        }
    }

    /// Bit-identical to `super::round_even_block`: `vroundps` to nearest
    /// rounds ties to even, as `round_ties_even` does.
    ///
    /// # Safety
    /// The CPU must support AVX2, which the build guarantees: this module is
    /// compiled only with `target_feature = "avx2"`. `x` must hold one
    /// 256-value super-block; the length is asserted before any load.
    pub(super) unsafe fn round_even_block(x: &[f32], iscale: f32, q: &mut [i8; SUPER_BLOCK]) {
        assert_eq!(x.len(), SUPER_BLOCK);
        unsafe {
            let s = _mm256_set1_ps(iscale);
            let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for c in 0..SUPER_BLOCK / 32 {
                let r: [__m256i; 4] = std::array::from_fn(|i| {
                    let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(32 * c + 8 * i)), s);
                    _mm256_cvtps_epi32(_mm256_round_ps(
                        v,
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
                    ))
                });
                let b = _mm256_packs_epi16(
                    _mm256_packs_epi32(r[0], r[1]),
                    _mm256_packs_epi32(r[2], r[3]),
                );
                let b = _mm256_permutevar8x32_epi32(b, perm);
                _mm256_storeu_si256(q.as_mut_ptr().add(32 * c) as *mut __m256i, b);
            }
        }
    }

    /// Bit-identical to `super::round_block`: `round` is emulated exactly
    /// (truncate, then step away from zero when the dropped part is ≥ ½;
    /// `x − trunc(x)` is exact in f32), not the ties-to-even of `vroundps`.
    ///
    /// # Safety
    /// The CPU must support AVX2, which the build guarantees: this module is
    /// compiled only with `target_feature = "avx2"`. `x` must hold one
    /// 32-value block; the length is asserted before any load.
    pub(super) unsafe fn round_block(x: &[f32], id: f32, q: &mut [i8; BLOCK]) -> i32 {
        assert_eq!(x.len(), BLOCK);
        unsafe {
            let idv = _mm256_set1_ps(id);
            let half = _mm256_set1_ps(0.5);
            let sign = _mm256_set1_ps(-0.0);
            let one = _mm256_set1_ps(1.0);
            let mut r = [_mm256_setzero_si256(); 4];
            for (i, r) in r.iter_mut().enumerate() {
                let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * i)), idv);
                let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
                let away = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), one);
                let step = _mm256_or_ps(away, _mm256_and_ps(v, sign));
                *r = _mm256_cvttps_epi32(_mm256_add_ps(t, step));
            }
            let sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
            // Packing works per 128-bit lane; the permute restores order.
            let w01 = _mm256_packs_epi32(r[0], r[1]);
            let w23 = _mm256_packs_epi32(r[2], r[3]);
            let b = _mm256_packs_epi16(w01, w23);
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, b);
            let s = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256(sum, 1),
            );
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            _mm_cvtsi128_si32(s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13)
            .collect();
        let mut q = QuantizedRows::default();
        q.quantize(&x, 64);
        for (b, chunk) in q.row(0).iter().zip(x.chunks(32)) {
            for (qi, v) in b.qs.iter().zip(chunk) {
                // d is stored through f16 (relative error 2^-11).
                assert!((b.d * *qi as f32 - v).abs() <= b.d * 0.5 + b.d * 127.0 / 1024.0 + 1e-6);
            }
        }
    }

    #[test]
    fn simd_rounding_matches_scalar_rounding_bit_for_bit() {
        // Ties (±k.5), values just below and above them, signs, zeros.
        let mut vals: Vec<f32> = Vec::new();
        for k in -127..=127 {
            let h = k as f32 + 0.5;
            vals.extend([
                h,
                f32::from_bits(h.to_bits() - 1),
                f32::from_bits(h.to_bits() + 1),
            ]);
            vals.push(k as f32);
        }
        vals.extend([0.0, -0.0, 1e-30, -1e-30, 0.49999997, -0.49999997]);
        vals.retain(|v| v.abs() < 127.5);
        while !vals.len().is_multiple_of(BLOCK) {
            vals.push(0.25);
        }
        for chunk in vals.chunks(BLOCK) {
            let (mut a, mut b) = ([0i8; BLOCK], [0i8; BLOCK]);
            let sa = round_block(chunk, 1.0, &mut a);
            #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
            let sb = unsafe { x86::round_block(chunk, 1.0, &mut b) };
            #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
            let sb = round_block(chunk, 1.0, &mut b);
            assert_eq!((a, sa), (b, sb), "{chunk:?}");
        }
        // And through real scales.
        let x: Vec<f32> = (0..4096)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.0173)
            .collect();
        for chunk in x.chunks(BLOCK) {
            let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let id = 127.0 / amax;
            let (mut a, mut b) = ([0i8; BLOCK], [0i8; BLOCK]);
            let sa = round_block(chunk, id, &mut a);
            #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
            let sb = unsafe { x86::round_block(chunk, id, &mut b) };
            #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
            let sb = round_block(chunk, id, &mut b);
            assert_eq!((a, sa), (b, sb));
        }
    }

    #[test]
    fn super_blocks_round_ties_to_even_like_ggml() {
        // GGML: iscale = -127/max (max the signed extreme), q = nearest_int,
        // d = 1/iscale. Ours has both signs flipped when max > 0.
        let mut x: Vec<f32> = (0..512)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.0173)
            .collect();
        x[3] = 12.7; // the extreme: iscale = 10, so x = 0.05 · k lands on ties
        for (i, v) in x.iter_mut().enumerate().skip(256).step_by(3) {
            *v = (i % 40) as f32 * 0.05 - 1.0;
        }
        x[300] = -12.7;
        let mut q = QuantizedRows::default();
        q.quantize_k(&x, 512);
        for (b, chunk) in q.row_k(0).iter().zip(x.chunks(256)) {
            let max = chunk
                .iter()
                .fold(0.0f32, |m, v| if v.abs() > m.abs() { *v } else { m });
            let iscale = -127.0f32 / max;
            for (qi, v) in b.qs.iter().zip(chunk) {
                let want = (iscale * v).round_ties_even() as i32;
                assert_eq!(*qi as i32 * max.signum() as i32, -want);
            }
            assert_eq!(b.d, (1.0 / iscale).abs());
            for j in 0..16 {
                let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
                assert_eq!(b.bsums[j] as i32, s);
            }
            for j in 0..8 {
                assert_eq!(b.bsums32[j], b.bsums[2 * j] + b.bsums[2 * j + 1]);
            }
        }
        let mut zero = QuantizedRows::default();
        zero.quantize_k(&[0.0; 256], 256);
        assert_eq!(zero.row_k(0)[0].d, 0.0);
        assert!(zero.row_k(0)[0].qs.iter().all(|&v| v == 0));
    }

    #[test]
    fn simd_super_block_rounding_matches_scalar() {
        let x: Vec<f32> = (0..256)
            .map(|i| (i as f32 - 128.0) * 0.5 + if i % 7 == 0 { 0.25 } else { 0.0 })
            .collect();
        let mut a = [0i8; SUPER_BLOCK];
        round_even_block(&x, 1.0, &mut a);
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
        {
            let mut b = [0i8; SUPER_BLOCK];
            unsafe { x86::round_even_block(&x, 1.0, &mut b) };
            assert_eq!(a, b);
        }
        assert_eq!(a[1], -64); // -127.5 · … : (1 − 128) · 0.5 = −63.5 → −64 (even)
        assert_eq!(a[3], -62); // −62.5 → −62
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let mut q = QuantizedRows::default();
        q.quantize(&[0.0; 32], 32);
        assert_eq!(q.row(0)[0].d, 0.0);
        assert!(q.row(0)[0].qs.iter().all(|&v| v == 0));
    }
}
