//! `y = x · Wᵀ` for a weight matrix W (`rows × cols`, one output feature per
//! row) and k activation rows x (`k × cols`).
//!
//! Work is split across threads by output feature; every (row, feature)
//! result is produced by one tile-kernel call whose per-row arithmetic does not
//! depend on k, on the tiling or on the thread split.

use crate::act::QuantizedRows;
use crate::dot::{Out, TILE, WROWS, tile_fn, wrows_for};
use crate::format::{BLOCK, QFormat, WeightLayoutError};
use crate::isa::Isa;
use crate::threads::ThreadPool;
use crate::vec;

/// Storage of a weight matrix.
#[derive(Clone, Debug)]
pub enum Weights {
    /// GGML-layout quantized blocks, used in place.
    Quant { format: QFormat, data: Vec<u8> },
    /// Dense f32 (formats without a native kernel are dequantized to this).
    F32(Vec<f32>),
}

/// A weight matrix of `rows` output features over `cols` inputs.
#[derive(Clone, Debug)]
pub struct QMatrix {
    rows: usize,
    cols: usize,
    weights: Weights,
}

/// Output pointer shared by the threads of one matmul; each writes a
/// disjoint set of columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: threads write disjoint indices (their own output features) and the
// pool joins them before the borrow of `out` ends.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl QMatrix {
    /// Wraps weights, checking that their size matches `rows × cols`.
    pub fn new(rows: usize, cols: usize, weights: Weights) -> Result<QMatrix, WeightLayoutError> {
        match &weights {
            Weights::Quant { format, data } => {
                if cols % BLOCK != 0 {
                    return Err(WeightLayoutError::Unaligned { cols });
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
        Ok(QMatrix {
            rows,
            cols,
            weights,
        })
    }

    /// Stacks matrices with the same `cols` and storage kind into one whose
    /// output features are theirs in order (fuses Q/K/V or gate/up so that
    /// one call, one activation quantization and one thread split serve all).
    /// Returns `None` when their formats differ.
    pub fn stack(parts: &[&QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        let cols = first.cols;
        let rows = parts.iter().map(|p| p.rows).sum();
        let weights = match &first.weights {
            Weights::Quant { format, .. } => {
                let mut data = Vec::new();
                for p in parts {
                    match &p.weights {
                        Weights::Quant { format: f, data: d } if f == format && p.cols == cols => {
                            data.extend_from_slice(d)
                        }
                        _ => return None,
                    }
                }
                Weights::Quant {
                    format: *format,
                    data,
                }
            }
            Weights::F32(_) => {
                let mut data = Vec::new();
                for p in parts {
                    match &p.weights {
                        Weights::F32(d) if p.cols == cols => data.extend_from_slice(d),
                        _ => return None,
                    }
                }
                Weights::F32(data)
            }
        };
        Some(QMatrix {
            rows,
            cols,
            weights,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Bytes of weight data (what one forward reads from memory).
    pub fn nbytes(&self) -> usize {
        match &self.weights {
            Weights::Quant { data, .. } => data.len(),
            Weights::F32(d) => d.len() * 4,
        }
    }

    /// Writes row `r` of the matrix, dequantized, into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match &self.weights {
            Weights::Quant { format, data } => {
                let rb = format.row_bytes(self.cols);
                format.dequantize_row(&data[r * rb..(r + 1) * rb], out)
            }
            Weights::F32(d) => out.copy_from_slice(&d[r * self.cols..(r + 1) * self.cols]),
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
        match &self.weights {
            Weights::Quant { format, data } => {
                scratch.quantize(x, self.cols);
                let acts = &*scratch;
                let tile = tile_fn(isa, *format);
                let rb = format.row_bytes(self.cols);
                pool.for_ranges(n, &|range| {
                    let optr = optr;
                    let mut tmp: Out = [[0.0; TILE]; WROWS];
                    let mut r = 0;
                    while r < k {
                        let t = (k - r).min(TILE);
                        let wr = wrows_for(t);
                        let mut j = range.start;
                        while j < range.end {
                            let rows = if range.end - j >= wr { wr } else { 1 };
                            let w = &data[j * rb..(j + rows) * rb];
                            // SAFETY: `w` holds `rows` rows of `cols` elements
                            // of `format`, activation rows r..r+t exist, and
                            // `isa` is supported.
                            unsafe { tile(w, rb, rows, acts, r, t, &mut tmp) };
                            for (jj, res) in tmp.iter().enumerate().take(rows) {
                                for (i, v) in res.iter().enumerate().take(t) {
                                    // SAFETY: (r + i) < k and j + jj < n: inside
                                    // `out`; feature j + jj belongs to this
                                    // thread alone.
                                    unsafe { *optr.0.add((r + i) * n + j + jj) = *v };
                                }
                            }
                            j += rows;
                        }
                        r += t;
                    }
                });
            }
            Weights::F32(data) => {
                let cols = self.cols;
                pool.for_ranges(n, &|range| {
                    let optr = optr;
                    for j in range {
                        let w = &data[j * cols..(j + 1) * cols];
                        for r in 0..k {
                            let v = vec::dot(w, &x[r * cols..(r + 1) * cols]);
                            // SAFETY: as above.
                            unsafe { *optr.0.add(r * n + j) = v };
                        }
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
