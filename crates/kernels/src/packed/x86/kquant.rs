//! AVX2 kernels over 8-row packed groups of the K-quants, Q5_0 and Q4_0
//! (layouts in `packed::kquant` and `packed::blocks32`).
//!
//! These formats keep 4-bit, 5-bit or 6-bit unsigned values, so
//! `vpmaddubsw` products of a chunk fit i16 with room to add several chunks
//! before one `vpmaddwd` widens them, and that `vpmaddwd` multiplies by the
//! sub-block scale at the same time (llama.cpp's trick). Bounds, per i16
//! lane (two products of |a| ≤ 127): Q4_K 3 810, summed over 8 chunks; Q6_K
//! 16 002, over 2; Q5_0 7 874, over 4; Q4_0 3 810, over 8 (30 480); all
//! below 32 767.
//!
//! The same AVX2 kernels run on every x86 ISA (`vpmaddubsw` exists on all of
//! them): integer sums are exact and the float steps are those of the
//! portable kernels in `packed`, so a row's result is bit-identical on every
//! ISA and for every tile size. VNNI (`vpdpbusd`) variants would save the
//! widening step, but this code was developed on an AVX2-only machine where
//! they could be neither tested nor measured, so they are not written.

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::act::{BlockQ8, BlockQ8K, QuantizedRows};
use crate::format::QFormat;
use crate::packed::blocks32::{Q4_0_GBB, Q4_0_NIBBLES, Q5_0_BITS, Q5_0_GBB, Q5_0_NIBBLES};
use crate::packed::kquant::{
    Q4_K_DMIN, Q4_K_GBB, Q4_K_MIN, Q4_K_NIB, Q4_K_SC, Q6_K_GBB, Q6_K_GROUP, Q6_K_SC, Q6_K_VALUES,
};
use crate::packed::x86::{
    GroupFn, GroupOut, PREFETCH_AHEAD, blocks_ahead, entry, prefetch_block, prefetch_slice,
};

/// Four activation bytes starting at `at`, broadcast to every 32-bit lane.
///
/// # Safety
/// `at + 4 <= qs.len()` (debug-asserted), and the CPU must support AVX
/// (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn bcast4(qs: &[i8], at: usize) -> __m256i {
    debug_assert!(at + 4 <= qs.len());
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(qs.as_ptr().add(at) as *const i32)) }
}

/// Two adjacent i16 activation sums, broadcast as one 32-bit lane.
///
/// # Safety
/// `at + 2 <= sums.len()` (debug-asserted), and the CPU must support AVX
/// (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn bcast_pair(sums: &[i16], at: usize) -> __m256i {
    debug_assert!(at + 2 <= sums.len());
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(sums.as_ptr().add(at) as *const i32)) }
}

/// 32 bytes at `p`.
///
/// # Safety
/// `p` must point to 32 readable bytes, and the CPU must support AVX
/// (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// 8 scale bytes (one per row), each duplicated into both i16 halves of
/// its row's 32-bit lane: the `vpmaddwd` operand that scales a row's pair
/// of i16 sums.
///
/// # Safety
/// `p` must point to 8 readable bytes, and the CPU must support AVX2
/// (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn row_scales_u8(p: *const u8) -> __m256i {
    unsafe {
        let b = _mm_loadl_epi64(p as *const __m128i);
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b))
    }
}

/// [`row_scales_u8`] for signed scales (Q6_K).
///
/// # Safety
/// `p` must point to 8 readable bytes, and the CPU must support AVX2
/// (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn row_scales_i8(p: *const u8) -> __m256i {
    unsafe {
        let b = _mm_loadl_epi64(p as *const __m128i);
        _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b, b))
    }
}

/// Writes the T results.
///
/// # Safety
/// The CPU must support AVX (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn store<const T: usize>(acc: &[__m256; T], out: &mut GroupOut) {
    for t in 0..T {
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}

/// One 8-row group of packed Q4_K rows · `T` activation rows (see
/// [`GroupFn`]).
///
/// # Safety
/// `data` must be a packed Q4_K matrix of `nsb` super-blocks per row with at
/// least `g + 1` groups, rows `r0..r0 + T` must exist in `acts` as
/// 256-element blocks (`quantize_k`), `nsb` each,
/// and the CPU must support AVX2, FMA and F16C (callers are the
/// `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q4_k_group<const T: usize>(
    data: &[u8],
    nsb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut GroupOut,
) {
    unsafe {
        let rows: [&[BlockQ8K]; T] = std::array::from_fn(|t| acts.row_k(r0 + t));
        let base = data.as_ptr().add(g * nsb * Q4_K_GBB);
        let m4 = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nsb {
            let gb = base.add(b * Q4_K_GBB);
            let mut isum = [_mm256_setzero_si256(); T];
            for s in 0..8 {
                // A thread's groups are contiguous: past this group's end
                // the requests are for its next group, the next call's when
                // all rows fit one call (k ≤ 4).
                prefetch_slice::<Q4_K_GBB>(gb, PREFETCH_AHEAD, s);
                let sc = row_scales_u8(gb.add(Q4_K_SC + 8 * s));
                let mut s16 = [_mm256_setzero_si256(); T];
                for c in 0..4 {
                    let w = load(gb.add(Q4_K_NIB + (4 * s + c) * 32));
                    let lo = _mm256_and_si256(w, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                    for t in 0..T {
                        let qs = &rows[t].get_unchecked(b).qs;
                        let p = _mm256_maddubs_epi16(lo, bcast4(qs, 32 * s + 4 * c));
                        let q = _mm256_maddubs_epi16(hi, bcast4(qs, 32 * s + 16 + 4 * c));
                        s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(p, q));
                    }
                }
                for t in 0..T {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], sc));
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
            let dminv = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(Q4_K_DMIN) as *const __m128i));
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let mut msum = _mm256_setzero_si256();
                for p in 0..4 {
                    let m = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                        gb.add(Q4_K_MIN + 16 * p) as *const __m128i
                    ));
                    msum =
                        _mm256_add_epi32(msum, _mm256_madd_epi16(m, bcast_pair(&a.bsums32, 2 * p)));
                }
                let da = _mm256_set1_ps(a.d);
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dv, da), acc[t]);
                acc[t] =
                    _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dminv, da), acc[t]);
            }
        }
        store(&acc, out);
    }
}

/// Q6_K's top two bits of chunk c moved to bits 4..6 of each byte.
///
/// # Safety
/// The CPU must support AVX2 (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn q6_high(h: __m256i, c: usize) -> __m256i {
    unsafe {
        let m = _mm256_set1_epi8(0x30);
        match c {
            0 => _mm256_and_si256(_mm256_slli_epi16(h, 4), m),
            1 => _mm256_and_si256(_mm256_slli_epi16(h, 2), m),
            2 => _mm256_and_si256(h, m),
            _ => _mm256_and_si256(_mm256_srli_epi16(h, 2), m),
        }
    }
}

/// One 8-row group of packed Q6_K rows · `T` activation rows (see
/// [`GroupFn`]).
///
/// # Safety
/// `data` must be a packed Q6_K matrix of `nsb` super-blocks per row with at
/// least `g + 1` groups, rows `r0..r0 + T` must exist in `acts` as
/// 256-element blocks (`quantize_k`), `nsb` each,
/// and the CPU must support AVX2, FMA and F16C (callers are the
/// `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q6_k_group<const T: usize>(
    data: &[u8],
    nsb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut GroupOut,
) {
    unsafe {
        let rows: [&[BlockQ8K]; T] = std::array::from_fn(|t| acts.row_k(r0 + t));
        let base = data.as_ptr().add(g * nsb * Q6_K_GBB);
        let m4 = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nsb {
            let gb = base.add(b * Q6_K_GBB);
            let mut isum = [_mm256_setzero_si256(); T];
            for q in 0..8 {
                prefetch_slice::<Q6_K_GBB>(gb, PREFETCH_AHEAD, q);
                let rec = gb.add(Q6_K_VALUES + q * Q6_K_GROUP);
                // Low nibbles are sub-block 2q, high nibbles 2q + 1: one
                // side at a time keeps T sums live, not 2T.
                for side in 0..2 {
                    let h = load(rec.add(128 + 32 * side));
                    let sc = row_scales_i8(gb.add(Q6_K_SC + 8 * (2 * q + side)));
                    for half in 0..2 {
                        let mut s16 = [_mm256_setzero_si256(); T];
                        for c in 2 * half..2 * half + 2 {
                            let w = load(rec.add(32 * c));
                            let w = if side == 0 {
                                w
                            } else {
                                _mm256_srli_epi16(w, 4)
                            };
                            let v = _mm256_or_si256(_mm256_and_si256(w, m4), q6_high(h, c));
                            for t in 0..T {
                                let qs = &rows[t].get_unchecked(b).qs;
                                let a = bcast4(qs, 32 * q + 16 * side + 4 * c);
                                s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(v, a));
                            }
                        }
                        for t in 0..T {
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], sc));
                        }
                    }
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                // The −32 offset of every value: −32 · Σ_s sc_s · Σ a over s.
                let mut corr = _mm256_setzero_si256();
                for p in 0..8 {
                    let pair = _mm_unpacklo_epi8(
                        _mm_loadl_epi64(gb.add(Q6_K_SC + 8 * (2 * p)) as *const __m128i),
                        _mm_loadl_epi64(gb.add(Q6_K_SC + 8 * (2 * p + 1)) as *const __m128i),
                    );
                    corr = _mm256_add_epi32(
                        corr,
                        _mm256_madd_epi16(_mm256_cvtepi8_epi16(pair), bcast_pair(&a.bsums, 2 * p)),
                    );
                }
                let v = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(corr, 5));
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(a.d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), scale, acc[t]);
            }
        }
        store(&acc, out);
    }
}

/// Q5_0's fifth bits of chunk c, half s (bit 2c + s of each byte of the
/// plane), moved to bit 4.
///
/// # Safety
/// The CPU must support AVX2 (callers are the `#[target_feature(enable = "avx2,fma,f16c")]` entry
/// points below, into which this inlines).
#[inline(always)]
unsafe fn q5_fifth(h: __m256i, bit: usize) -> __m256i {
    unsafe {
        let m = _mm256_set1_epi8(0x10);
        match bit {
            0 => _mm256_and_si256(_mm256_slli_epi16(h, 4), m),
            1 => _mm256_and_si256(_mm256_slli_epi16(h, 3), m),
            2 => _mm256_and_si256(_mm256_slli_epi16(h, 2), m),
            3 => _mm256_and_si256(_mm256_slli_epi16(h, 1), m),
            4 => _mm256_and_si256(h, m),
            5 => _mm256_and_si256(_mm256_srli_epi16(h, 1), m),
            6 => _mm256_and_si256(_mm256_srli_epi16(h, 2), m),
            _ => _mm256_and_si256(_mm256_srli_epi16(h, 3), m),
        }
    }
}

/// One 8-row group of packed Q5_0 rows · `T` activation rows (see
/// [`GroupFn`]).
///
/// # Safety
/// `data` must be a packed Q5_0 matrix of `nb` blocks per row with at
/// least `g + 1` groups, rows `r0..r0 + T` must exist in `acts` as
/// 32-element blocks, `nb` each,
/// and the CPU must support AVX2, FMA and F16C (callers are the
/// `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q5_0_group<const T: usize>(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut GroupOut,
) {
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let base = data.as_ptr().add(g * nb * Q5_0_GBB);
        let m4 = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let gb = base.add(b * Q5_0_GBB);
            // Past the group's end this runs into the next call's group.
            prefetch_block::<Q5_0_GBB>(gb, blocks_ahead(Q5_0_GBB));
            let h = load(gb.add(Q5_0_BITS));
            let mut isum = [_mm256_setzero_si256(); T];
            for half in 0..2 {
                let mut s16 = [_mm256_setzero_si256(); T];
                for c in 2 * half..2 * half + 2 {
                    let w = load(gb.add(Q5_0_NIBBLES + 32 * c));
                    let lo = _mm256_or_si256(_mm256_and_si256(w, m4), q5_fifth(h, 2 * c));
                    let hi = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(w, 4), m4),
                        q5_fifth(h, 2 * c + 1),
                    );
                    for t in 0..T {
                        let qs = &rows[t].get_unchecked(b).qs;
                        let p = _mm256_maddubs_epi16(lo, bcast4(qs, 4 * c));
                        let q = _mm256_maddubs_epi16(hi, bcast4(qs, 16 + 4 * c));
                        s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(p, q));
                    }
                }
                for t in 0..T {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], ones));
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let v = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(16 * a.qsum));
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(a.d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), scale, acc[t]);
            }
        }
        store(&acc, out);
    }
}

/// One 8-row group of packed Q4_0 rows · `T` activation rows (see
/// [`GroupFn`]): Q5_0's kernel without the fifth bits, the −8 offset
/// through the activation sum.
///
/// Why Q4_0 is packed too: row by row (the `dot` kernels it had before) a
/// one-token step read its weights at 9.6 GB/s from DRAM (`kb`, 500000 ×
/// 1536, AVX-512 VNNI, 2 threads), 16 with prefetch; docs/performance.md
/// has this kernel's numbers.
///
/// # Safety
/// `data` must be a packed Q4_0 matrix of `nb` blocks per row with at
/// least `g + 1` groups, rows `r0..r0 + T` must exist in `acts` as
/// 32-element blocks, `nb` each, and the CPU must support AVX2, FMA and
/// F16C (callers are the `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q4_0_group<const T: usize>(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut GroupOut,
) {
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let base = data.as_ptr().add(g * nb * Q4_0_GBB);
        let m4 = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let gb = base.add(b * Q4_0_GBB);
            // Past the group's end this runs into the next call's group.
            prefetch_block::<Q4_0_GBB>(gb, blocks_ahead(Q4_0_GBB));
            let mut s16 = [_mm256_setzero_si256(); T];
            for c in 0..4 {
                let w = load(gb.add(Q4_0_NIBBLES + 32 * c));
                let lo = _mm256_and_si256(w, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                for t in 0..T {
                    let qs = &rows[t].get_unchecked(b).qs;
                    let p = _mm256_maddubs_epi16(lo, bcast4(qs, 4 * c));
                    let q = _mm256_maddubs_epi16(hi, bcast4(qs, 16 + 4 * c));
                    s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(p, q));
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let isum = _mm256_madd_epi16(s16[t], ones);
                let v = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * a.qsum));
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(a.d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), scale, acc[t]);
            }
        }
        store(&acc, out);
    }
}

entry!(group q4_k_group [], q4_k, "avx2,fma,f16c");
entry!(group q6_k_group [], q6_k, "avx2,fma,f16c");
entry!(group q5_0_group [], q5_0, "avx2,fma,f16c");
entry!(group q4_0_group [], q4_0, "avx2,fma,f16c");

/// The AVX2 kernel for a K-quant, Q5_0 or Q4_0 (`nb` is then the number of
/// 256-element super-blocks, or of 32-element blocks, per row).
pub(crate) fn group_fn(fmt: QFormat) -> Option<GroupFn> {
    match fmt {
        QFormat::Q4_K => Some(q4_k),
        QFormat::Q6_K => Some(q6_k),
        QFormat::Q5_0 => Some(q5_0),
        QFormat::Q4_0 => Some(q4_0),
        _ => None,
    }
}
