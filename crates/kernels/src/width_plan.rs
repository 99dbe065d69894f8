//! Which matmul calls the 512-bit two-group kernels take, measured once
//! per process, as [`crate::tile_plan()`] measures the AMX tiles.
//!
//! Why measured: where AVX-512 runs, every format with a 512-bit pair
//! kernel also has a 256-bit single-group kernel with bit-identical
//! results, and which is faster depends on the CPU and on the rows per
//! call. Intel cores issue a 512-bit `vpdpbusd` as one operation; AMD Zen 4
//! splits it into two 256-bit halves, so there a 512-bit kernel gains only
//! what it saves in unpacking and may lose on its extra shuffles. So, at
//! first use, each format runs both on a matrix held in cache for 1..=8
//! rows per call (what one pair call takes), and the 256-bit kernel keeps
//! the row counts where it was at least [`MIN_GAIN`] faster; the 512-bit
//! kernel keeps the rest, the default before this plan.
//!
//! The same run compares the two kernels' results bit for bit; a format
//! whose results differ keeps the 512-bit kernel for every call, so a row
//! gets the same bits in every call whatever its size.

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::format::QFormat;
use crate::isa::Isa;
use crate::tile_plan::{RowSet, synthetic_call};

/// How much faster the 256-bit kernel must be to take a row count.
pub const MIN_GAIN: f64 = 0.05;

/// Rows one 512-bit pair call takes at most.
pub const PAIR_ROWS: usize = 8;

/// What was measured for one format.
#[derive(Clone, Debug)]
pub struct WidthFormat {
    pub format: QFormat,
    /// Row counts (1..=8) whose calls stay on the 512-bit pair kernel.
    pub wide: RowSet,
    /// 512-bit time / 256-bit time per row count (index t, 1..=8).
    pub ratio: [f64; PAIR_ROWS + 1],
    /// The two kernels' results differed: 512-bit for every call.
    pub mismatch: bool,
}

/// The width choice of every format with a 512-bit pair kernel; empty
/// where AVX-512 VNNI does not run (no pair kernels then).
#[derive(Clone, Debug, Default)]
pub struct WidthPlan {
    pub formats: Vec<WidthFormat>,
}

impl WidthPlan {
    /// Whether a call of `t` rows on `format` takes the 512-bit pair
    /// kernel (true for formats not measured: the default).
    pub fn wide(&self, format: QFormat, t: usize) -> bool {
        self.rows(format).contains(t)
    }

    /// The row counts whose calls on `format` take the 512-bit pair kernel.
    pub fn rows(&self, format: QFormat) -> RowSet {
        self.formats
            .iter()
            .find(|p| p.format == format)
            .map_or_else(all_rows, |p| p.wide)
    }
}

fn all_rows() -> RowSet {
    let mut set = RowSet::EMPTY;
    for t in 1..=PAIR_ROWS {
        set.insert(t);
    }
    set
}

/// `512-bit Q4_K 1-8 rows, Q6_K 5-8 rows, Q8_0 none`.
impl fmt::Display for WidthPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.formats.is_empty() {
            return f.write_str("no 512-bit pairs");
        }
        f.write_str("512-bit")?;
        for (i, p) in self.formats.iter().enumerate() {
            f.write_str(if i == 0 { " " } else { ", " })?;
            if p.mismatch {
                write!(f, "{:?} all (results differed from 256-bit)", p.format)?;
            } else if p.wide.is_empty() {
                write!(f, "{:?} none", p.format)?;
            } else {
                write!(f, "{:?} {} rows", p.format, p.wide)?;
            }
        }
        Ok(())
    }
}

/// The process's plan: measured on first call where AVX-512 VNNI runs
/// (tens of milliseconds), empty elsewhere.
pub fn width_plan() -> &'static WidthPlan {
    static PLAN: OnceLock<WidthPlan> = OnceLock::new();
    PLAN.get_or_init(|| {
        if Isa::Avx512Vnni.supported() {
            measure()
        } else {
            WidthPlan::default()
        }
    })
}

fn measure() -> WidthPlan {
    #[cfg(target_arch = "x86_64")]
    {
        let formats = [
            QFormat::Q4_K,
            QFormat::Q6_K,
            QFormat::Q4_1,
            QFormat::Q8_0,
            QFormat::Q4_0,
            QFormat::Q5_0,
        ];
        WidthPlan {
            formats: formats.into_iter().map(measure_format).collect(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    WidthPlan::default()
}

/// 256 output rows of 2048 inputs, in cache as a verify call's weights are
/// for its rows after the first.
const ROWS: usize = 256;
const COLS: usize = 2048;
const CALLS: usize = 4;
const ROUNDS: usize = 3;

/// Times `format`'s 512-bit pair kernel against its 256-bit group kernel
/// (in calls of at most 4 rows, as the matmul makes them) at 1..=8 rows per
/// call, one thread, and compares their bits.
#[cfg(target_arch = "x86_64")]
fn measure_format(format: QFormat) -> WidthFormat {
    use crate::packed::GROUP;
    let isa = Isa::Avx512Vnni;
    let pair = crate::packed::x86::kquant_512::pair_fn(isa, format)
        .or_else(|| crate::packed::x86::blocks32_512::pair_fn(isa, format))
        .expect("measured formats have a 512-bit pair kernel");
    let group = crate::packed::x86::kquant::group_fn(format)
        .unwrap_or_else(|| crate::packed::x86::group_fn(isa, format));
    let (data, acts) = synthetic_call(format, (ROWS, COLS), PAIR_ROWS, 0x3141);
    let (nb, groups) = (COLS / format.block_len(), ROWS / GROUP);
    let mut plan = WidthFormat {
        format,
        wide: RowSet::EMPTY,
        ratio: [f64::NAN; PAIR_ROWS + 1],
        mismatch: false,
    };
    for t in 1..=PAIR_ROWS {
        let mut on_pairs = vec![0.0f32; t * ROWS];
        let mut on_groups = vec![f32::NAN; t * ROWS];
        let run_pairs = |out: &mut [f32]| {
            let mut tmp = [[[0.0f32; GROUP]; 8]; 2];
            for g in (0..groups).step_by(2) {
                // SAFETY: groups g, g + 1 and rows 0..t exist, and the
                // caller measures only where AVX-512 VNNI runs.
                unsafe { pair(&data, nb, g, &acts, 0, t, &mut tmp) };
                for (s, res) in tmp.iter().enumerate() {
                    for (i, row) in res.iter().enumerate().take(t) {
                        let at = i * ROWS + (g + s) * GROUP;
                        out[at..at + GROUP].copy_from_slice(row);
                    }
                }
            }
        };
        let run_groups = |out: &mut [f32]| {
            let mut tmp = [[0.0f32; GROUP]; 8];
            for g in 0..groups {
                let mut r = 0;
                while r < t {
                    let tt = (t - r).min(4);
                    // SAFETY: as above.
                    unsafe { group(&data, nb, g, &acts, r, tt, &mut tmp) };
                    for (i, row) in tmp.iter().enumerate().take(tt) {
                        let at = (r + i) * ROWS + g * GROUP;
                        out[at..at + GROUP].copy_from_slice(row);
                    }
                    r += tt;
                }
            }
        };
        let (mut pair_time, mut group_time) = (Duration::MAX, Duration::MAX);
        for _ in 0..ROUNDS {
            let start = Instant::now();
            for _ in 0..CALLS {
                run_pairs(&mut on_pairs);
            }
            pair_time = pair_time.min(start.elapsed());
            let start = Instant::now();
            for _ in 0..CALLS {
                run_groups(&mut on_groups);
            }
            group_time = group_time.min(start.elapsed());
        }
        if on_pairs
            .iter()
            .map(|v| v.to_bits())
            .ne(on_groups.iter().map(|v| v.to_bits()))
        {
            plan.mismatch = true;
        }
        let ratio = pair_time.as_secs_f64() / group_time.as_secs_f64().max(1e-12);
        plan.ratio[t] = ratio;
        // The 256-bit kernel takes a row count only when clearly faster.
        if ratio < 1.0 / (1.0 - MIN_GAIN) {
            plan.wide.insert(t);
        }
    }
    if plan.mismatch {
        plan.wide = all_rows();
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_measured_where_avx512_vnni_runs() {
        let plan = width_plan();
        if !Isa::Avx512Vnni.supported() {
            assert!(plan.formats.is_empty());
            assert_eq!(plan.to_string(), "no 512-bit pairs");
            eprintln!(
                "skipped the measurement: this CPU lacks {}",
                Isa::Avx512Vnni
            );
            return;
        }
        eprintln!("width plan: {plan}");
        for p in &plan.formats {
            assert!(
                !p.mismatch,
                "{:?}: 512-bit results differ from 256-bit",
                p.format
            );
            assert!((1..=PAIR_ROWS).all(|t| p.ratio[t].is_finite() && p.ratio[t] > 0.0));
        }
        assert_eq!(plan.formats.len(), 6);
    }

    #[test]
    fn formats_without_a_measurement_stay_wide() {
        let plan = WidthPlan::default();
        assert!(plan.wide(QFormat::Q4_K, 1) && plan.wide(QFormat::Q8_0, 8));
        let mut wide = RowSet::EMPTY;
        wide.insert(5);
        let plan = WidthPlan {
            formats: vec![WidthFormat {
                format: QFormat::Q6_K,
                wide,
                ratio: [1.0; PAIR_ROWS + 1],
                mismatch: false,
            }],
        };
        assert!(plan.wide(QFormat::Q6_K, 5) && !plan.wide(QFormat::Q6_K, 4));
        assert!(plan.wide(QFormat::Q4_K, 4));
        assert_eq!(plan.to_string(), "512-bit Q6_K 5 rows");
    }
}
