//! `y = x · Wᵀ` for a weight matrix W (`rows × cols`, one output feature per
//! row) and k activation rows x (`k × cols`).
//!
//! Work is split across threads by output feature; every (row, feature)
//! result is produced by one tile-kernel call whose per-row arithmetic does not
//! depend on k, on the tiling or on the thread split.

use crate::act::QuantizedRows;
use crate::format::{QFormat, WeightLayoutError};
use crate::isa::Isa;
use crate::packed;
use crate::threads::ThreadPool;
use crate::tile_plan::TileCalls;
use crate::vec;
use std::ops::Range;

/// Storage of a weight matrix.
#[derive(Clone, Debug)]
pub enum Weights {
    /// GGML-layout quantized blocks (repacked at load).
    Quant { format: QFormat, data: Vec<u8> },
    /// Dense f32 (formats without a native kernel are dequantized to this).
    F32(Vec<f32>),
}

/// A weight matrix of `rows` output features over `cols` inputs.
#[derive(Clone, Debug)]
pub struct QMatrix {
    rows: usize,
    cols: usize,
    storage: Storage,
}

/// How a matrix is held in memory.
#[derive(Clone, Debug)]
enum Storage {
    /// Repacked into 8-row groups (see `packed`).
    Packed {
        format: QFormat,
        data: Vec<u8>,
    },
    F32(Vec<f32>),
}

/// Pairs of groups a thread runs every row chunk on before the next ones,
/// when a tile kernel takes part: 128 weight rows, ~640 KB of an
/// 8960-input Q4_K matrix, within a 2 MB L2, so rows beyond the first tile
/// call's 16 read the weights from cache rather than memory.
const TILE_BLOCK_PAIRS: usize = 8;

/// Output pointer shared by the threads of one matmul; each writes a
/// disjoint set of columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: threads write disjoint indices (their own output features) and the
// pool joins them before the borrow of `out` ends.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Through a method, so closures capture the `Sync` wrapper rather
    /// than its raw-pointer field.
    #[inline(always)]
    fn ptr(&self) -> *mut f32 {
        self.0
    }
}

impl QMatrix {
    /// Wraps weights, checking that their size matches `rows × cols`.
    pub fn new(rows: usize, cols: usize, weights: Weights) -> Result<QMatrix, WeightLayoutError> {
        match &weights {
            Weights::Quant { format, data } => {
                if !cols.is_multiple_of(format.block_len()) {
                    return Err(WeightLayoutError::Unaligned {
                        format: *format,
                        cols,
                        block: format.block_len(),
                    });
                }
                let expected = rows * format.row_bytes(cols);
                if data.len() != expected {
                    return Err(WeightLayoutError::Size {
                        format: *format,
                        rows,
                        cols,
                        got: data.len(),
                        expected,
                    });
                }
            }
            Weights::F32(data) => {
                if data.len() != rows * cols {
                    return Err(WeightLayoutError::F32Size {
                        rows,
                        cols,
                        got: data.len(),
                        expected: rows * cols,
                    });
                }
            }
        }
        let storage = match weights {
            Weights::Quant { format, data } => Storage::Packed {
                format,
                data: packed::pack(format, rows, cols, &data),
            },
            Weights::F32(d) => Storage::F32(d),
        };
        Ok(QMatrix {
            rows,
            cols,
            storage,
        })
    }

    /// Stacks matrices with the same `cols` and storage kind into one whose
    /// output features are theirs in order (fuses Q/K/V or gate/up so that
    /// one call, one activation quantization and one thread split serve all).
    /// Returns `None` when their formats differ.
    pub fn stack(parts: &[&QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        let cols = first.cols;
        if parts.iter().any(|p| p.cols != cols) {
            return None;
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let storage = match &first.storage {
            Storage::Packed { format, .. } => {
                let mut data = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    match &p.storage {
                        // Packed groups concatenate only if no part but the
                        // last ends in a padded group.
                        Storage::Packed { format: f, data: d }
                            if f == format
                                && (p.rows % packed::GROUP == 0 || i + 1 == parts.len()) =>
                        {
                            data.extend_from_slice(d)
                        }
                        _ => return None,
                    }
                }
                Storage::Packed {
                    format: *format,
                    data,
                }
            }
            Storage::F32(_) => {
                let mut data = Vec::new();
                for p in parts {
                    match &p.storage {
                        Storage::F32(d) => data.extend_from_slice(d),
                        _ => return None,
                    }
                }
                Storage::F32(data)
            }
        };
        Some(QMatrix {
            rows,
            cols,
            storage,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The quantized format, or `None` for f32 weights.
    pub fn format(&self) -> Option<QFormat> {
        match &self.storage {
            Storage::Packed { format, .. } => Some(*format),
            Storage::F32(_) => None,
        }
    }

    /// Bytes of weight data (what one forward reads from memory).
    pub fn nbytes(&self) -> usize {
        match &self.storage {
            Storage::Packed { data, .. } => data.len(),
            Storage::F32(d) => d.len() * 4,
        }
    }

    /// Writes row `r` of the matrix, dequantized, into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match &self.storage {
            Storage::Packed { format, data } => {
                packed::dequantize_row(*format, data, self.cols, r, out)
            }
            Storage::F32(d) => out.copy_from_slice(&d[r * self.cols..(r + 1) * self.cols]),
        }
    }

    /// `out = x · Wᵀ` with `x` of shape `k × cols` and `out` of shape
    /// `k × rows`. `scratch` holds the quantized activations between calls.
    ///
    /// # Panics
    /// On mismatched shapes, or if `isa` is not supported by this CPU.
    pub fn forward(
        &self,
        x: &[f32],
        scratch: &mut QuantizedRows,
        out: &mut [f32],
        isa: Isa,
        pool: &ThreadPool,
    ) {
        let tiles = match self.format() {
            Some(format) if isa == Isa::AmxInt8 => {
                TileCalls::hardware(format, crate::tile_plan::tile_plan().rows(format))
            }
            _ => TileCalls::NONE,
        };
        self.forward_tiled(x, scratch, out, isa, tiles, pool);
    }

    /// [`QMatrix::forward`] with the calls `tiles` names on its tile kernel
    /// (packed formats), whatever the measured plan says: for the plan's
    /// own measurement and the tests.
    pub(crate) fn forward_tiled(
        &self,
        x: &[f32],
        scratch: &mut QuantizedRows,
        out: &mut [f32],
        isa: Isa,
        tiles: TileCalls,
        pool: &ThreadPool,
    ) {
        assert_eq!(
            x.len() % self.cols,
            0,
            "activation width must be {}",
            self.cols
        );
        let k = x.len() / self.cols;
        assert_eq!(out.len(), k * self.rows, "output must be k × {}", self.rows);
        assert!(
            isa.supported(),
            "{isa} kernels are not supported by this CPU"
        );
        let n = self.rows;
        let optr = OutPtr(out.as_mut_ptr());
        match &self.storage {
            Storage::Packed { format, .. } => {
                if format.super_block_activations() {
                    scratch.quantize_k(x, self.cols);
                } else {
                    scratch.quantize(x, self.cols);
                }
                self.forward_packed(scratch, out, isa, tiles, pool);
            }
            Storage::F32(data) => {
                let cols = self.cols;
                pool.for_ranges(n, &|range| {
                    for j in range {
                        let w = &data[j * cols..(j + 1) * cols];
                        for r in 0..k {
                            let v = vec::dot(w, &x[r * cols..(r + 1) * cols]);
                            // SAFETY: as above.
                            unsafe { *optr.ptr().add(r * n + j) = v };
                        }
                    }
                });
            }
        }
    }
}

impl QMatrix {
    /// The packed kernels. `tiles`: the calls (by activation rows) that go
    /// to a tile kernel; other rows take the VNNI / AVX2 kernels, whose
    /// results are the same bits.
    fn forward_packed(
        &self,
        acts: &QuantizedRows,
        out: &mut [f32],
        isa: Isa,
        tiles: TileCalls,
        pool: &ThreadPool,
    ) {
        let Storage::Packed { format, data } = &self.storage else {
            unreachable!("forward_packed on a matrix that is not packed")
        };
        let (format, data) = (*format, data.as_slice());
        let (n, k, nb) = (self.rows, acts.rows(), self.cols / format.block_len());
        let optr = OutPtr(out.as_mut_ptr());
        #[cfg(target_arch = "x86_64")]
        let kernel = (isa != Isa::Scalar).then(|| {
            // The K-quants and Q5_0 have one AVX2 kernel for every ISA.
            crate::packed::x86::kquant::group_fn(format)
                .unwrap_or_else(|| crate::packed::x86::group_fn(isa, format))
        });
        #[cfg(not(target_arch = "x86_64"))]
        let kernel: Option<fn()> = None;
        #[cfg(target_arch = "x86_64")]
        let pair = crate::packed::x86::kquant_512::pair_fn(isa, format)
            .or_else(|| crate::packed::x86::blocks32_512::pair_fn(isa, format));
        // Which row counts the pair kernel takes, measured per CPU.
        #[cfg(target_arch = "x86_64")]
        let pair_rows = match pair {
            Some(_) => crate::width_plan::width_plan().rows(format),
            None => crate::tile_plan::RowSet::EMPTY,
        };
        #[cfg(target_arch = "x86_64")]
        let amx = tiles.kernel.filter(|_| !tiles.rows.is_empty());
        #[cfg(not(target_arch = "x86_64"))]
        let amx: Option<fn()> = None;
        // With a tile kernel, rows go in chunks of a tile call's rows, and
        // a thread takes its groups in blocks of `TILE_BLOCK_PAIRS` pairs,
        // every chunk on one block while its weights are in cache; without
        // one, all rows at once over all the thread's groups (each pair of
        // groups then meets every row while its weights are in cache).
        let (chunk, block) = if amx.is_some() {
            (crate::tile_plan::RowSet::MAX_ROWS, 2 * TILE_BLOCK_PAIRS)
        } else {
            (k, usize::MAX)
        };
        let cols = self.cols;
        // Groups `gs` against rows `rows` on the VNNI / AVX2 / portable
        // kernels.
        let vnni = |gs: Range<usize>, rows: Range<usize>| {
            let mut tmp = [[[0.0f32; packed::GROUP]; 8]; 2];
            let mut g = gs.start;
            while g < gs.end {
                // Two groups per call where a 512-bit kernel exists; its lanes
                // compute exactly what two single-group calls would.
                let span = {
                    #[cfg(target_arch = "x86_64")]
                    {
                        if pair.is_some() && g + 1 < gs.end {
                            2
                        } else {
                            1
                        }
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    {
                        1
                    }
                };
                let mut r = rows.start;
                while r < rows.end {
                    // The 512-bit pair kernels have registers for 8 rows.
                    let t = (rows.end - r).min(8);
                    #[cfg(target_arch = "x86_64")]
                    if span == 2 && pair_rows.contains(t) {
                        // SAFETY: `data` is this matrix's packed storage with
                        // `nb` blocks per row and groups g, g + 1 exist; rows
                        // r..r+t exist in `acts`; `isa` is supported.
                        unsafe {
                            pair.expect("span 2 needs a pair kernel")(
                                data, nb, g, acts, r, t, &mut tmp,
                            )
                        };
                        // SAFETY: rows r..r + t < k and groups g, g + 1 of
                        // `out` belong to this thread.
                        unsafe { scatter(optr, n, g, &tmp, r, t) };
                        r += t;
                        continue;
                    }
                    let t = t.min(4);
                    for g in g..g + span {
                        match kernel {
                            #[cfg(target_arch = "x86_64")]
                            // SAFETY: as above, for group g alone.
                            Some(f) => unsafe { f(data, nb, g, acts, r, t, &mut tmp[0]) },
                            _ => {
                                packed::group_scalar(format, data, cols, g, acts, r, t, &mut tmp[0])
                            }
                        }
                        // SAFETY: rows r..r + t < k and group g of `out`
                        // belong to this thread.
                        unsafe { scatter(optr, n, g, &tmp[..1], r, t) };
                    }
                    r += t;
                }
                g += span;
            }
        };
        pool.for_ranges(n.div_ceil(packed::GROUP), &|groups| {
            let mut g0 = groups.start;
            while g0 < groups.end {
                // Blocks of whole pairs: VNNI pairs the groups as it would
                // over the whole range.
                let g1 = groups.end.min(g0.saturating_add(block));
                let mut r = 0;
                while r < k {
                    let t = (k - r).min(chunk);
                    let mut g = g0;
                    #[cfg(target_arch = "x86_64")]
                    if let Some(tiles_fn) = amx.filter(|_| tiles.rows.contains(t)) {
                        // The block's pairs on tiles; an odd last group goes
                        // to the VNNI kernels below.
                        let pairs = (g1 - g0) / 2;
                        let mut emit = |g: usize, res: &crate::tiles::PairOut| {
                            // SAFETY: rows r..r + t < k and groups g, g + 1
                            // of `out` belong to this thread.
                            unsafe { scatter(optr, n, g, res, r, t) }
                        };
                        // SAFETY: groups g..g + 2 · pairs exist in `data`
                        // (packed, `nb` blocks per row), rows r..r + t exist
                        // in `acts`, and the kernel may run on this CPU
                        // (`TileCalls`' invariant).
                        unsafe { tiles_fn(data, nb, g, pairs, acts, r, t, &mut emit) };
                        g += 2 * pairs;
                    }
                    vnni(g..g1, r..r + t);
                    r += t;
                }
                g0 = g1;
            }
        });
    }
}

/// Copies a kernel call's results, `res[s][i]` for group g + s and
/// activation row r + i (i < t), into `out` (`k × n`), the last group
/// clipped at `n` features.
///
/// # Safety
/// Rows r..r + t and groups g..g + res.len() must lie inside `out`, and no
/// other thread may write them.
unsafe fn scatter<const R: usize>(
    out: OutPtr,
    n: usize,
    g: usize,
    res: &[[[f32; packed::GROUP]; R]],
    r: usize,
    t: usize,
) {
    for (s, res) in res.iter().enumerate() {
        let j0 = (g + s) * packed::GROUP;
        let width = packed::GROUP.min(n - j0);
        for (i, row) in res.iter().enumerate().take(t) {
            // SAFETY: see the function's contract.
            unsafe {
                std::ptr::copy_nonoverlapping(row.as_ptr(), out.ptr().add((r + i) * n + j0), width)
            };
        }
    }
}

#[cfg(test)]
mod tests;
