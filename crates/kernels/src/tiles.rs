//! The AMX tile operations the tile kernels use, behind one trait with two
//! implementations: [`Amx`], the instructions themselves, and `Emulated`,
//! the same operations in plain Rust.
//!
//! Why an emulation: a tile kernel's hard part is its data layout (which
//! bytes land in which tile row, which sums come back where), and that is
//! the same whoever executes the tile operations. The kernels are generic
//! over [`TileUnit`], so the tests run every kernel on `Emulated` tiles on
//! any AVX-512 machine and compare it bit for bit with the VNNI kernels;
//! on a CPU with AMX the same tests run the instructions too. `Emulated`
//! also checks what the hardware would fault on (tile shapes that do not
//! fit together), so a wrong configuration fails a test rather than a
//! process on an AMX host.
//!
//! Tiles (palette 1) come in two sets, so that consecutive products do not
//! wait on each other's registers: set s uses tmm(s) for activations
//! (t rows × `a_bytes` i8), tmm(2 + s) for weights (`a_bytes / 4` rows of
//! 4 inputs × 16 output rows, 64 bytes) and tmm(4 + s) for the sums
//! (t rows × 16 i32).

use std::arch::asm;

use crate::act::QuantizedRows;
use crate::packed::GROUP;

/// Rows of a tile at most (activation rows one tile product takes).
pub(crate) const MAX_ROWS: usize = 16;

/// Bytes per weight-tile and sum-tile row (16 output rows × 4 bytes).
pub(crate) const ROW_BYTES: usize = 64;

/// Activation rows per tile call at most (a tile has 16 rows).
pub(crate) const MAX_T: usize = MAX_ROWS;

/// Results for one pair of groups: `out[s][t][j]` for group g + s,
/// activation row t and group row j.
pub(crate) type PairOut = [[[f32; GROUP]; MAX_T]; 2];

/// Computes the pairs of groups (g0 + 2i, g0 + 2i + 1), i < `pairs`, against
/// activation rows r0..r0 + t (t ≤ 16) and hands each pair's results to
/// `emit(g, out)`.
///
/// # Safety
/// `data` must be a packed matrix of `nb` blocks per row holding those
/// groups, rows r0..r0 + t must exist in `acts` with `nb` blocks, the CPU
/// must support AVX-512 VNNI, BW and VL, and the kernel's tile unit must
/// run here (the AMX one: `Isa::AmxInt8.supported()`; the emulated one of
/// the tests needs nothing more).
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

/// `$kernel::<_, lead.., t>(args)` for a run-time t in 1..=16.
macro_rules! by_rows {
    ($t:expr, $kernel:ident $lead:tt, $args:tt, $($n:literal)*) => {
        match $t {
            $($n => $crate::tiles::by_rows!(@call $kernel $lead, $n, $args),)*
            _ => unreachable!("tile calls take 1..=16 rows"),
        }
    };
    (@call $kernel:ident [$($lead:tt),*], $n:literal, ($($arg:expr),*)) => {
        $kernel::<_, $($lead,)* $n>($($arg),*)
    };
}
pub(crate) use by_rows;

/// Defines `$name`, an [`AmxPairsFn`] running `$kernel::<_, lead.., t>`
/// on tile unit `$unit` (the hardware one, or the emulation of the tests).
macro_rules! tile_entry {
    ($name:ident, $kernel:ident $lead:tt, $unit:expr) => {
        /// An [`AmxPairsFn`](crate::tiles::AmxPairsFn).
        ///
        /// # Safety
        /// As for `AmxPairsFn`: `data` is a packed matrix of the kernel's
        /// format with `nb` blocks (or super-blocks) per row holding the
        /// groups, rows `r0..r0 + t` (`t` in 1..=16) exist in `acts`, and
        /// the tile unit may run (the dispatcher picks the hardware one
        /// only for a supported `Isa::AmxInt8`).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $name(
            data: &[u8],
            nb: usize,
            g0: usize,
            npairs: usize,
            acts: &$crate::act::QuantizedRows,
            r0: usize,
            t: usize,
            emit: &mut dyn FnMut(usize, &$crate::tiles::PairOut),
        ) {
            let mut unit = $unit;
            unsafe {
                $crate::tiles::by_rows!(
                    t, $kernel $lead, (&mut unit, data, nb, g0, npairs, acts, r0, emit),
                    1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16
                )
            }
        }
    };
}
pub(crate) use tile_entry;

/// The signedness of the weight bytes in a product (activations are
/// always signed i8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Weights {
    /// `tdpbsud`: unsigned weight bytes (Q4_1 nibbles, K-quant values).
    Unsigned,
    /// `tdpbssd`: signed weight bytes (Q8_0).
    Signed,
}

/// The 64-byte tile configuration for `t` activation rows of `a_bytes`
/// inputs per product (4..=64, a multiple of 4), both tile sets alike.
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

impl TileConfig {
    pub(crate) fn new(t: usize, a_bytes: usize) -> TileConfig {
        assert!(
            (1..=MAX_ROWS).contains(&t),
            "a tile takes 1..=16 rows, got {t}"
        );
        assert!(
            a_bytes.is_multiple_of(4) && (4..=64).contains(&a_bytes),
            "a tile row takes 4..=64 bytes in steps of 4, got {a_bytes}"
        );
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        for set in 0..2 {
            // (tile, rows, bytes per row)
            for (i, rows, colsb) in [
                (set, t, a_bytes),
                (2 + set, a_bytes / 4, ROW_BYTES),
                (4 + set, t, ROW_BYTES),
            ] {
                c[16 + 2 * i..18 + 2 * i].copy_from_slice(&(colsb as u16).to_le_bytes());
                c[48 + i] = rows as u8;
            }
        }
        TileConfig(c)
    }

    /// (rows, bytes per row) of tile `i`.
    #[cfg(test)]
    fn shape(&self, i: usize) -> (usize, usize) {
        let colsb = u16::from_le_bytes([self.0[16 + 2 * i], self.0[17 + 2 * i]]);
        (self.0[48 + i] as usize, colsb as usize)
    }
}

/// The tile operations of the kernels.
///
/// # Safety
/// Implementations may execute AMX instructions: callers must hold what
/// each method states, and for [`Amx`] the CPU must have AMX-INT8 enabled
/// for this process (`Isa::AmxInt8.supported()`).
pub(crate) unsafe trait TileUnit {
    /// Loads a tile configuration (`ldtilecfg`).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn configure(&mut self, cfg: &TileConfig);

    /// Sums tile of set `set` = activations × weights: loads the
    /// activation tile from `a` (its rows `a_stride` bytes apart) and the
    /// weight tile from `w` (rows 64 bytes apart), zeroes the sums and
    /// multiplies into them.
    ///
    /// # Safety
    /// [`TileUnit::configure`] has run on this thread; `a` points to the
    /// configured rows of `a_bytes` readable bytes, `w` to `a_bytes / 4`
    /// readable rows of 64 bytes; `set < 2`.
    unsafe fn product(
        &mut self,
        set: usize,
        weights: Weights,
        a: *const i8,
        a_stride: usize,
        w: *const u8,
    );

    /// Stores the sums tile of set `set` (the configured rows of 16 i32)
    /// to `c`, rows 64 bytes apart.
    ///
    /// # Safety
    /// As for [`TileUnit::product`]; `c` is writable for those rows.
    unsafe fn store(&mut self, set: usize, c: *mut i32);

    /// Releases the tile state (`tilerelease`).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn release(&mut self);
}

/// The AMX-INT8 instructions.
pub(crate) struct Amx;

/// Starts the tile product of one block on tile set (`$ta`, `$tw`, `$tc`).
macro_rules! product_on {
    ($op:literal, $ta:literal, $tw:literal, $tc:literal, $a:expr, $sa:expr, $w:expr) => {
        asm!(
            concat!("tileloadd tmm", $ta, ", [{a} + {sa}*1]"),
            concat!("tileloadd tmm", $tw, ", [{w} + {s64}*1]"),
            concat!("tilezero tmm", $tc),
            concat!($op, " tmm", $tc, ", tmm", $ta, ", tmm", $tw),
            a = in(reg) $a, sa = in(reg) $sa, w = in(reg) $w, s64 = in(reg) ROW_BYTES,
            options(nostack, readonly),
        )
    };
}

/// Stores tile `$tc`'s sums to `$c`.
macro_rules! store_from {
    ($tc:literal, $c:expr) => {
        asm!(
            concat!("tilestored [{c} + {s64}*1], tmm", $tc),
            c = in(reg) $c, s64 = in(reg) ROW_BYTES,
            options(nostack),
        )
    };
}

// SAFETY: each method is the instruction sequence its contract describes;
// callers hold the contracts (and that AMX is enabled).
unsafe impl TileUnit for Amx {
    #[inline(always)]
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) }
    }

    #[inline(always)]
    unsafe fn product(
        &mut self,
        set: usize,
        weights: Weights,
        a: *const i8,
        a_stride: usize,
        w: *const u8,
    ) {
        unsafe {
            match (set, weights) {
                (0, Weights::Unsigned) => product_on!("tdpbsud", "0", "2", "4", a, a_stride, w),
                (_, Weights::Unsigned) => product_on!("tdpbsud", "1", "3", "5", a, a_stride, w),
                (0, Weights::Signed) => product_on!("tdpbssd", "0", "2", "4", a, a_stride, w),
                (_, Weights::Signed) => product_on!("tdpbssd", "1", "3", "5", a, a_stride, w),
            }
        }
    }

    #[inline(always)]
    unsafe fn store(&mut self, set: usize, c: *mut i32) {
        unsafe {
            match set {
                0 => store_from!("4", c),
                _ => store_from!("5", c),
            }
        }
    }

    #[inline(always)]
    unsafe fn release(&mut self) {
        unsafe { asm!("tilerelease", options(nostack, nomem)) }
    }
}

/// The tile operations in plain Rust, with the checks the hardware makes.
#[cfg(test)]
pub(crate) struct Emulated {
    cfg: Option<TileConfig>,
    /// Tiles 0..6, each up to 16 rows × 64 bytes.
    regs: [[[u8; 64]; MAX_ROWS]; 6],
}

#[cfg(test)]
impl Emulated {
    pub(crate) fn new() -> Emulated {
        Emulated {
            cfg: None,
            regs: [[[0; 64]; MAX_ROWS]; 6],
        }
    }

    fn shape(&self, i: usize) -> (usize, usize) {
        self.cfg
            .as_ref()
            .expect("tile operation before ldtilecfg")
            .shape(i)
    }
}

// SAFETY: reads and writes exactly the bytes the contracts name.
#[cfg(test)]
unsafe impl TileUnit for Emulated {
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        self.cfg = Some(TileConfig(cfg.0));
    }

    unsafe fn product(
        &mut self,
        set: usize,
        weights: Weights,
        a: *const i8,
        a_stride: usize,
        w: *const u8,
    ) {
        assert!(set < 2, "two tile sets");
        let (ta, tw, tc) = (set, 2 + set, 4 + set);
        let ((ar, ab), (wr, wb), (cr, cb)) = (self.shape(ta), self.shape(tw), self.shape(tc));
        // What `tdpb*d` raises #UD for: shapes that do not chain.
        assert_eq!(ar, cr, "activation and sum tiles must have the same rows");
        assert_eq!(ab, 4 * wr, "activation bytes must be 4 × weight-tile rows");
        assert_eq!(wb, cb, "weight and sum tiles must have the same row bytes");
        for r in 0..ar {
            // SAFETY: the caller guarantees `ab` readable bytes per row.
            let src = unsafe { std::slice::from_raw_parts(a.add(r * a_stride) as *const u8, ab) };
            self.regs[ta][r][..ab].copy_from_slice(src);
        }
        for r in 0..wr {
            // SAFETY: as above, `wb` bytes per 64-byte row.
            let src = unsafe { std::slice::from_raw_parts(w.add(r * ROW_BYTES), wb) };
            self.regs[tw][r][..wb].copy_from_slice(src);
        }
        for m in 0..cr {
            for n in 0..cb / 4 {
                let mut sum = 0i32;
                for k in 0..wr {
                    for e in 0..4 {
                        let x = self.regs[ta][m][4 * k + e] as i8 as i32;
                        let y = self.regs[tw][k][4 * n + e];
                        let y = match weights {
                            Weights::Unsigned => y as i32,
                            Weights::Signed => y as i8 as i32,
                        };
                        sum = sum.wrapping_add(x * y);
                    }
                }
                self.regs[tc][m][4 * n..4 * n + 4].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }

    unsafe fn store(&mut self, set: usize, c: *mut i32) {
        assert!(set < 2, "two tile sets");
        let (rows, bytes) = self.shape(4 + set);
        for r in 0..rows {
            // SAFETY: the caller guarantees the rows are writable.
            let dst = unsafe { std::slice::from_raw_parts_mut((c as *mut u8).add(r * 64), bytes) };
            dst.copy_from_slice(&self.regs[4 + set][r][..bytes]);
        }
    }

    unsafe fn release(&mut self) {
        self.cfg = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emulated_product_is_the_integer_matrix_product() {
        // 3 activation rows × 8 inputs against 16 columns, unsigned and
        // signed weights, checked against a plain triple loop.
        let a: Vec<i8> = (0..3 * 8).map(|i| (i * 37 % 255) as i8).collect();
        let w: Vec<u8> = (0..2 * 64).map(|i| (i * 91 % 256) as u8).collect();
        for weights in [Weights::Unsigned, Weights::Signed] {
            let mut unit = Emulated::new();
            let mut c = [[0i32; 16]; 3];
            // SAFETY: the buffers hold the configured shapes.
            unsafe {
                unit.configure(&TileConfig::new(3, 8));
                unit.product(1, weights, a.as_ptr(), 8, w.as_ptr());
                unit.store(1, c.as_mut_ptr() as *mut i32);
            }
            for m in 0..3 {
                for n in 0..16 {
                    let want: i32 = (0..8)
                        .map(|i| {
                            let y = w[(i / 4) * 64 + 4 * n + i % 4];
                            let y = match weights {
                                Weights::Unsigned => y as i32,
                                Weights::Signed => y as i8 as i32,
                            };
                            a[8 * m + i] as i32 * y
                        })
                        .sum();
                    assert_eq!(c[m][n], want, "{weights:?} m={m} n={n}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "4 × weight-tile rows")]
    fn shapes_that_do_not_chain_are_refused() {
        let mut unit = Emulated::new();
        let mut cfg = TileConfig::new(2, 32);
        cfg.0[48 + 2] = 4; // weight tile of set 0: 4 rows where 8 belong
        let (a, w) = ([0i8; 64], [0u8; 512]);
        // SAFETY: the buffers are large enough for any shape here.
        unsafe {
            unit.configure(&cfg);
            unit.product(0, Weights::Unsigned, a.as_ptr(), 32, w.as_ptr());
        }
    }
}
