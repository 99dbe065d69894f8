//! AMX-INT8 tile kernels over pairs of packed 8-row groups (see `packed`).
//!
//! A 1-token step is bound by weight reads, but a k-token verify forward is
//! bound by multiply-adds: `vpdpbusd` does 64 per instruction, one AMX
//! `tdpbsud` up to 16 × 16 × 64. Here one tile product dots a 32-input block
//! of 16 weight rows (two groups) with up to 16 activation rows.
//!
//! The integer block sums are exact whoever computes them, and the float
//! epilogue below does per lane exactly what `packed_x86`'s 512-bit pair
//! kernels do (same operations, same order). A row's result is therefore
//! bit-identical to the VNNI kernels', so the caller may use tiles for large
//! k and VNNI for small k without breaking batch invariance.
//!
//! Why this is opt-in (`Isa::AmxInt8`): GGML scales every 32-input block, so
//! each block's sums still need a float epilogue per (token, 16 rows), and
//! that epilogue, not the dot products, bounds the kernel. Measured on this
//! 2-core VM it runs no faster than VNNI (docs/performance.md, "Build flags").
//!
//! Tiles (palette 1), two sets so consecutive blocks do not wait on each
//! other's registers: tmm0 / tmm1 = activations (t rows × 32 i8), tmm2 /
//! tmm3 = weights (8 rows of 4 inputs × 16 output rows), tmm4 / tmm5 = sums
//! (t rows × 16 i32). Q4_1 nibbles are unpacked to one byte each and both
//! formats' two groups interleaved per tile row.

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::asm;
use std::arch::x86_64::*;

use crate::act::{BlockQ8, QuantizedRows};
use crate::format::QFormat;
use crate::packed::{GROUP, group_block_bytes};
use crate::packed_x86::{halves_pair, store_pair};

/// Activation rows per tile call at most (a tile has 16 rows).
pub(crate) const MAX_T: usize = 16;

/// Results for one pair of groups: `out[s][t][j]` for group g + s,
/// activation row t and group row j.
pub(crate) type PairOut = [[[f32; GROUP]; MAX_T]; 2];

/// Computes the pairs of groups (g0 + 2i, g0 + 2i + 1), i < `pairs`, against
/// activation rows r0..r0 + t (t ≤ 16) and hands each pair's results to
/// `emit(g, out)`.
///
/// # Safety
/// `data` must be a packed matrix of `nb` blocks per row holding those
/// groups, rows r0..r0 + t must exist in `acts` with `nb` blocks, and
/// [`available`] must have returned true.
pub(crate) type AmxPairsFn = unsafe fn(
    data: &[u8],
    nb: usize,
    g0: usize,
    pairs: usize,
    acts: &QuantizedRows,
    r0: usize,
    t: usize,
    emit: &mut dyn FnMut(usize, &PairOut),
);

/// The 64-byte tile configuration for t activation rows: two sets of
/// (activations tmm0/1: t × 32 i8, weights tmm2/3: 8 × 64, sums tmm4/5:
/// t × 16 i32), so that consecutive blocks' products do not wait on each
/// other's registers.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(t: usize) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        // (tile, rows, bytes per row)
        let tiles = [
            (0, t, 32),
            (1, t, 32),
            (2, 8, 64),
            (3, 8, 64),
            (4, t, 64),
            (5, t, 64),
        ];
        for (i, rows, colsb) in tiles {
            c[16 + 2 * i..18 + 2 * i].copy_from_slice(&(colsb as u16).to_le_bytes());
            c[48 + i] = rows as u8;
        }
        TileConfig(c)
    }
}

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

/// Starts the tile product of one block on tile set (`$ta`, `$tw`, `$tc`):
/// loads the activations at `$a` (rows `$sa` bytes apart) and the weight
/// tile at `$w`, and multiplies them into `$tc`.
macro_rules! start_product {
    ($op:literal, $ta:literal, $tw:literal, $tc:literal, $a:expr, $sa:expr, $w:expr) => {
        asm!(
            concat!("tileloadd tmm", $ta, ", [{a} + {sa}*1]"),
            concat!("tileloadd tmm", $tw, ", [{w} + {s64}*1]"),
            concat!("tilezero tmm", $tc),
            concat!($op, " tmm", $tc, ", tmm", $ta, ", tmm", $tw),
            a = in(reg) $a, sa = in(reg) $sa, w = in(reg) $w, s64 = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}

/// Stores tile `$tc`'s t × 16 sums to `$c`.
macro_rules! store_sums {
    ($tc:literal, $c:expr) => {
        asm!(
            concat!("tilestored [{c} + {s64}*1], tmm", $tc),
            c = in(reg) $c, s64 = in(reg) 64usize,
            options(nostack),
        )
    };
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
/// [`available`] must have returned true (AMX-INT8 present and enabled
/// for this process), the caller's `ldtilecfg` must have configured the
/// tiles for the t activation rows being read, `a` must point to t rows
/// of 32 readable i8 values `a_stride` bytes apart, and `i < CHUNK` with
/// `scratch.w[i]` holding the block's weight tile.
#[inline(always)]
unsafe fn start<const Q4_1: bool>(a: *const i8, a_stride: usize, i: usize, scratch: &Scratch) {
    unsafe {
        let w = scratch.w[i].as_ptr();
        match (i % 2, Q4_1) {
            (0, true) => start_product!("tdpbsud", "0", "2", "4", a, a_stride, w),
            (_, true) => start_product!("tdpbsud", "1", "3", "5", a, a_stride, w),
            (0, false) => start_product!("tdpbssd", "0", "2", "4", a, a_stride, w),
            (_, false) => start_product!("tdpbssd", "1", "3", "5", a, a_stride, w),
        }
    }
}

/// Stores the sums of chunk-local block `i` from tile set i % 2.
///
/// # Safety
/// [`available`] must have returned true, the tiles must be configured
/// (`ldtilecfg`) for at most `MAX_T` rows, and `i < CHUNK` (indexing
/// `scratch.sums` is bounds-checked; the tile store writes t rows of 64
/// bytes into that entry).
#[inline(always)]
unsafe fn store(i: usize, scratch: &mut Scratch) {
    unsafe {
        let c = scratch.sums[i].as_mut_ptr();
        match i % 2 {
            0 => store_sums!("4", c),
            _ => store_sums!("5", c),
        }
    }
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
/// activation rows r0..r0 + T (see [`AmxPairsFn`]).
///
/// # Safety
/// As for [`AmxPairsFn`], with `T` rows (1..=16): `data` is a packed
/// matrix (Q4_1 if `Q4_1`, else Q8_0) of `nb` blocks per row holding
/// those groups, rows r0..r0 + T exist in `acts` with `nb` blocks, and
/// [`available`] has returned true; the CPU must also support AVX-512
/// VNNI, BW and VL (implied by `available`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pairs<const Q4_1: bool, const T: usize>(
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
        let cfg = TileConfig::new(T);
        asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        let mut scratch = Scratch {
            w: [[0; 512]; CHUNK],
            sums: [[[0; 2 * GROUP]; MAX_T]; CHUNK],
        };
        let mut out: PairOut = [[[0.0; GROUP]; MAX_T]; 2];
        let row0: *const BlockQ8 = acts.row(r0).as_ptr();
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
                    start::<Q4_1>(a, a_stride, i, &scratch);
                    if i > 0 {
                        store(i - 1, &mut scratch);
                    }
                }
                store(len - 1, &mut scratch);
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
        asm!("tilerelease", options(nostack, nomem));
    }
}

macro_rules! pairs_entry {
    ($name:ident, $q4_1:literal) => {
        /// An [`AmxPairsFn`].
        ///
        /// # Safety
        /// As for [`AmxPairsFn`]: `data` is a packed matrix of `nb` blocks
        /// per row holding the groups, rows `r0..r0 + t` (`t` in 1..=16)
        /// exist in `acts`, and [`available`] has returned true (the
        /// dispatcher only picks these for a supported `Isa::AmxInt8`).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            data: &[u8],
            nb: usize,
            g0: usize,
            npairs: usize,
            acts: &QuantizedRows,
            r0: usize,
            t: usize,
            emit: &mut dyn FnMut(usize, &PairOut),
        ) {
            unsafe {
                by_rows!(
                    t, $q4_1, (data, nb, g0, npairs, acts, r0, emit),
                    1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16
                )
            }
        }
    };
}

/// `pairs::<q4_1, t>` for a run-time t.
macro_rules! by_rows {
    ($t:expr, $q4_1:literal, $args:tt, $($n:literal)*) => {
        match $t {
            $($n => by_rows!(@call $q4_1, $n, $args),)*
            _ => unreachable!("tile calls take 1..=16 rows"),
        }
    };
    (@call $q4_1:literal, $n:literal, ($($arg:expr),*)) => {
        pairs::<$q4_1, $n>($($arg),*)
    };
}
pairs_entry!(q4_1_pairs, true);
pairs_entry!(q8_0_pairs, false);

/// The tile kernel for `fmt`, if it has one.
pub(crate) fn pairs_fn(fmt: QFormat) -> Option<AmxPairsFn> {
    match fmt {
        QFormat::Q4_1 => Some(q4_1_pairs),
        QFormat::Q8_0 => Some(q8_0_pairs),
        _ => None,
    }
}
