//! Which matmul calls the AMX tile kernels take, measured once per process.
//!
//! Why measured rather than fixed: whether a tile product beats
//! `vpdpbusd` depends on the format (Q4_1 and Q8_0 need a float step per
//! 32 inputs, which bounds their tile kernels; the K-quants one per 256),
//! on the rows per call (one row is bound by weight reads either way) and
//! on the CPU. So, at first use (model loaders ask at load, beside the
//! verify cost curve), every format with a tile kernel runs both kernels on
//! a matrix held in cache, for 1..=16 rows per call, and the tiles take the
//! row counts where they were at least [`MIN_GAIN`] faster.
//!
//! The same run compares the two kernels' results bit for bit. A format
//! whose tile results differ gets no tiles, and the plan says so: batch
//! invariance (the same bits whatever kernel a row lands on) is what greedy
//! exactness rests on, and a plan that only trusted the tests would stake
//! it on hardware the tests may never have run on.

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::act::QuantizedRows;
use crate::format::QFormat;
use crate::isa::Isa;

/// How much faster tiles must be for a row count to go to them.
pub const MIN_GAIN: f64 = 0.05;

/// A set of activation-row counts per kernel call, 1..=[`RowSet::MAX_ROWS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowSet(u32);

impl RowSet {
    /// Rows one tile call takes at most.
    pub const MAX_ROWS: usize = 16;
    pub const EMPTY: RowSet = RowSet(0);

    /// Every row count from `from` to [`RowSet::MAX_ROWS`].
    pub fn from(from: usize) -> RowSet {
        let mut set = RowSet::EMPTY;
        for t in from.max(1)..=RowSet::MAX_ROWS {
            set.insert(t);
        }
        set
    }

    pub fn contains(self, t: usize) -> bool {
        (1..=RowSet::MAX_ROWS).contains(&t) && self.0 >> t & 1 == 1
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub(crate) fn insert(&mut self, t: usize) {
        assert!((1..=RowSet::MAX_ROWS).contains(&t), "row counts are 1..=16");
        self.0 |= 1 << t;
    }
}

/// Runs of consecutive counts: `none`, `2-16`, `1, 4-16`.
impl fmt::Display for RowSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let mut first = true;
        let mut t = 1;
        while t <= RowSet::MAX_ROWS {
            if !self.contains(t) {
                t += 1;
                continue;
            }
            let start = t;
            while t < RowSet::MAX_ROWS && self.contains(t + 1) {
                t += 1;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            if start == t {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{t}")?;
            }
            t += 1;
        }
        Ok(())
    }
}

/// Which calls of one matmul go to which tile kernel.
///
/// Invariant: `kernel` may run on this CPU. The hardware kernels come only
/// from [`TileCalls::hardware`], which checks that AMX-INT8 runs; the
/// tests put the kernels on emulated tiles here (AVX-512 VNNI only).
#[derive(Clone, Copy)]
pub(crate) struct TileCalls {
    pub(crate) rows: RowSet,
    #[cfg(target_arch = "x86_64")]
    pub(crate) kernel: Option<crate::tiles::AmxPairsFn>,
}

impl TileCalls {
    pub(crate) const NONE: TileCalls = TileCalls {
        rows: RowSet::EMPTY,
        #[cfg(target_arch = "x86_64")]
        kernel: None,
    };

    /// `format`'s AMX kernel for calls of `rows` rows; none unless AMX-INT8
    /// runs here and the format has a tile kernel.
    pub(crate) fn hardware(format: QFormat, rows: RowSet) -> TileCalls {
        if rows.is_empty() || !Isa::AmxInt8.supported() {
            return TileCalls::NONE;
        }
        TileCalls {
            rows,
            #[cfg(target_arch = "x86_64")]
            kernel: pairs_fn(format),
        }
    }
}

/// What was measured for one format.
#[derive(Clone, Debug)]
pub struct FormatPlan {
    pub format: QFormat,
    /// The row counts whose calls go to tiles.
    pub tiles: RowSet,
    /// Tile time / VNNI time per row count (index t, 1..=16; index 0 unused).
    pub ratio: [f64; RowSet::MAX_ROWS + 1],
    /// The tile kernel's results differed from VNNI's: no tiles.
    pub mismatch: bool,
}

/// The tile choice of every format with a tile kernel; empty where AMX-INT8
/// is missing.
#[derive(Clone, Debug, Default)]
pub struct TilePlan {
    pub formats: Vec<FormatPlan>,
}

impl TilePlan {
    /// The row counts whose calls on `format` go to tiles.
    pub fn rows(&self, format: QFormat) -> RowSet {
        self.formats
            .iter()
            .find(|p| p.format == format)
            .map_or(RowSet::EMPTY, |p| p.tiles)
    }
}

/// `Q4_K tiles for 2-16 rows, Q8_0 none, Q4_1 refused (results differed
/// from VNNI)`.
impl fmt::Display for TilePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.formats.is_empty() {
            return f.write_str("no AMX tiles");
        }
        for (i, p) in self.formats.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if p.mismatch {
                write!(f, "{:?} refused (results differed from VNNI)", p.format)?;
            } else if p.tiles.is_empty() {
                write!(f, "{:?} none", p.format)?;
            } else {
                write!(f, "{:?} tiles for {} rows", p.format, p.tiles)?;
            }
        }
        Ok(())
    }
}

/// The process's plan: measured on first call where `Isa::AmxInt8` is
/// supported (tens of milliseconds), empty elsewhere.
pub fn tile_plan() -> &'static TilePlan {
    static PLAN: OnceLock<TilePlan> = OnceLock::new();
    PLAN.get_or_init(|| {
        if Isa::AmxInt8.supported() {
            measure()
        } else {
            TilePlan::default()
        }
    })
}

/// The AMX tile kernel of `format`, if it has one.
#[cfg(target_arch = "x86_64")]
fn pairs_fn(format: QFormat) -> Option<crate::tiles::AmxPairsFn> {
    match format {
        QFormat::Q4_1 => Some(crate::packed::amx::q4_1_pairs),
        QFormat::Q8_0 => Some(crate::packed::amx::q8_0_pairs),
        QFormat::Q4_K => Some(crate::packed::amx::kquant::q4_k_pairs_amx),
        QFormat::Q6_K => Some(crate::packed::amx::kquant::q6_k_pairs_amx),
        _ => None,
    }
}

fn measure() -> TilePlan {
    #[cfg(target_arch = "x86_64")]
    {
        let formats = [QFormat::Q4_K, QFormat::Q6_K, QFormat::Q4_1, QFormat::Q8_0];
        TilePlan {
            formats: formats
                .into_iter()
                .filter_map(|f| Some(measure_format(f, pairs_fn(f)?)))
                .collect(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    TilePlan::default()
}

/// Output rows and inputs of the measured matrix: 256 rows of 2048 inputs
/// (~0.3–0.5 MB for these formats), in cache like a verify call's weights
/// are for its rows after the first.
const ROWS: usize = 256;
const COLS: usize = 2048;
/// Calls per timing, and timings per kernel (the fastest counts).
const CALLS: usize = 4;
const ROUNDS: usize = 3;

/// Times `format`'s AVX-512 VNNI pair kernel against the tile kernel
/// `tiles` at 1..=16 rows per call, one thread, over all pairs of groups
/// of a synthetic matrix, and compares their bits. (Kernel calls, not
/// `QMatrix::forward`: the matmul asks this plan which kernel to use.)
#[cfg(target_arch = "x86_64")]
fn measure_format(format: QFormat, tiles: crate::tiles::AmxPairsFn) -> FormatPlan {
    use crate::packed::GROUP;
    let vnni = crate::packed::x86::kquant_512::pair_fn(Isa::Avx512Vnni, format)
        .or_else(|| crate::packed::x86::blocks32_512::pair_fn(Isa::Avx512Vnni, format))
        .expect("every format with a tile kernel has a VNNI pair kernel");
    let (data, acts) = synthetic_call(format, (ROWS, COLS), RowSet::MAX_ROWS, 0x5eed);
    let (nb, pairs) = (COLS / format.block_len(), ROWS / GROUP / 2);
    let mut plan = FormatPlan {
        format,
        tiles: RowSet::EMPTY,
        ratio: [f64::NAN; RowSet::MAX_ROWS + 1],
        mismatch: false,
    };
    for t in 1..=RowSet::MAX_ROWS {
        // out[r · ROWS + feature], as the matmul lays results out.
        let mut on_vnni = vec![0.0f32; t * ROWS];
        let mut on_tiles = vec![f32::NAN; t * ROWS];
        let run_vnni = |out: &mut [f32]| {
            let mut tmp = [[[0.0f32; GROUP]; 8]; 2];
            for g in (0..2 * pairs).step_by(2) {
                let mut r = 0;
                while r < t {
                    let tt = (t - r).min(8);
                    // SAFETY: groups g, g + 1 and rows r..r + tt exist, and
                    // the caller only measures where AVX-512 VNNI runs.
                    unsafe { vnni(&data, nb, g, &acts, r, tt, &mut tmp) };
                    for (s, res) in tmp.iter().enumerate() {
                        for (i, row) in res.iter().enumerate().take(tt) {
                            let at = (r + i) * ROWS + (g + s) * GROUP;
                            out[at..at + GROUP].copy_from_slice(row);
                        }
                    }
                    r += tt;
                }
            }
        };
        let run_tiles = |out: &mut [f32]| {
            let mut emit = |g: usize, res: &crate::tiles::PairOut| {
                for (s, res) in res.iter().enumerate() {
                    for (i, row) in res.iter().enumerate().take(t) {
                        let at = i * ROWS + (g + s) * GROUP;
                        out[at..at + GROUP].copy_from_slice(row);
                    }
                }
            };
            // SAFETY: as above, and `tiles` may run here (the caller's).
            unsafe { tiles(&data, nb, 0, pairs, &acts, 0, t, &mut emit) };
        };
        let (mut vnni_time, mut tile_time) = (Duration::MAX, Duration::MAX);
        for _ in 0..ROUNDS {
            let start = Instant::now();
            for _ in 0..CALLS {
                run_vnni(&mut on_vnni);
            }
            vnni_time = vnni_time.min(start.elapsed());
            let start = Instant::now();
            for _ in 0..CALLS {
                run_tiles(&mut on_tiles);
            }
            tile_time = tile_time.min(start.elapsed());
        }
        if on_vnni
            .iter()
            .map(|v| v.to_bits())
            .ne(on_tiles.iter().map(|v| v.to_bits()))
        {
            plan.mismatch = true;
        }
        let ratio = tile_time.as_secs_f64() / vnni_time.as_secs_f64().max(1e-12);
        plan.ratio[t] = ratio;
        if ratio < 1.0 - MIN_GAIN {
            plan.tiles.insert(t);
        }
    }
    if plan.mismatch {
        plan.tiles = RowSet::EMPTY;
    }
    plan
}

/// A small deterministic generator for the synthetic weights (`rand` is a
/// test dependency only).
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A packed synthetic `rows × cols` matrix of `format` and `acts` random
/// activation rows quantized for it: what the kernel plans time.
pub(crate) fn synthetic_call(
    format: QFormat,
    (rows, cols): (usize, usize),
    acts: usize,
    seed: u64,
) -> (Vec<u8>, QuantizedRows) {
    let mut rng = SplitMix(seed ^ format as u64);
    let data = crate::packed::pack(
        format,
        rows,
        cols,
        &synthetic_rows(format, rows, cols, &mut rng),
    );
    let x: Vec<f32> = (0..acts * cols)
        .map(|_| (rng.next() % 4001) as f32 / 1000.0 - 2.0)
        .collect();
    let mut q = QuantizedRows::default();
    if format.super_block_activations() {
        q.quantize_k(&x, cols);
    } else {
        q.quantize(&x, cols);
    }
    (data, q)
}

/// GGML rows of `format` with random values, bits and scales, and the
/// block scales (d, m, dmin) in the range real weights have.
pub(crate) fn synthetic_rows(
    format: QFormat,
    rows: usize,
    cols: usize,
    rng: &mut SplitMix,
) -> Vec<u8> {
    let f16 = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    let mut data = vec![0u8; rows * format.row_bytes(cols)];
    for blk in data.chunks_exact_mut(format.block_bytes()) {
        for b in blk.iter_mut() {
            *b = rng.next() as u8;
        }
        match format {
            QFormat::Q4_K => {
                blk[..2].copy_from_slice(&f16(0.001));
                blk[2..4].copy_from_slice(&f16(0.002));
            }
            QFormat::Q6_K => blk[208..].copy_from_slice(&f16(0.0005)),
            QFormat::Q4_1 => {
                blk[..2].copy_from_slice(&f16(0.02));
                blk[2..4].copy_from_slice(&f16(-0.1));
            }
            _ => blk[..2].copy_from_slice(&f16(0.02)),
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_sets_print_as_runs() {
        assert_eq!(RowSet::EMPTY.to_string(), "none");
        assert_eq!(RowSet::from(2).to_string(), "2-16");
        let mut s = RowSet::EMPTY;
        for t in [1, 4, 5, 6, 16] {
            s.insert(t);
        }
        assert_eq!(s.to_string(), "1, 4-6, 16");
        assert!(s.contains(5) && !s.contains(2) && !s.contains(0) && !s.contains(17));
    }

    #[test]
    fn the_plan_is_measured_where_amx_runs_and_empty_elsewhere() {
        let plan = tile_plan();
        if !Isa::AmxInt8.supported() {
            assert!(plan.formats.is_empty());
            assert_eq!(plan.to_string(), "no AMX tiles");
            eprintln!("skipped the measurement: this CPU lacks {}", Isa::AmxInt8);
            return;
        }
        eprintln!("tile plan: {plan}");
        for p in &plan.formats {
            assert!(!p.mismatch, "{:?}: tile results differ from VNNI", p.format);
            assert!((1..=16).all(|t| p.ratio[t].is_finite() && p.ratio[t] > 0.0));
        }
        assert_eq!(plan.formats.len(), 4);
    }

    /// The tile kernels of `format` on emulated tiles.
    #[cfg(target_arch = "x86_64")]
    fn emulated(format: QFormat) -> crate::tiles::AmxPairsFn {
        use crate::packed::amx::emulated::*;
        use crate::packed::amx::kquant::emulated::*;
        match format {
            QFormat::Q4_1 => q4_1_pairs_emulated,
            QFormat::Q8_0 => q8_0_pairs_emulated,
            QFormat::Q4_K => q4_k_pairs_emulated,
            _ => q6_k_pairs_emulated,
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_measurement_compares_bits_and_keeps_slower_tiles_off() {
        // On emulated tiles (plain Rust, far slower than VNNI) every format
        // measures, agrees bit for bit, and gets no tiles; a kernel whose
        // results differ in one bit is refused outright.
        if !Isa::Avx512Vnni.supported() {
            eprintln!("skipped: this CPU lacks {}", Isa::Avx512Vnni);
            return;
        }
        for format in [QFormat::Q4_K, QFormat::Q6_K, QFormat::Q4_1, QFormat::Q8_0] {
            let p = measure_format(format, emulated(format));
            assert!(!p.mismatch, "{format:?}");
            assert!(p.tiles.is_empty(), "{format:?}: {}", p.tiles);
            assert!(
                (1..=16).all(|t| p.ratio[t] > 1.0),
                "{format:?}: {:?}",
                p.ratio
            );
        }
        /// The emulated Q4_K kernel with the lowest bit of every result
        /// flipped.
        #[allow(clippy::too_many_arguments)]
        unsafe fn off_by_a_bit(
            data: &[u8],
            nb: usize,
            g0: usize,
            npairs: usize,
            acts: &QuantizedRows,
            r0: usize,
            t: usize,
            emit: &mut dyn FnMut(usize, &crate::tiles::PairOut),
        ) {
            let mut flip = |g: usize, out: &crate::tiles::PairOut| {
                let mut out = *out;
                out.iter_mut()
                    .flatten()
                    .flatten()
                    .for_each(|v| *v = f32::from_bits(v.to_bits() ^ 1));
                emit(g, &out)
            };
            // SAFETY: the caller's contract, passed on.
            unsafe { emulated(QFormat::Q4_K)(data, nb, g0, npairs, acts, r0, t, &mut flip) }
        }
        let p = measure_format(QFormat::Q4_K, off_by_a_bit);
        assert!(p.mismatch);
        assert!(p.tiles.is_empty());
        assert_eq!(
            TilePlan { formats: vec![p] }.to_string(),
            "Q4_K refused (results differed from VNNI)"
        );
    }
}
