//! AVX-512 VNNI kernels over two adjacent 8-row packed groups of the
//! K-quants (layouts in `packed::kquant`): 16 output rows per 512-bit
//! register and up to 8 activation rows per call.
//!
//! Why a second set beside the AVX2 kernels of `packed_kquant_x86`: on a
//! Q4_K_M model (Qwen2.5-Coder-1.5B) Q4_K and Q6_K carry every matrix, and
//! the AVX2 kernels take at most 4 activation rows, so an 8-token verify
//! unpacked every weight twice and spent three instructions
//! (`vpmaddubsw`, `vpaddw`, and a share of `vpmaddwd`) where `vpdpbusd` needs
//! one. `specmesh bench-model --model qwen2.5-coder-1.5b --ks 1,2,4,8,16`
//! measures the difference (docs/performance.md).
//!
//! Results are bit-identical to the AVX2 and portable kernels: each lane
//! computes the same integer sums (`vpdpbusd` adds exact u8 · i8 products
//! into i32, and a sub-block's sum times its scale is the very integer the
//! AVX2 kernel's `vpmaddwd` yields), then the same float steps in the same
//! order. Without the i16 intermediate there is no overflow bound to keep.

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::act::{BlockQ8K, QuantizedRows};
use crate::format::QFormat;
use crate::isa::Isa;
use crate::packed::kquant::{
    Q4_K_DMIN, Q4_K_GBB, Q4_K_MIN, Q4_K_NIB, Q4_K_SC, Q6_K_GBB, Q6_K_GROUP, Q6_K_SC, Q6_K_VALUES,
};
use crate::packed::x86::{
    GroupOut, PREFETCH_AHEAD, PairFn, entry, halves_pair, load_pair, prefetch_slice, store_pair,
};

// With one or two activation rows each row's products go to four
// independent partial sums ([`CHAINS`]); before that, one row left each
// `vpdpbusd` waiting on the last and the AVX2 kernels were faster below 5
// rows. Measured on the 1.5B (`bench-model --model qwen2.5-coder-1.5b
// --contexts 512 --ks 1,2,4,8,16`, Intel Xeon, 2 threads, two runs each,
// interleaved): k=1 61.2 / 64.2 ms before, 53.8 / 51.9 ms after; k=2 71.2 /
// 72.4 before, 58.3 / 56.6 after; k=4 87.9 / 85.7 before, 62.7 / 75.4
// after; greedy decode 15.2 / 14.9 tok/s before, 21.4 / 20.0 after. Which
// row counts take these kernels on a given CPU is measured at load
// (`crate::width_plan`).

/// Four activation bytes starting at `at`, broadcast to every 32-bit lane.
///
/// # Safety
/// `at + 4 <= qs.len()` (debug-asserted), and the CPU must support
/// AVX-512F (callers are the entry points below, into which this inlines).
#[inline(always)]
unsafe fn bcast4(qs: &[i8], at: usize) -> __m512i {
    debug_assert!(at + 4 <= qs.len());
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(qs.as_ptr().add(at) as *const i32)) }
}

/// Two adjacent i16 activation sums, broadcast as one 32-bit lane.
///
/// # Safety
/// `at + 2 <= sums.len()` (debug-asserted), and the CPU must support
/// AVX-512F (callers are the entry points below).
#[inline(always)]
unsafe fn bcast_pair(sums: &[i16], at: usize) -> __m512i {
    debug_assert!(at + 2 <= sums.len());
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(sums.as_ptr().add(at) as *const i32)) }
}

/// 8 unsigned scale bytes of each group (at `a` and `b`), one i32 lane per
/// row: lanes 0–7 from `a`, 8–15 from `b`.
///
/// # Safety
/// `a` and `b` must each point to 8 readable bytes; AVX-512F.
#[inline(always)]
pub(crate) unsafe fn scales_u8(a: *const u8, b: *const u8) -> __m512i {
    unsafe {
        let v = _mm_unpacklo_epi64(
            _mm_loadl_epi64(a as *const __m128i),
            _mm_loadl_epi64(b as *const __m128i),
        );
        _mm512_cvtepu8_epi32(v)
    }
}

/// [`scales_u8`] for signed scales (Q6_K).
///
/// # Safety
/// As for [`scales_u8`].
#[inline(always)]
pub(crate) unsafe fn scales_i8(a: *const u8, b: *const u8) -> __m512i {
    unsafe {
        let v = _mm_unpacklo_epi64(
            _mm_loadl_epi64(a as *const __m128i),
            _mm_loadl_epi64(b as *const __m128i),
        );
        _mm512_cvtepi8_epi32(v)
    }
}

/// The offset, in group-blocks from super-block `b` of one of the pair's
/// groups, of the weights the pair kernels ask for (see
/// [`prefetch_slice`]): [`PREFETCH_AHEAD`] super-blocks on while the group
/// lasts, then the same super-block of the group two on, which is where the
/// thread's next call reads (the next pair) when all activation rows fit
/// one call (k ≤ 8); with more rows the next call is the same pair's, and
/// those requests are early by one call.
#[inline(always)]
pub(crate) fn pair_ahead(b: usize, nsb: usize) -> usize {
    if b + PREFETCH_AHEAD < nsb {
        PREFETCH_AHEAD
    } else {
        PREFETCH_AHEAD + nsb
    }
}

/// Partial integer sums kept per row and sub-block: [`SPLIT_ROWS`] rows or
/// fewer use all of them, more rows one (their own rows already interleave
/// independent `vpdpbusd`, and more registers would spill).
const CHAINS: usize = 4;
/// Rows up to which a call splits its sums over [`CHAINS`] chains.
const SPLIT_ROWS: usize = 2;

/// The two chains chunk `c`'s low and high products go to.
#[inline(always)]
fn chains<const T: usize>(c: usize) -> (usize, usize) {
    if T <= SPLIT_ROWS {
        (2 * (c & 1), 2 * (c & 1) + 1)
    } else {
        (0, 0)
    }
}

/// The sum of a row's chains (exact: i32 sums of bounded products).
///
/// # Safety
/// AVX-512F (callers are the entry points below, into which this inlines).
#[inline(always)]
unsafe fn sum_chains<const T: usize>(part: &[__m512i; CHAINS]) -> __m512i {
    unsafe {
        if T <= SPLIT_ROWS {
            _mm512_add_epi32(
                _mm512_add_epi32(part[0], part[1]),
                _mm512_add_epi32(part[2], part[3]),
            )
        } else {
            part[0]
        }
    }
}

/// Two adjacent groups of packed Q4_K rows · `T` activation rows (see
/// [`PairFn`]).
///
/// # Safety
/// `data` must be a packed Q4_K matrix of `nsb` super-blocks per row with at
/// least `g + 2` groups, rows `r0..r0 + T` must exist in `acts` as
/// 256-element blocks (`quantize_k`), `nsb` each, and the CPU must support
/// AVX-512 F, BW and VNNI (callers are the entry points below).
#[inline(always)]
unsafe fn q4_k_pair<const T: usize>(
    data: &[u8],
    nsb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut [GroupOut; 2],
) {
    unsafe {
        let rows: [&[BlockQ8K]; T] = std::array::from_fn(|t| acts.row_k(r0 + t));
        let base0 = data.as_ptr().add(g * nsb * Q4_K_GBB);
        let base1 = base0.add(nsb * Q4_K_GBB);
        let m4 = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); T];
        for b in 0..nsb {
            let (p0, p1) = (base0.add(b * Q4_K_GBB), base1.add(b * Q4_K_GBB));
            let mut isum = [_mm512_setzero_si512(); T];
            for s in 0..8 {
                prefetch_slice::<Q4_K_GBB>(p0, pair_ahead(b, nsb), s);
                prefetch_slice::<Q4_K_GBB>(p1, pair_ahead(b, nsb), s);
                // Four partial sums per row when there are few rows, so
                // consecutive `vpdpbusd` do not wait on each other (one
                // chain of eight per sub-block left a 1-token step slower
                // than the AVX2 kernel); integer sums, so the total is the
                // same whichever way it is added up.
                let mut part = [[_mm512_setzero_si512(); CHAINS]; T];
                for c in 0..4 {
                    let at = Q4_K_NIB + (4 * s + c) * 32;
                    let w = load_pair(p0.add(at), p1.add(at));
                    let lo = _mm512_and_si512(w, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                    let (k0, k1) = chains::<T>(c);
                    for t in 0..T {
                        let qs = &rows[t].get_unchecked(b).qs;
                        part[t][k0] =
                            _mm512_dpbusd_epi32(part[t][k0], lo, bcast4(qs, 32 * s + 4 * c));
                        part[t][k1] =
                            _mm512_dpbusd_epi32(part[t][k1], hi, bcast4(qs, 32 * s + 16 + 4 * c));
                    }
                }
                let s32: [__m512i; T] = std::array::from_fn(|t| sum_chains::<T>(&part[t]));
                let sc = scales_u8(p0.add(Q4_K_SC + 8 * s), p1.add(Q4_K_SC + 8 * s));
                for t in 0..T {
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s32[t], sc));
                }
            }
            let dv = halves_pair(p0, p1);
            let dminv = halves_pair(p0.add(Q4_K_DMIN), p1.add(Q4_K_DMIN));
            let mins = q4_k_mins(p0, p1);
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                acc[t] = q4_k_finish(dv, dminv, &mins, a, isum[t], acc[t]);
            }
        }
        for t in 0..T {
            store_pair(acc[t], out, t);
        }
    }
}

/// Q6_K's top two bits of chunk c moved to bits 4..6 of each byte.
///
/// # Safety
/// AVX-512 F and BW (callers are the entry points below).
#[inline(always)]
unsafe fn q6_high(h: __m512i, c: usize) -> __m512i {
    unsafe {
        let m = _mm512_set1_epi8(0x30);
        match c {
            0 => _mm512_and_si512(_mm512_slli_epi16(h, 4), m),
            1 => _mm512_and_si512(_mm512_slli_epi16(h, 2), m),
            2 => _mm512_and_si512(h, m),
            _ => _mm512_and_si512(_mm512_srli_epi16(h, 2), m),
        }
    }
}

/// The 6-bit values of chunk `c` of both groups' Q6_K records at `rec0`
/// and `rec1`: the low nibbles (`side` 0, sub-block 2q) or the high ones
/// (`side` 1, sub-block 2q + 1), with their top two bits from `h` (that
/// side's bit plane). Shared by the VNNI and the tile kernels.
///
/// # Safety
/// `rec0` and `rec1` must each point to a whole 192-byte record; AVX-512 F
/// and BW (callers as for [`q4_k_mins`]).
#[inline(always)]
pub(crate) unsafe fn q6_values(
    rec0: *const u8,
    rec1: *const u8,
    h: __m512i,
    side: usize,
    c: usize,
    m4: __m512i,
) -> __m512i {
    unsafe {
        let w = load_pair(rec0.add(32 * c), rec1.add(32 * c));
        let w = if side == 0 {
            w
        } else {
            _mm512_srli_epi16(w, 4)
        };
        _mm512_or_si512(_mm512_and_si512(w, m4), q6_high(h, c))
    }
}

/// Two adjacent groups of packed Q6_K rows · `T` activation rows (see
/// [`PairFn`]).
///
/// # Safety
/// `data` must be a packed Q6_K matrix of `nsb` super-blocks per row with at
/// least `g + 2` groups, rows `r0..r0 + T` must exist in `acts` as
/// 256-element blocks (`quantize_k`), `nsb` each, and the CPU must support
/// AVX-512 F, BW and VNNI (callers are the entry points below).
#[inline(always)]
unsafe fn q6_k_pair<const T: usize>(
    data: &[u8],
    nsb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut [GroupOut; 2],
) {
    unsafe {
        let rows: [&[BlockQ8K]; T] = std::array::from_fn(|t| acts.row_k(r0 + t));
        let base0 = data.as_ptr().add(g * nsb * Q6_K_GBB);
        let base1 = base0.add(nsb * Q6_K_GBB);
        let m4 = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); T];
        for b in 0..nsb {
            let (p0, p1) = (base0.add(b * Q6_K_GBB), base1.add(b * Q6_K_GBB));
            let mut isum = [_mm512_setzero_si512(); T];
            for q in 0..8 {
                prefetch_slice::<Q6_K_GBB>(p0, pair_ahead(b, nsb), q);
                prefetch_slice::<Q6_K_GBB>(p1, pair_ahead(b, nsb), q);
                let (rec0, rec1) = (
                    p0.add(Q6_K_VALUES + q * Q6_K_GROUP),
                    p1.add(Q6_K_VALUES + q * Q6_K_GROUP),
                );
                // Low nibbles are sub-block 2q, high nibbles 2q + 1.
                for side in 0..2 {
                    let h = load_pair(rec0.add(128 + 32 * side), rec1.add(128 + 32 * side));
                    // Independent partial sums with few rows (see q4_k_pair).
                    let mut part = [[_mm512_setzero_si512(); CHAINS]; T];
                    for c in 0..4 {
                        let v = q6_values(rec0, rec1, h, side, c, m4);
                        let k = chains::<T>(c).0;
                        for t in 0..T {
                            let qs = &rows[t].get_unchecked(b).qs;
                            let a = bcast4(qs, 32 * q + 16 * side + 4 * c);
                            part[t][k] = _mm512_dpbusd_epi32(part[t][k], v, a);
                        }
                    }
                    let s32: [__m512i; T] = std::array::from_fn(|t| sum_chains::<T>(&part[t]));
                    let sub = Q6_K_SC + 8 * (2 * q + side);
                    let sc = scales_i8(p0.add(sub), p1.add(sub));
                    for t in 0..T {
                        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s32[t], sc));
                    }
                }
            }
            let dv = halves_pair(p0, p1);
            let scs = q6_k_scale_pairs(p0, p1);
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                acc[t] = q6_k_finish(dv, &scs, a, isum[t], acc[t]);
            }
        }
        for t in 0..T {
            store_pair(acc[t], out, t);
        }
    }
}

/// Q4_K's 6-bit mins of both groups' rows, widened to i16, in pairs of
/// sub-blocks (the order `vpmaddwd` multiplies them with pairs of
/// activation sums): one register per pair.
///
/// # Safety
/// `p0` and `p1` must each point to a whole Q4_K group-block; AVX-512 F
/// and BW (callers are the AVX-512 entry points of this module and of the
/// tile kernels).
#[inline(always)]
pub(crate) unsafe fn q4_k_mins(p0: *const u8, p1: *const u8) -> [__m512i; 4] {
    unsafe {
        std::array::from_fn(|p| {
            _mm512_cvtepu8_epi16(_mm256_set_m128i(
                _mm_loadu_si128(p1.add(Q4_K_MIN + 16 * p) as *const __m128i),
                _mm_loadu_si128(p0.add(Q4_K_MIN + 16 * p) as *const __m128i),
            ))
        })
    }
}

/// One Q4_K super-block's float step for one activation row `a`, given the
/// integer sum `isum` (Σ sub-blocks scale · dot): `acc + isum · (d · d_a)
/// − msum · (dmin · d_a)`, msum = Σ mins · the row's sub-block sums. The
/// VNNI and the tile kernels both end each super-block here, so their
/// results are the same bits.
///
/// # Safety
/// AVX-512 F and BW (callers as for [`q4_k_mins`]).
#[inline(always)]
pub(crate) unsafe fn q4_k_finish(
    dv: __m512,
    dminv: __m512,
    mins: &[__m512i; 4],
    a: &BlockQ8K,
    isum: __m512i,
    acc: __m512,
) -> __m512 {
    unsafe {
        let mut msum = _mm512_setzero_si512();
        for (p, m) in mins.iter().enumerate() {
            msum = _mm512_add_epi32(msum, _mm512_madd_epi16(*m, bcast_pair(&a.bsums32, 2 * p)));
        }
        let da = _mm512_set1_ps(a.d);
        let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dv, da), acc);
        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dminv, da), acc)
    }
}

/// Q6_K's signed sub-block scales of both groups' rows, widened to i16,
/// in pairs of sub-blocks: one register per pair.
///
/// # Safety
/// As for [`q4_k_mins`], for Q6_K group-blocks.
#[inline(always)]
pub(crate) unsafe fn q6_k_scale_pairs(p0: *const u8, p1: *const u8) -> [__m512i; 8] {
    unsafe {
        std::array::from_fn(|p| {
            let pair = |base: *const u8| {
                _mm_unpacklo_epi8(
                    _mm_loadl_epi64(base.add(Q6_K_SC + 8 * (2 * p)) as *const __m128i),
                    _mm_loadl_epi64(base.add(Q6_K_SC + 8 * (2 * p + 1)) as *const __m128i),
                )
            };
            _mm512_cvtepi8_epi16(_mm256_set_m128i(pair(p1), pair(p0)))
        })
    }
}

/// One Q6_K super-block's float step for one activation row `a`, given
/// the integer sum `isum` (Σ sub-blocks scale · dot of the 0..64 values):
/// the −32 offset of every value comes off as −32 · Σ scale · the row's
/// sub-block sums, then `acc + v · (d · d_a)`. Shared by the VNNI and the
/// tile kernels (see [`q4_k_finish`]).
///
/// # Safety
/// As for [`q4_k_finish`].
#[inline(always)]
pub(crate) unsafe fn q6_k_finish(
    dv: __m512,
    scs: &[__m512i; 8],
    a: &BlockQ8K,
    isum: __m512i,
    acc: __m512,
) -> __m512 {
    unsafe {
        let mut corr = _mm512_setzero_si512();
        for (p, sc) in scs.iter().enumerate() {
            corr = _mm512_add_epi32(corr, _mm512_madd_epi16(*sc, bcast_pair(&a.bsums, 2 * p)));
        }
        let v = _mm512_sub_epi32(isum, _mm512_slli_epi32(corr, 5));
        let scale = _mm512_mul_ps(dv, _mm512_set1_ps(a.d));
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), scale, acc)
    }
}

entry!(pair q4_k_pair [], q4_k_pair_512);
entry!(pair q6_k_pair [], q6_k_pair_512);

/// The two-group K-quant kernel for `fmt`, on AVX-512 VNNI only.
pub(crate) fn pair_fn(isa: Isa, fmt: QFormat) -> Option<PairFn> {
    match (isa, fmt) {
        (Isa::Avx512Vnni | Isa::AmxInt8, QFormat::Q4_K) => Some(q4_k_pair_512),
        (Isa::Avx512Vnni | Isa::AmxInt8, QFormat::Q6_K) => Some(q6_k_pair_512),
        _ => None,
    }
}
