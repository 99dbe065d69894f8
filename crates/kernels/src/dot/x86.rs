//! AVX2 / VNNI kernels.
//!
//! One generic body per format, instantiated for three ways of computing
//! 8 lanes of "sum of 4 adjacent u8·i8 products" (exactly the same integers
//! on every path; `vpmaddubsw` cannot saturate here: |u8·i8 pair| ≤ 2·128·127).
//! Each entry point carries its `#[target_feature]`, and the `inline(always)`
//! bodies inherit it, so the intrinsics inline into straight-line code.

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{Out, TileFn};
use crate::act::{BlockQ8, QuantizedRows};
use crate::format::QFormat;
use crate::isa::Isa;

trait DotU8I8 {
    /// Per 32-bit lane: Σ of the four adjacent products u8(u) · i8(s).
    ///
    /// # Safety
    /// The CPU must support the implementation's instructions (AVX2 for
    /// `Avx2`, AVX-VNNI for `AvxVnni`, AVX-512 VNNI and VL for
    /// `Avx512Vnni`); it is only called from the `#[target_feature]` entry
    /// points of that ISA, which the dispatcher enters after
    /// `Isa::supported` confirmed it.
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
}

struct Avx2;
impl DotU8I8 for Avx2 {
    /// # Safety
    /// The CPU must support AVX2 (see [`DotU8I8::dot`]).
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
    }
}

struct AvxVnni;
impl DotU8I8 for AvxVnni {
    /// # Safety
    /// The CPU must support AVX-VNNI (see [`DotU8I8::dot`]).
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s) }
    }
}

struct Avx512Vnni;
impl DotU8I8 for Avx512Vnni {
    /// # Safety
    /// The CPU must support AVX-512 VNNI and VL (see [`DotU8I8::dot`]).
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s) }
    }
}

use crate::vec::hsum256 as hsum;

/// The 32 quantized values of `a` in one register.
///
/// # Safety
/// The CPU must support AVX (true of every caller: AVX2 kernels compiled
/// for it or entered after run-time detection, into which this inlines).
#[inline(always)]
unsafe fn load_act(a: &BlockQ8) -> __m256i {
    unsafe { _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i) }
}

/// 32 nibbles of a Q4 block as u8 lanes 0..15 in element order.
///
/// # Safety
/// `qs` must point to 16 readable bytes, and the CPU must support AVX2
/// (callers are the AVX2 / VNNI kernels of this module).
#[inline(always)]
unsafe fn unpack_q4(qs: *const u8) -> __m256i {
    unsafe {
        let m4 = _mm_set1_epi8(0x0f);
        let v = _mm_loadu_si128(qs as *const __m128i);
        let lo = _mm_and_si128(v, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
        _mm256_set_m128i(hi, lo)
    }
}

// Each tile computes R weight rows × T activation rows. Every (weight row,
// activation row) pair has its own accumulators and sees the blocks in the
// same order, so its result does not depend on R or T; several pairs per
// tile only give the CPU independent FMA chains to overlap.

/// `R` Q4_1 weight rows · `T` activation rows (see [`TileFn`]).
///
/// # Safety
/// `w` must hold `R` rows of `rb` bytes, each whole 20-byte Q4_1 blocks, rows
/// `r0..r0 + T` must exist in `acts` with at least as many blocks, and the
/// CPU must support AVX2, FMA and `D`'s instructions (callers are the
/// `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q4_1_tile<D: DotU8I8, const R: usize, const T: usize>(
    w: &[u8],
    rb: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut Out,
) {
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut macc = [[0.0f32; T]; R];
        for b in 0..rb / 20 {
            for j in 0..R {
                let blk = w.as_ptr().add(j * rb + b * 20);
                let (d, m) = (f16_ptr(blk), f16_ptr(blk.add(2)));
                let wv = unpack_q4(blk.add(4));
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    let p = _mm256_cvtepi32_ps(D::dot(wv, load_act(a)));
                    acc[j][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * a.d), acc[j][t]);
                    macc[j][t] += m * a.s;
                }
            }
        }
        for j in 0..R {
            for t in 0..T {
                out[j][t] = hsum(acc[j][t]) + macc[j][t];
            }
        }
    }
}

/// `R` Q4_0 weight rows · `T` activation rows (see [`TileFn`]).
///
/// # Safety
/// `w` must hold `R` rows of `rb` bytes, each whole 18-byte Q4_0 blocks, rows
/// `r0..r0 + T` must exist in `acts` with at least as many blocks, and the
/// CPU must support AVX2, FMA and `D`'s instructions (callers are the
/// `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q4_0_tile<D: DotU8I8, const R: usize, const T: usize>(
    w: &[u8],
    rb: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut Out,
) {
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut bias = [[0.0f32; T]; R];
        for b in 0..rb / 18 {
            if b % 2 == 0 {
                // The next call's rows (R on) at this block: one line per
                // 36 bytes of each row covers all of them. Why by hand: see
                // `packed_x86::PREFETCH_AHEAD`; here Q4_0 one row from DRAM
                // (`kb`, 500000×1536, AVX-512 VNNI, 2 threads) went from
                // 9.5 to 16.5 GB/s.
                for j in 0..R {
                    let at = w.as_ptr().wrapping_add((j + R) * rb + b * 18);
                    _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
                }
            }
            for j in 0..R {
                let blk = w.as_ptr().add(j * rb + b * 18);
                let d = f16_ptr(blk);
                let wv = unpack_q4(blk.add(2));
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    let scale = d * a.d;
                    let p = _mm256_cvtepi32_ps(D::dot(wv, load_act(a)));
                    acc[j][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(scale), acc[j][t]);
                    // The −8 offset of every nibble, applied once per block.
                    bias[j][t] += (8 * a.qsum) as f32 * scale;
                }
            }
        }
        for j in 0..R {
            for t in 0..T {
                out[j][t] = hsum(acc[j][t]) - bias[j][t];
            }
        }
    }
}

/// `R` Q8_0 weight rows · `T` activation rows (see [`TileFn`]).
///
/// # Safety
/// `w` must hold `R` rows of `rb` bytes, each whole 34-byte Q8_0 blocks, rows
/// `r0..r0 + T` must exist in `acts` with at least as many blocks, and the
/// CPU must support AVX2, FMA and `D`'s instructions (callers are the
/// `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q8_0_tile<D: DotU8I8, const R: usize, const T: usize>(
    w: &[u8],
    rb: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut Out,
) {
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..rb / 34 {
            for j in 0..R {
                let blk = w.as_ptr().add(j * rb + b * 34);
                let d = f16_ptr(blk);
                let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                // u8·i8 instructions: move w's sign onto the activation.
                let wabs = _mm256_sign_epi8(wv, wv);
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    let s = _mm256_sign_epi8(load_act(a), wv);
                    let p = _mm256_cvtepi32_ps(D::dot(wabs, s));
                    acc[j][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * a.d), acc[j][t]);
                }
            }
        }
        for j in 0..R {
            for t in 0..T {
                out[j][t] = hsum(acc[j][t]);
            }
        }
    }
}

/// The little-endian f16 at `p`, as f32.
///
/// # Safety
/// `p` must point to 2 readable bytes.
#[inline(always)]
unsafe fn f16_ptr(p: *const u8) -> f32 {
    unsafe { half::f16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32() }
}

macro_rules! entry_points {
    ($name:ident, $dot:ty, $features:literal) => {
        mod $name {
            use super::*;
            macro_rules! dispatch {
                ($tile:ident, $fn_name:ident) => {
                    /// A [`TileFn`] for this ISA.
                    ///
                    /// # Safety
                    /// As for [`TileFn`]: `w` holds `r` rows of `rb`
                    /// bytes in the format, rows `r0..r0 + t` exist in
                    /// `acts`, and the CPU supports this module's target
                    /// features (checked by `Isa::supported` before the
                    /// dispatcher hands this function out).
                    #[target_feature(enable = $features)]
                    pub(super) unsafe fn $fn_name(
                        w: &[u8],
                        rb: usize,
                        r: usize,
                        acts: &QuantizedRows,
                        r0: usize,
                        t: usize,
                        out: &mut Out,
                    ) {
                        unsafe {
                            match (r, t) {
                                (4, 1) => $tile::<$dot, 4, 1>(w, rb, acts, r0, out),
                                (4, 2) => $tile::<$dot, 4, 2>(w, rb, acts, r0, out),
                                (2, 3) => $tile::<$dot, 2, 3>(w, rb, acts, r0, out),
                                (2, 4) => $tile::<$dot, 2, 4>(w, rb, acts, r0, out),
                                (_, 1) => $tile::<$dot, 1, 1>(w, rb, acts, r0, out),
                                (_, 2) => $tile::<$dot, 1, 2>(w, rb, acts, r0, out),
                                (_, 3) => $tile::<$dot, 1, 3>(w, rb, acts, r0, out),
                                _ => $tile::<$dot, 1, 4>(w, rb, acts, r0, out),
                            }
                        }
                    }
                };
            }
            dispatch!(q4_0_tile, q4_0);
            dispatch!(q4_1_tile, q4_1);
            dispatch!(q8_0_tile, q8_0);

            pub(super) fn tile_fn(fmt: QFormat) -> TileFn {
                match fmt {
                    QFormat::Q4_0 => q4_0,
                    QFormat::Q4_1 => q4_1,
                    QFormat::Q8_0 => q8_0,
                    _ => unreachable!("{fmt:?} is always packed"),
                }
            }
        }
    };
}

entry_points!(avx2, Avx2, "avx2,fma");
entry_points!(avx_vnni, AvxVnni, "avx2,fma,avxvnni");
entry_points!(
    avx512_vnni,
    Avx512Vnni,
    "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
);

pub(super) fn tile_fn(isa: Isa, fmt: QFormat) -> TileFn {
    match isa {
        Isa::Avx2 => avx2::tile_fn(fmt),
        Isa::AvxVnni => avx_vnni::tile_fn(fmt),
        Isa::Avx512Vnni | Isa::AmxInt8 => avx512_vnni::tile_fn(fmt),
        Isa::Scalar => unreachable!("scalar kernels are dispatched in dot::tile_fn"),
    }
}
