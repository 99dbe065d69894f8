//! AVX2 / VNNI kernels over 8-row packed groups (see `packed`).

// Tile loops index several parallel register arrays by the same counter.
#![allow(clippy::needless_range_loop)]

pub(crate) mod blocks32_512;
pub(crate) mod kquant;
pub(crate) mod kquant_512;

use std::arch::x86_64::*;

use crate::act::{BlockQ8, QuantizedRows};
use crate::format::QFormat;
use crate::isa::Isa;
use crate::packed::{GROUP, group_block_bytes};

/// Results of one group tile: `out[t][j]` for activation row t, group row j.
pub(crate) type GroupOut = [[f32; GROUP]; MAX_T];

/// Activation rows per tile at most (the 512-bit pair kernels; 256-bit
/// kernels take up to 4).
pub(crate) const MAX_T: usize = 8;

/// `out[t][j]` = packed row (8g + j) · activation row (r0 + t), t < `t`.
///
/// # Safety
/// `data` must be a packed matrix of `nb` blocks per row with at least g + 1
/// groups, rows r0..r0 + t must exist in `acts` with `nb` blocks, and the CPU
/// must support the ISA of the function.
pub(crate) type GroupFn = unsafe fn(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    t: usize,
    out: &mut GroupOut,
);

trait Dot4 {
    /// acc + per 32-bit lane Σ of 4 adjacent u8(u) · i8(s).
    ///
    /// # Safety
    /// The CPU must support the implementation's instructions (AVX2 for
    /// `Avx2`, AVX-VNNI for `AvxVnni`, AVX-512 VNNI and VL for
    /// `Avx512Vnni`); it is only called from the `#[target_feature]` entry
    /// points of that ISA, which the dispatcher enters after
    /// `Isa::supported` confirmed it.
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

struct Avx2;
impl Dot4 for Avx2 {
    /// # Safety
    /// The CPU must support AVX2 (see [`Dot4::acc`]).
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe {
            _mm256_add_epi32(
                acc,
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
            )
        }
    }
}

struct AvxVnni;
impl Dot4 for AvxVnni {
    /// # Safety
    /// The CPU must support AVX-VNNI (see [`Dot4::acc`]).
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

struct Avx512Vnni;
impl Dot4 for Avx512Vnni {
    /// # Safety
    /// The CPU must support AVX-512 VNNI and VL (see [`Dot4::acc`]).
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// Four activation bytes starting at `at`, broadcast to every 32-bit lane.
///
/// # Safety
/// `at + 4 <= 32` (the bytes lie inside `a.qs`), and the CPU must support
/// AVX (true of every caller: the AVX2 / VNNI kernels of this module).
#[inline(always)]
unsafe fn bcast4(a: &BlockQ8, at: usize) -> __m256i {
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(a.qs.as_ptr().add(at) as *const i32)) }
}

/// One 8-row group of packed Q4_1 rows · `T` activation rows (see
/// [`GroupFn`]).
///
/// # Safety
/// `data` must be a packed Q4_1 matrix of `nb` blocks per row with at
/// least `g + 1` groups, rows `r0..r0 + T` must exist in `acts` with `nb`
/// blocks each, and the CPU must support AVX2, FMA, F16C and `D`'s
/// instructions (callers are the `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q4_1_group<D: Dot4, const T: usize>(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut GroupOut,
) {
    const GBB: usize = group_block_bytes(QFormat::Q4_1);
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let base = data.as_ptr().add(g * nb * GBB);
        let m4 = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); T];
        let mut macc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let gb = base.add(b * GBB);
            // Past the group's end this runs into the next group: the next
            // call's.
            prefetch_block::<GBB>(gb, blocks_ahead(GBB));
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
            let mv = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(16) as *const __m128i));
            let mut isum = [_mm256_setzero_si256(); T];
            for c in 0..4 {
                let w = _mm256_loadu_si256(gb.add(32 + 32 * c) as *const __m256i);
                let lo = _mm256_and_si256(w, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    isum[t] = D::acc(isum[t], lo, bcast4(a, 4 * c));
                    isum[t] = D::acc(isum[t], hi, bcast4(a, 16 + 4 * c));
                }
            }
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(a.d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, acc[t]);
                macc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a.s), macc[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_add_ps(acc[t], macc[t]));
        }
    }
}

/// One 8-row group of packed Q8_0 rows · `T` activation rows (see
/// [`GroupFn`]).
///
/// # Safety
/// `data` must be a packed Q8_0 matrix of `nb` blocks per row with at
/// least `g + 1` groups, rows `r0..r0 + T` must exist in `acts` with `nb`
/// blocks each, and the CPU must support AVX2, FMA, F16C and `D`'s
/// instructions (callers are the `#[target_feature]` entry points below).
#[inline(always)]
unsafe fn q8_0_group<D: Dot4, const T: usize>(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    out: &mut GroupOut,
) {
    const GBB: usize = group_block_bytes(QFormat::Q8_0);
    unsafe {
        let rows: [&[BlockQ8]; T] = std::array::from_fn(|t| acts.row(r0 + t));
        let base = data.as_ptr().add(g * nb * GBB);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let gb = base.add(b * GBB);
            prefetch_block::<GBB>(gb, blocks_ahead(GBB));
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
            let mut isum = [_mm256_setzero_si256(); T];
            for c in 0..8 {
                let w = _mm256_loadu_si256(gb.add(16 + 32 * c) as *const __m256i);
                // u8·i8 instructions: |w| against the activation with w's sign.
                let wabs = _mm256_sign_epi8(w, w);
                for t in 0..T {
                    let a = rows[t].get_unchecked(b);
                    isum[t] = D::acc(isum[t], wabs, _mm256_sign_epi8(bcast4(a, 4 * c), w));
                }
            }
            for t in 0..T {
                let a = rows[t].get_unchecked(b);
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(a.d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, acc[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
        }
    }
}

/// The one way a packed kernel becomes a [`GroupFn`] or a [`PairFn`]:
///
/// - `entry!(group kernel [lead..], name, "features")` defines `name`, a
///   `GroupFn` running `kernel::<lead.., T>` for `T` = 1..=4 activation
///   rows (more rows come in calls of 4) under the target features given;
/// - `entry!(pair kernel [lead..], name)` defines `name`, a `PairFn`
///   running `kernel::<lead.., T>` for `T` = 1..=8 on AVX-512 VNNI.
///
/// `lead` are the kernel's own const or type parameters before `T`
/// (`[Avx2]`, `[false]`, or `[]`).
macro_rules! entry {
    (group $kernel:ident $lead:tt, $name:ident, $features:literal) => {
        $crate::packed::x86::entry!(
            @fn $kernel $lead, $name, $features, $crate::packed::x86::GroupOut, 4, 1 2 3
        );
    };
    (pair $kernel:ident $lead:tt, $name:ident) => {
        $crate::packed::x86::entry!(
            @fn $kernel $lead, $name,
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
            [$crate::packed::x86::GroupOut; 2], 8, 1 2 3 4 5 6 7
        );
    };
    (@fn $kernel:ident $lead:tt, $name:ident, $features:literal, $out:ty, $most:literal,
     $($n:literal)*) => {
        /// A [`GroupFn`](crate::packed::x86::GroupFn) or
        /// [`PairFn`](crate::packed::x86::PairFn), as its `out` says.
        ///
        /// # Safety
        /// As for those types: `data` is a packed matrix of `nb` blocks (or
        /// super-blocks) per row holding group `g` (and `g + 1` for a
        /// pair), rows `r0..r0 + t` exist in `acts` in the format's
        /// activation layout, and the CPU supports the target features
        /// (checked by `Isa::supported` before the dispatcher hands this
        /// function out).
        #[target_feature(enable = $features)]
        unsafe fn $name(
            data: &[u8],
            nb: usize,
            g: usize,
            acts: &$crate::act::QuantizedRows,
            r0: usize,
            t: usize,
            out: &mut $out,
        ) {
            unsafe {
                match t {
                    $($n => $crate::packed::x86::entry!(
                        @call $kernel $lead, $n, (data, nb, g, acts, r0, out)
                    ),)*
                    _ => $crate::packed::x86::entry!(
                        @call $kernel $lead, $most, (data, nb, g, acts, r0, out)
                    ),
                }
            }
        }
    };
    (@call $kernel:ident [$($lead:tt),*], $n:literal, ($($arg:expr),*)) => {
        $kernel::<$($lead,)* $n>($($arg),*)
    };
}
// Every packed x86 kernel module enters through it.
pub(crate) use entry;

/// The Q4_1 and Q8_0 group kernels of one instruction set, and their
/// dispatcher.
macro_rules! entry_points {
    ($name:ident, $dot:ident, $features:literal) => {
        mod $name {
            use super::*;
            entry!(group q4_1_group [$dot], q4_1, $features);
            entry!(group q8_0_group [$dot], q8_0, $features);

            pub(super) fn group_fn(fmt: QFormat) -> GroupFn {
                match fmt {
                    QFormat::Q4_1 => q4_1,
                    QFormat::Q8_0 => q8_0,
                    _ => unreachable!("{fmt:?} has no kernel here"),
                }
            }
        }
    };
}

entry_points!(avx2, Avx2, "avx2,fma,f16c");
entry_points!(avx_vnni, AvxVnni, "avx2,fma,f16c,avxvnni");
entry_points!(
    avx512_vnni,
    Avx512Vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// The packed kernel for Q4_1 or Q8_0 on `isa` (not `Scalar`).
pub(crate) fn group_fn(isa: Isa, fmt: QFormat) -> GroupFn {
    match isa {
        Isa::Avx2 => avx2::group_fn(fmt),
        Isa::AvxVnni => avx_vnni::group_fn(fmt),
        Isa::Avx512Vnni | Isa::AmxInt8 => avx512_vnni::group_fn(fmt),
        Isa::Scalar => unreachable!("scalar packed kernels are dispatched by the caller"),
    }
}

/// Like [`GroupFn`] for two adjacent groups g and g + 1 at once (16 rows
/// in 512-bit registers). Per lane the operations are those of the 256-bit
/// kernels, so results are bit-identical to two single-group calls.
///
/// # Safety
/// `data` must be a packed matrix of `nb` blocks per row with at least
/// g + 2 groups, rows r0..r0 + t must exist in `acts` with `nb` blocks, and
/// the CPU must support AVX-512 VNNI (with F, BW and VL).
pub(crate) type PairFn = unsafe fn(
    data: &[u8],
    nb: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    t: usize,
    out: &mut [GroupOut; 2],
);

/// Two 32-byte chunks at `a` and `b` in one 512-bit register.
///
/// # Safety
/// `a` and `b` must each point to 32 readable bytes, and the CPU must
/// support AVX-512F (callers are the AVX-512 VNNI pair and AMX kernels).
#[inline(always)]
pub(crate) unsafe fn load_pair(a: *const u8, b: *const u8) -> __m512i {
    unsafe {
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(a as *const __m256i)),
            _mm256_loadu_si256(b as *const __m256i),
            1,
        )
    }
}

/// How far ahead of the super-block being computed the K-quant kernels ask
/// for weight bytes, in super-blocks of a group.
///
/// Why prefetch by hand: a model's weights stream from DRAM, and the
/// hardware prefetchers alone (they stop at every 4 KiB page) left the
/// one-row kernels at 24 GB/s where a plain read gets ~30: `kb` on a 345 MB
/// Q4_K matrix, AVX-512 VNNI, 2 threads: 24.5 GB/s without, 36.5 GB/s with
/// (docs/lab/kernels.md has the whole-model numbers).
pub(crate) const PREFETCH_AHEAD: usize = 2;

/// Asks for the weight bytes `ahead` group-blocks after `p`: the `step`-th
/// of eight slices of a group-block of `GBB` bytes. The kernels call it
/// once per sub-block (or 32-input record), so a super-block's lines are
/// requested spread over its compute.
///
/// # Safety
/// None beyond x86-64's SSE: a prefetch never faults, and the address is
/// formed with wrapping arithmetic (it may lie past the matrix).
#[inline(always)]
pub(crate) unsafe fn prefetch_slice<const GBB: usize>(p: *const u8, ahead: usize, step: usize) {
    let lines = GBB.div_ceil(8 * 64);
    let at = p.wrapping_add(ahead * GBB + step * lines * 64);
    for l in 0..lines {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * l) as *const i8) };
    }
}

/// How far ahead the 32-input-block kernels (Q4_0, Q4_1, Q5_0, Q8_0:
/// group-blocks of `gbb` bytes) ask for weights, in blocks: about as far as the K-quant
/// kernels ([`PREFETCH_AHEAD`] Q4_K super-blocks, 2.4 KB per group).
///
/// Measured with `kb` on 500000×1536 matrices (from DRAM), AVX-512 VNNI,
/// 2 threads, before / after: Q4_1 one row 26.0 / 34.0 GB/s, 8 rows 218 /
/// 335 GMAC/s; Q8_0 one row 27.8 / 31.5 GB/s, 8 rows 147 / 201 GMAC/s; no
/// change on matrices held in cache (docs/performance.md).
pub(crate) const fn blocks_ahead(gbb: usize) -> usize {
    (PREFETCH_AHEAD * crate::packed::kquant::Q4_K_GBB).div_ceil(gbb)
}

/// [`blocks_ahead`] from block `b` of one of a pair's groups of `nb`
/// blocks: while the group lasts, then the same distance into the group two
/// on (the thread's next pair; see `packed_kquant_512::pair_ahead`).
#[inline(always)]
pub(crate) fn pair_blocks_ahead<const GBB: usize>(b: usize, nb: usize) -> usize {
    let ahead = blocks_ahead(GBB);
    if b + ahead < nb { ahead } else { ahead + nb }
}

/// Asks for the `GBB` bytes of the group-block `ahead` blocks after `p`.
///
/// # Safety
/// As for [`prefetch_slice`].
#[inline(always)]
pub(crate) unsafe fn prefetch_block<const GBB: usize>(p: *const u8, ahead: usize) {
    let at = p.wrapping_add(ahead * GBB);
    for l in 0..GBB.div_ceil(64) {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * l) as *const i8) };
    }
}

/// Sixteen f16 (8 at `a`, 8 at `b`) as f32.
///
/// # Safety
/// `a` and `b` must each point to 16 readable bytes, and the CPU must
/// support AVX-512F (callers are the AVX-512 VNNI pair and AMX kernels).
#[inline(always)]
pub(crate) unsafe fn halves_pair(a: *const u8, b: *const u8) -> __m512 {
    unsafe {
        _mm512_cvtph_ps(_mm256_set_m128i(
            _mm_loadu_si128(b as *const __m128i),
            _mm_loadu_si128(a as *const __m128i),
        ))
    }
}

/// Row `t` of a two-group result: lanes 0–7 to group g, 8–15 to g + 1.
///
/// # Safety
/// The CPU must support AVX-512F (callers are the AVX-512 VNNI pair and
/// AMX kernels); `t < R` is bounds-checked.
#[inline(always)]
pub(crate) unsafe fn store_pair<const R: usize>(
    v: __m512,
    out: &mut [[[f32; GROUP]; R]; 2],
    t: usize,
) {
    unsafe {
        _mm256_storeu_ps(out[0][t].as_mut_ptr(), _mm512_castps512_ps256(v));
        _mm256_storeu_ps(
            out[1][t].as_mut_ptr(),
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
        );
    }
}
