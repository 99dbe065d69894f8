//! AMX-INT8 tile kernels over pairs of packed 8-row groups (see `packed`).
//!
//! A 1-token step is bound by weight reads, but a k-token verify forward is
//! bound by multiply-adds: `vpdpbusd` does 64 per instruction, one AMX
//! `tdpbsud` up to 16 × 16 × 64. Here one tile product dots a 32-input block
//! of 16 weight rows (two groups) with up to 16 activation rows.
//!
//! The integer block sums are exact whoever computes them, and the float
//! epilogue below does per lane exactly what `packed_blocks32_512`'s pair
//! kernels do (same operations, same order). A row's result is therefore
//! bit-identical to the VNNI kernels', so the caller may use tiles for large
//! k and VNNI for small k without breaking batch invariance.
//!
//! Whether it pays is measured, not assumed (`tile_plan`): GGML scales
//! every 32-input block, so each block's sums still need a float epilogue
//! per (token, 16 rows), and that epilogue, not the dot products, bounds
//! the kernel; on one 2-core VM it ran no faster than VNNI at 8 rows and
//! faster at 16 (docs/performance.md, "Build flags").
//!
//! Tile operations go through `tiles::TileUnit` (the instructions, or their
//! emulation in the tests); tile set s: activations tmm(s) (t rows × 32
//! i8), weights tmm(2 + s) (8 rows of 4 inputs × 16 output rows), sums
//! tmm(4 + s) (t rows × 16 i32). Q4_1 nibbles are unpacked to one byte each
//! and both formats' two groups interleaved per tile row.

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

pub(crate) mod kquant;

use std::arch::x86_64::*;

use crate::act::{BlockQ8, QuantizedRows};
use crate::format::QFormat;
use crate::packed::x86::{halves_pair, store_pair};
use crate::packed::{GROUP, group_block_bytes};
use crate::tiles::{MAX_T, PairOut, TileConfig, TileUnit, Weights, tile_entry};

/// Blocks per phase. A tile load right after the vector stores that wrote
/// its data (or a vector load right after a tile store) waits for them to
/// reach L1, so blocks go through in phases: all weight tiles of a chunk are
/// written, then all its tile products run back to back, then all its
/// epilogues. The waits then come once per chunk, not once per block.
const CHUNK: usize = 8;

/// Memory that tiles are loaded from and stored to.
#[repr(C, align(64))]
struct Scratch {
    /// Weight tiles: row q = group g's 8 rows × inputs 4q..4q + 4, then
    /// group g + 1's.
    w: [[u8; 512]; CHUNK],
    /// Row t: the 8 sums of group g, then the 8 of group g + 1 (the lane
    /// layout of the VNNI pair kernels).
    sums: [[[i32; 2 * GROUP]; MAX_T]; CHUNK],
}

/// Rows 2i and 2i + 1 of a weight tile from 64 bytes of each group: the
/// 256-bit halves [g lo, g+1 lo] and [g hi, g+1 hi].
///
/// # Safety
/// `dst` must be 64-byte aligned and writable for `2 · i + 2` 512-bit
/// rows, and the CPU must support AVX-512F (callers run inside the
/// AVX-512 `#[target_feature]` entry points of this module).
#[inline(always)]
unsafe fn two_rows(dst: *mut __m512i, i: usize, x: __m512i, y: __m512i) {
    unsafe {
        _mm512_store_si512(dst.add(2 * i), _mm512_shuffle_i64x2(x, y, 0x44));
        _mm512_store_si512(dst.add(2 * i + 1), _mm512_shuffle_i64x2(x, y, 0xee));
    }
}

/// Writes the weight tile (8 rows × 64 bytes) of the group-blocks at `p0`
/// and `p1` into `dst`.
///
/// # Safety
/// `p0` and `p1` must each point to one whole group-block of the format
/// (Q4_1 if `Q4_1`, else Q8_0), `dst` must be 64-byte aligned and writable
/// for 512 bytes, and the CPU must support AVX-512F and BW.
#[inline(always)]
unsafe fn weight_tile<const Q4_1: bool>(p0: *const u8, p1: *const u8, dst: *mut u8) {
    unsafe {
        let dst = dst as *mut __m512i;
        if Q4_1 {
            // Low nibbles of chunk q are inputs 4q..4q + 4, high nibbles
            // inputs 16 + 4q..: rows 0–3 low, rows 4–7 high.
            let m4 = _mm512_set1_epi8(0x0f);
            let x01 = _mm512_loadu_si512(p0.add(32) as *const __m512i);
            let x23 = _mm512_loadu_si512(p0.add(96) as *const __m512i);
            let y01 = _mm512_loadu_si512(p1.add(32) as *const __m512i);
            let y23 = _mm512_loadu_si512(p1.add(96) as *const __m512i);
            two_rows(dst, 0, _mm512_and_si512(x01, m4), _mm512_and_si512(y01, m4));
            two_rows(dst, 1, _mm512_and_si512(x23, m4), _mm512_and_si512(y23, m4));
            let (x01, x23) = (_mm512_srli_epi16(x01, 4), _mm512_srli_epi16(x23, 4));
            let (y01, y23) = (_mm512_srli_epi16(y01, 4), _mm512_srli_epi16(y23, 4));
            two_rows(dst, 2, _mm512_and_si512(x01, m4), _mm512_and_si512(y01, m4));
            two_rows(dst, 3, _mm512_and_si512(x23, m4), _mm512_and_si512(y23, m4));
        } else {
            for i in 0..4 {
                let x = _mm512_loadu_si512(p0.add(16 + 64 * i) as *const __m512i);
                let y = _mm512_loadu_si512(p1.add(16 + 64 * i) as *const __m512i);
                two_rows(dst, i, x, y);
            }
        }
    }
}

/// Starts the tile product of chunk-local block `i` on tile set i % 2.
///
/// # Safety
/// `unit` may run (for [`crate::tiles::Amx`]: `Isa::AmxInt8` supported),
/// it is configured for the t activation rows being read, `a` points to t
/// rows of 32 readable i8 values `a_stride` bytes apart, and `i < CHUNK`
/// with `scratch.w[i]` holding the block's weight tile.
#[inline(always)]
unsafe fn start<U: TileUnit, const Q4_1: bool>(
    unit: &mut U,
    a: *const i8,
    a_stride: usize,
    i: usize,
    scratch: &Scratch,
) {
    let weights = if Q4_1 {
        Weights::Unsigned
    } else {
        Weights::Signed
    };
    unsafe { unit.product(i % 2, weights, a, a_stride, scratch.w[i].as_ptr()) }
}

/// Stores the sums of chunk-local block `i` from tile set i % 2.
///
/// # Safety
/// As for [`start`]; `i < CHUNK` (indexing `scratch.sums` is
/// bounds-checked; the tile store writes t rows of 64 bytes into that
/// entry).
#[inline(always)]
unsafe fn store<U: TileUnit>(unit: &mut U, i: usize, scratch: &mut Scratch) {
    unsafe { unit.store(i % 2, scratch.sums[i].as_mut_ptr() as *mut i32) }
}

/// The float epilogue of blocks c0..c0 + len, per lane exactly that of the
/// VNNI pair kernels (block by block: acc += f32(sum) · (d_w · d_a),
/// macc += m_w · s_a). Token by token, so that one token's two
/// accumulators stay in registers across the chunk.
///
/// # Safety
/// `base0` and `base1` must each point to a group's `nb` group-blocks of
/// `gbb` bytes, `row0` to `T` activation rows of `nb` blocks each (row ti
/// at `row0 + ti · nb`), `c0 + len <= nb` and `len <= CHUNK`, and the CPU
/// must support AVX-512F.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn finish<const Q4_1: bool, const T: usize>(
    base0: *const u8,
    base1: *const u8,
    gbb: usize,
    row0: *const BlockQ8,
    nb: usize,
    c0: usize,
    len: usize,
    scratch: &Scratch,
    acc: &mut [__m512; T],
    macc: &mut [__m512; T],
) {
    unsafe {
        let mut dv = [_mm512_setzero_ps(); CHUNK];
        let mut mv = [_mm512_setzero_ps(); CHUNK];
        for i in 0..len {
            let (p0, p1) = (base0.add((c0 + i) * gbb), base1.add((c0 + i) * gbb));
            dv[i] = halves_pair(p0, p1);
            if Q4_1 {
                mv[i] = halves_pair(p0.add(16), p1.add(16));
            }
        }
        for ti in 0..T {
            let (mut a_acc, mut m_acc) = (acc[ti], macc[ti]);
            let row = row0.add(ti * nb + c0);
            for i in 0..len {
                let a = &*row.add(i);
                let isum = _mm512_load_si512(scratch.sums[i][ti].as_ptr() as *const __m512i);
                let scale = _mm512_mul_ps(dv[i], _mm512_set1_ps(a.d));
                a_acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, a_acc);
                if Q4_1 {
                    m_acc = _mm512_fmadd_ps(mv[i], _mm512_set1_ps(a.s), m_acc);
                }
            }
            acc[ti] = a_acc;
            macc[ti] = m_acc;
        }
    }
}

/// The pairs of groups (g0 + 2i, g0 + 2i + 1), i < `npairs`, against
/// activation rows r0..r0 + T (see [`AmxPairsFn`](crate::tiles::AmxPairsFn)).
///
/// # Safety
/// As for [`AmxPairsFn`](crate::tiles::AmxPairsFn), with `T` rows (1..=16): `data` is a packed
/// matrix (Q4_1 if `Q4_1`, else Q8_0) of `nb` blocks per row holding
/// those groups, rows r0..r0 + T exist in `acts` with `nb` blocks, `unit`
/// may run here, and the CPU supports AVX-512 VNNI, BW and VL.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pairs<U: TileUnit, const Q4_1: bool, const T: usize>(
    unit: &mut U,
    data: &[u8],
    nb: usize,
    g0: usize,
    npairs: usize,
    acts: &QuantizedRows,
    r0: usize,
    emit: &mut dyn FnMut(usize, &PairOut),
) {
    let gbb = if Q4_1 {
        group_block_bytes(QFormat::Q4_1)
    } else {
        group_block_bytes(QFormat::Q8_0)
    };
    unsafe {
        unit.configure(&TileConfig::new(T, 32));
        let mut scratch = Scratch {
            w: [[0; 512]; CHUNK],
            sums: [[[0; 2 * GROUP]; MAX_T]; CHUNK],
        };
        let mut out: PairOut = [[[0.0; GROUP]; MAX_T]; 2];
        // From the slice of all T rows: the tiles read every row from it.
        let row0: *const BlockQ8 = acts.rows_ptr(r0, T);
        let a_stride = nb * size_of::<BlockQ8>();
        for pi in 0..npairs {
            let g = g0 + 2 * pi;
            let base0 = data.as_ptr().add(g * nb * gbb);
            let base1 = base0.add(nb * gbb);
            let mut acc = [_mm512_setzero_ps(); T];
            let mut macc = [_mm512_setzero_ps(); T];
            let at = |b: usize| (base0.add(b * gbb), base1.add(b * gbb));
            for c0 in (0..nb).step_by(CHUNK) {
                let len = CHUNK.min(nb - c0);
                for i in 0..len {
                    let (p0, p1) = at(c0 + i);
                    weight_tile::<Q4_1>(p0, p1, scratch.w[i].as_mut_ptr());
                }
                // Block i's product is under way while block i − 1's sums
                // are stored: two products in flight.
                for i in 0..len {
                    let a = (*row0.add(c0 + i)).qs.as_ptr();
                    start::<U, Q4_1>(unit, a, a_stride, i, &scratch);
                    if i > 0 {
                        store(unit, i - 1, &mut scratch);
                    }
                }
                store(unit, len - 1, &mut scratch);
                finish::<Q4_1, T>(
                    base0, base1, gbb, row0, nb, c0, len, &scratch, &mut acc, &mut macc,
                );
            }
            for ti in 0..T {
                let v = if Q4_1 {
                    _mm512_add_ps(acc[ti], macc[ti])
                } else {
                    acc[ti]
                };
                store_pair(v, &mut out, ti);
            }
            emit(g, &out);
        }
        unit.release();
    }
}

tile_entry!(q4_1_pairs, pairs[true], crate::tiles::Amx);
tile_entry!(q8_0_pairs, pairs[false], crate::tiles::Amx);

/// The kernels on emulated tiles, for the tests.
#[cfg(test)]
pub(crate) mod emulated {
    use super::*;

    tile_entry!(
        q4_1_pairs_emulated,
        pairs[true],
        crate::tiles::Emulated::new()
    );
    tile_entry!(
        q8_0_pairs_emulated,
        pairs[false],
        crate::tiles::Emulated::new()
    );
}
