//! AVX-512 VNNI kernels over two adjacent 8-row packed groups of the
//! 32-input formats (Q4_0, Q4_1, Q5_0, Q8_0; layouts in `packed::blocks32`): 16
//! output rows per 512-bit register and up to 8 activation rows per call.
//! The K-quants' are in `packed_kquant_512`, the shared helpers (loads,
//! prefetch, stores) and the 256-bit kernels in `packed_x86`.

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::act::{BlockQ8, QuantizedRows};
use crate::format::QFormat;
use crate::isa::Isa;
use crate::packed::blocks32::{Q5_0_BITS, Q5_0_NIBBLES};
use crate::packed::group_block_bytes;
use crate::packed::x86::{
    GroupOut, PairFn, entry, halves_pair, load_pair, pair_blocks_ahead, prefetch_block, store_pair,
};

/// Four activation bytes starting at `at`, broadcast to every 32-bit lane
/// of a 512-bit register.
///
/// # Safety
/// `at + 4 <= 32` (the bytes lie inside `a.qs`), and the CPU must support
/// AVX-512F.
#[inline(always)]
unsafe fn bcast4_512(a: &BlockQ8, at: usize) -> __m512i {
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(a.qs.as_ptr().add(at) as *const i32)) }
}

/// Two adjacent 8-row groups of packed Q4_1 rows · `T` activation rows
/// in 512-bit registers (see [`PairFn`]).
///
/// # Safety
/// `data` must be a packed Q4_1 matrix of `nb` blocks per row with at
/// least `g + 2` groups, rows `r0..r0 + T` must exist in `acts` with `nb`
/// blocks each, and the CPU must support AVX-512 VNNI, BW and VL (callers
/// are the `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q4_1_pair<const T: usize>(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut [GroupOut; 2],
) {
    const GBB: usize = group_block_bytes(QFormat::Q4_1);
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let base0 = data.as_ptr().add(g * nb * GBB);
        let base1 = base0.add(nb * GBB);
        let m4 = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); T];
        let mut macc = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            let (p0, p1) = (base0.add(b * GBB), base1.add(b * GBB));
            prefetch_block::<GBB>(p0, pair_blocks_ahead::<GBB>(b, nb));
            prefetch_block::<GBB>(p1, pair_blocks_ahead::<GBB>(b, nb));
            let dv = halves_pair(p0, p1);
            let mv = halves_pair(p0.add(16), p1.add(16));
            let mut isum = [_mm512_setzero_si512(); T];
            for c in 0..4 {
                let w = load_pair(p0.add(32 + 32 * c), p1.add(32 + 32 * c));
                let lo = _mm512_and_si512(w, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    isum[t] = _mm512_dpbusd_epi32(isum[t], lo, bcast4_512(a, 4 * c));
                    isum[t] = _mm512_dpbusd_epi32(isum[t], hi, bcast4_512(a, 16 + 4 * c));
                }
            }
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let scale = _mm512_mul_ps(dv, _mm512_set1_ps(a.d));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), scale, acc[t]);
                macc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.s), macc[t]);
            }
        }
        for t in 0..T {
            store_pair(_mm512_add_ps(acc[t], macc[t]), out, t);
        }
    }
}

/// Two adjacent 8-row groups of packed Q8_0 rows · `T` activation rows
/// in 512-bit registers (see [`PairFn`]).
///
/// # Safety
/// `data` must be a packed Q8_0 matrix of `nb` blocks per row with at
/// least `g + 2` groups, rows `r0..r0 + T` must exist in `acts` with `nb`
/// blocks each, and the CPU must support AVX-512 VNNI, BW and VL (callers
/// are the `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q8_0_pair<const T: usize>(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut [GroupOut; 2],
) {
    const GBB: usize = group_block_bytes(QFormat::Q8_0);
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let base0 = data.as_ptr().add(g * nb * GBB);
        let base1 = base0.add(nb * GBB);
        let mut acc = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            let (p0, p1) = (base0.add(b * GBB), base1.add(b * GBB));
            prefetch_block::<GBB>(p0, pair_blocks_ahead::<GBB>(b, nb));
            prefetch_block::<GBB>(p1, pair_blocks_ahead::<GBB>(b, nb));
            let dv = halves_pair(p0, p1);
            let mut isum = [_mm512_setzero_si512(); T];
            for c in 0..8 {
                let w = load_pair(p0.add(16 + 32 * c), p1.add(16 + 32 * c));
                let wabs = _mm512_abs_epi8(w);
                // Negative weights flip the activation's sign (vpsignb has no
                // 512-bit form): subtract from zero under the sign mask.
                let neg = _mm512_movepi8_mask(w);
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    let av = bcast4_512(a, 4 * c);
                    let s = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
                    isum[t] = _mm512_dpbusd_epi32(isum[t], wabs, s);
                }
            }
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let scale = _mm512_mul_ps(dv, _mm512_set1_ps(a.d));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), scale, acc[t]);
            }
        }
        for t in 0..T {
            store_pair(acc[t], out, t);
        }
    }
}

/// Q5_0's fifth bits of chunk c, half s (bit `bit` = 2c + s of each byte
/// of the plane), moved to bit 4: `packed_kquant_x86`'s `q5_fifth` on
/// 512-bit registers (16-bit shifts keep each byte's bits in the byte the
/// mask reads).
///
/// # Safety
/// The CPU must support AVX-512 BW (callers are the entry points below).
#[inline(always)]
unsafe fn q5_fifth_512(h: __m512i, bit: usize) -> __m512i {
    unsafe {
        let m = _mm512_set1_epi8(0x10);
        match bit {
            0 => _mm512_and_si512(_mm512_slli_epi16(h, 4), m),
            1 => _mm512_and_si512(_mm512_slli_epi16(h, 3), m),
            2 => _mm512_and_si512(_mm512_slli_epi16(h, 2), m),
            3 => _mm512_and_si512(_mm512_slli_epi16(h, 1), m),
            4 => _mm512_and_si512(h, m),
            5 => _mm512_and_si512(_mm512_srli_epi16(h, 1), m),
            6 => _mm512_and_si512(_mm512_srli_epi16(h, 2), m),
            _ => _mm512_and_si512(_mm512_srli_epi16(h, 3), m),
        }
    }
}

/// Two adjacent 8-row groups of packed Q4_0 (`Q5` false) or Q5_0 (`Q5`
/// true) rows · `T` activation rows in 512-bit registers (see
/// [`PairFn`]). Per lane the steps of the AVX2 kernels
/// (`packed_kquant_x86::q4_0_group` and `q5_0_group`): the same exact
/// integer sum (`vpdpbusd` in place of `vpmaddubsw` + `vpmaddwd`, neither
/// of which saturates here), the −8 or −16 offset through the activation
/// sum, one fused multiply-add; so results are bit-identical on every ISA.
///
/// # Safety
/// `data` must be a packed Q4_0 or Q5_0 matrix (as `Q5` says) of `nb`
/// blocks per row with at least `g + 2` groups, rows `r0..r0 + T` must
/// exist in `acts` with `nb` blocks each, and the CPU must support
/// AVX-512 VNNI, BW and VL (callers are the `#[target_feature]` entry
/// points below).
#[inline(always)]
unsafe fn offset_pair<const Q5: bool, const T: usize>(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut [GroupOut; 2],
) {
    let (gbb, nibbles, offset) = if Q5 {
        (group_block_bytes(QFormat::Q5_0), Q5_0_NIBBLES, 16)
    } else {
        (group_block_bytes(QFormat::Q4_0), 16, 8)
    };
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let base0 = data.as_ptr().add(g * nb * gbb);
        let base1 = base0.add(nb * gbb);
        let m4 = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            let (p0, p1) = (base0.add(b * gbb), base1.add(b * gbb));
            if Q5 {
                const GBB: usize = group_block_bytes(QFormat::Q5_0);
                prefetch_block::<GBB>(p0, pair_blocks_ahead::<GBB>(b, nb));
                prefetch_block::<GBB>(p1, pair_blocks_ahead::<GBB>(b, nb));
            } else {
                const GBB: usize = group_block_bytes(QFormat::Q4_0);
                prefetch_block::<GBB>(p0, pair_blocks_ahead::<GBB>(b, nb));
                prefetch_block::<GBB>(p1, pair_blocks_ahead::<GBB>(b, nb));
            }
            let h = if Q5 {
                load_pair(p0.add(Q5_0_BITS), p1.add(Q5_0_BITS))
            } else {
                _mm512_setzero_si512()
            };
            let mut isum = [_mm512_setzero_si512(); T];
            for c in 0..4 {
                let w = load_pair(p0.add(nibbles + 32 * c), p1.add(nibbles + 32 * c));
                let mut lo = _mm512_and_si512(w, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                if Q5 {
                    lo = _mm512_or_si512(lo, q5_fifth_512(h, 2 * c));
                    hi = _mm512_or_si512(hi, q5_fifth_512(h, 2 * c + 1));
                }
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    isum[t] = _mm512_dpbusd_epi32(isum[t], lo, bcast4_512(a, 4 * c));
                    isum[t] = _mm512_dpbusd_epi32(isum[t], hi, bcast4_512(a, 16 + 4 * c));
                }
            }
            let dv = halves_pair(p0, p1);
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let v = _mm512_sub_epi32(isum[t], _mm512_set1_epi32(offset * a.qsum));
                let scale = _mm512_mul_ps(dv, _mm512_set1_ps(a.d));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), scale, acc[t]);
            }
        }
        for t in 0..T {
            store_pair(acc[t], out, t);
        }
    }
}

entry!(pair q4_1_pair [], q4_1_pair_512);
entry!(pair q8_0_pair [], q8_0_pair_512);
entry!(pair offset_pair [false], q4_0_pair_512);
entry!(pair offset_pair [true], q5_0_pair_512);

/// The two-group kernel for Q4_0, Q4_1, Q5_0 or Q8_0, on AVX-512 VNNI only.
pub(crate) fn pair_fn(isa: Isa, fmt: QFormat) -> Option<PairFn> {
    match (isa, fmt) {
        (Isa::Avx512Vnni | Isa::AmxInt8, QFormat::Q4_1) => Some(q4_1_pair_512),
        (Isa::Avx512Vnni | Isa::AmxInt8, QFormat::Q8_0) => Some(q8_0_pair_512),
        (Isa::Avx512Vnni | Isa::AmxInt8, QFormat::Q4_0) => Some(q4_0_pair_512),
        (Isa::Avx512Vnni | Isa::AmxInt8, QFormat::Q5_0) => Some(q5_0_pair_512),
        _ => None,
    }
}
