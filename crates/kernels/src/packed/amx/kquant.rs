//! AMX-INT8 tile kernels for the K-quants (Q4_K, Q6_K) over pairs of packed
//! 8-row groups (layouts in `packed::kquant`).
//!
//! Why tiles here: a k-token verify forward of a Q4_K_M model is bound by
//! `vpdpbusd` (docs/lab/kernels.md, "Where a step of the 1.5B goes"): per
//! super-block of 16 weight rows and 8 activation rows the VNNI kernel
//! issues 512 of them. One `tdpbsud` does a sub-block (32 inputs for Q4_K,
//! 16 for Q6_K) of 16 weight rows against up to 16 activation rows, on a
//! unit of its own, leaving the vector ports the unpacking and the
//! epilogue.
//!
//! The sub-block scales are applied once per sub-block in the integer
//! domain, as in the VNNI kernels: each product's 16 × t sums are
//! multiplied by the 16 rows' scale and added up over the super-block; the
//! super-block's float step is the VNNI kernels' own
//! (`packed_kquant_512::q4_k_finish`, `q6_k_finish`). Integer sums are
//! exact whoever adds them, so every result is bit-identical to the VNNI
//! kernels', for any number of rows per call.
//!
//! Per super-block the work goes through in phases (see `packed_amx`): all
//! weight tiles are written (vector unpacking into a scratch buffer), then
//! the tile products run back to back, each one's sums stored while the
//! next multiplies, then the epilogue reads them.

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::act::{BlockQ8K, QuantizedRows};
use crate::packed::GROUP;
use crate::packed::kquant::{
    Q4_K_DMIN, Q4_K_GBB, Q4_K_NIB, Q4_K_SC, Q6_K_GBB, Q6_K_GROUP, Q6_K_SC, Q6_K_VALUES,
};
use crate::packed::x86::kquant_512::{
    pair_ahead, q4_k_finish, q4_k_mins, q6_k_finish, q6_k_scale_pairs, q6_values, scales_i8,
    scales_u8,
};
use crate::packed::x86::{halves_pair, load_pair, prefetch_slice, store_pair};
use crate::tiles::{MAX_T, PairOut, TileConfig, TileUnit, Weights, tile_entry};

/// Sub-blocks per super-block: Q4_K's are 32 inputs, Q6_K's 16.
const Q4_K_SUBS: usize = 8;
const Q6_K_SUBS: usize = 16;

/// Scratch memory of one super-block: `SUBS` weight tiles of `W` bytes
/// (16 output rows × 4 inputs per 64-byte row) and their sums (row t: the
/// 8 sums of group g, then the 8 of group g + 1, the lane layout of the
/// VNNI pair kernels).
#[repr(C, align(64))]
struct Scratch<const SUBS: usize, const W: usize> {
    w: [[u8; W]; SUBS],
    sums: [[[i32; 2 * GROUP]; MAX_T]; SUBS],
}

impl<const SUBS: usize, const W: usize> Scratch<SUBS, W> {
    fn new() -> Self {
        Scratch {
            w: [[0; W]; SUBS],
            sums: [[[0; 2 * GROUP]; MAX_T]; SUBS],
        }
    }
}

/// Runs the products of one super-block: sub-block `u`'s activations at
/// `a(u)` (rows `a_stride` apart) against weight tile `u`, its sums into
/// `scratch.sums[u]`. Two tile sets alternate, so sub-block u − 1's sums
/// are stored while u's product runs.
///
/// # Safety
/// The unit is configured for `a_bytes` = the sub-block's inputs and the
/// call's rows, every `a(u)` points to those rows, and the weight tiles are
/// written.
#[inline(always)]
unsafe fn products<U: TileUnit, const SUBS: usize, const W: usize>(
    unit: &mut U,
    a: impl Fn(usize) -> *const i8,
    a_stride: usize,
    scratch: &mut Scratch<SUBS, W>,
) {
    unsafe {
        for u in 0..SUBS {
            unit.product(
                u % 2,
                Weights::Unsigned,
                a(u),
                a_stride,
                scratch.w[u].as_ptr(),
            );
            if u > 0 {
                unit.store((u - 1) % 2, scratch.sums[u - 1].as_mut_ptr() as *mut i32);
            }
        }
        unit.store(
            (SUBS - 1) % 2,
            scratch.sums[SUBS - 1].as_mut_ptr() as *mut i32,
        );
    }
}

/// Row t's super-block sum: Σ over sub-blocks of sums · scale, exact in i32.
///
/// # Safety
/// AVX-512F; `t < MAX_T`.
#[inline(always)]
unsafe fn scaled_sum<const SUBS: usize, const W: usize>(
    scratch: &Scratch<SUBS, W>,
    sc: &[__m512i; SUBS],
    t: usize,
) -> __m512i {
    unsafe {
        let mut isum = _mm512_setzero_si512();
        for u in 0..SUBS {
            let s = _mm512_load_si512(scratch.sums[u][t].as_ptr() as *const __m512i);
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(s, sc[u]));
        }
        isum
    }
}

/// Q4_K: the pairs of groups (g0 + 2i, g0 + 2i + 1), i < `npairs`, against
/// activation rows r0..r0 + T (T ≤ 16), each pair's results to `emit`.
///
/// # Safety
/// `data` is a packed Q4_K matrix of `nsb` super-blocks per row holding
/// those groups, rows r0..r0 + T exist in `acts` as 256-element blocks,
/// `unit` may run (for [`crate::tiles::Amx`]: `Isa::AmxInt8` supported),
/// and the CPU supports AVX-512 F, BW and VL.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_k_pairs<U: TileUnit, const T: usize>(
    unit: &mut U,
    data: &[u8],
    nsb: usize,
    g0: usize,
    npairs: usize,
    acts: &QuantizedRows,
    r0: usize,
    emit: &mut dyn FnMut(usize, &PairOut),
) {
    unsafe {
        unit.configure(&TileConfig::new(T, 32));
        let mut scratch = Scratch::<Q4_K_SUBS, 512>::new();
        let mut out: PairOut = [[[0.0; GROUP]; MAX_T]; 2];
        let rows: [&[BlockQ8K]; T] = std::array::from_fn(|t| acts.row_k(r0 + t));
        // From the slice of all T rows: the tiles read every row from it.
        let row0 = acts.rows_k_ptr(r0, T);
        let a_stride = nsb * size_of::<BlockQ8K>();
        let m4 = _mm512_set1_epi8(0x0f);
        for pi in 0..npairs {
            let g = g0 + 2 * pi;
            let base0 = data.as_ptr().add(g * nsb * Q4_K_GBB);
            let base1 = base0.add(nsb * Q4_K_GBB);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nsb {
                let (p0, p1) = (base0.add(b * Q4_K_GBB), base1.add(b * Q4_K_GBB));
                // Weight tile s: rows 0–3 the low nibbles of chunks 0–3
                // (inputs 32s + 4c..), rows 4–7 the high ones (32s + 16 + 4c..).
                for s in 0..Q4_K_SUBS {
                    prefetch_slice::<Q4_K_GBB>(p0, pair_ahead(b, nsb), s);
                    prefetch_slice::<Q4_K_GBB>(p1, pair_ahead(b, nsb), s);
                    let dst = scratch.w[s].as_mut_ptr() as *mut __m512i;
                    for c in 0..4 {
                        let at = Q4_K_NIB + (4 * s + c) * 32;
                        let w = load_pair(p0.add(at), p1.add(at));
                        _mm512_store_si512(dst.add(c), _mm512_and_si512(w, m4));
                        _mm512_store_si512(
                            dst.add(4 + c),
                            _mm512_and_si512(_mm512_srli_epi16(w, 4), m4),
                        );
                    }
                }
                let qs = (*row0.add(b)).qs.as_ptr();
                products(unit, |s| qs.add(32 * s), a_stride, &mut scratch);
                let sc: [__m512i; Q4_K_SUBS] = std::array::from_fn(|s| {
                    scales_u8(p0.add(Q4_K_SC + 8 * s), p1.add(Q4_K_SC + 8 * s))
                });
                let dv = halves_pair(p0, p1);
                let dminv = halves_pair(p0.add(Q4_K_DMIN), p1.add(Q4_K_DMIN));
                let mins = q4_k_mins(p0, p1);
                for t in 0..T {
                    let isum = scaled_sum(&scratch, &sc, t);
                    let a = rows[t].get_unchecked(b);
                    acc[t] = q4_k_finish(dv, dminv, &mins, a, isum, acc[t]);
                }
            }
            for t in 0..T {
                store_pair(acc[t], &mut out, t);
            }
            emit(g, &out);
        }
        unit.release();
    }
}

/// Q6_K: as [`q4_k_pairs`], one tile product per 16-input sub-block.
///
/// # Safety
/// As for [`q4_k_pairs`], for a packed Q6_K matrix.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q6_k_pairs<U: TileUnit, const T: usize>(
    unit: &mut U,
    data: &[u8],
    nsb: usize,
    g0: usize,
    npairs: usize,
    acts: &QuantizedRows,
    r0: usize,
    emit: &mut dyn FnMut(usize, &PairOut),
) {
    unsafe {
        unit.configure(&TileConfig::new(T, 16));
        let mut scratch = Scratch::<Q6_K_SUBS, 256>::new();
        let mut out: PairOut = [[[0.0; GROUP]; MAX_T]; 2];
        let rows: [&[BlockQ8K]; T] = std::array::from_fn(|t| acts.row_k(r0 + t));
        // From the slice of all T rows: the tiles read every row from it.
        let row0 = acts.rows_k_ptr(r0, T);
        let a_stride = nsb * size_of::<BlockQ8K>();
        let m4 = _mm512_set1_epi8(0x0f);
        for pi in 0..npairs {
            let g = g0 + 2 * pi;
            let base0 = data.as_ptr().add(g * nsb * Q6_K_GBB);
            let base1 = base0.add(nsb * Q6_K_GBB);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nsb {
                let (p0, p1) = (base0.add(b * Q6_K_GBB), base1.add(b * Q6_K_GBB));
                // Record q holds sub-blocks 2q (low nibbles) and 2q + 1
                // (high nibbles); weight tile 2q + side row c = the 6-bit
                // values of chunk c (inputs 32q + 16 · side + 4c..).
                for q in 0..8 {
                    prefetch_slice::<Q6_K_GBB>(p0, pair_ahead(b, nsb), q);
                    prefetch_slice::<Q6_K_GBB>(p1, pair_ahead(b, nsb), q);
                    let (rec0, rec1) = (
                        p0.add(Q6_K_VALUES + q * Q6_K_GROUP),
                        p1.add(Q6_K_VALUES + q * Q6_K_GROUP),
                    );
                    for side in 0..2 {
                        let h = load_pair(rec0.add(128 + 32 * side), rec1.add(128 + 32 * side));
                        let dst = scratch.w[2 * q + side].as_mut_ptr() as *mut __m512i;
                        for c in 0..4 {
                            let v = q6_values(rec0, rec1, h, side, c, m4);
                            _mm512_store_si512(dst.add(c), v);
                        }
                    }
                }
                let qs = (*row0.add(b)).qs.as_ptr();
                products(unit, |u| qs.add(16 * u), a_stride, &mut scratch);
                let sc: [__m512i; Q6_K_SUBS] = std::array::from_fn(|u| {
                    scales_i8(p0.add(Q6_K_SC + 8 * u), p1.add(Q6_K_SC + 8 * u))
                });
                let dv = halves_pair(p0, p1);
                let scs = q6_k_scale_pairs(p0, p1);
                for t in 0..T {
                    let isum = scaled_sum(&scratch, &sc, t);
                    let a = rows[t].get_unchecked(b);
                    acc[t] = q6_k_finish(dv, &scs, a, isum, acc[t]);
                }
            }
            for t in 0..T {
                store_pair(acc[t], &mut out, t);
            }
            emit(g, &out);
        }
        unit.release();
    }
}

tile_entry!(q4_k_pairs_amx, q4_k_pairs [], crate::tiles::Amx);
tile_entry!(q6_k_pairs_amx, q6_k_pairs [], crate::tiles::Amx);

/// The kernels on emulated tiles, for the tests.
#[cfg(test)]
pub(crate) mod emulated {
    use super::*;

    tile_entry!(q4_k_pairs_emulated, q4_k_pairs [], crate::tiles::Emulated::new());
    tile_entry!(q6_k_pairs_emulated, q6_k_pairs [], crate::tiles::Emulated::new());
}
