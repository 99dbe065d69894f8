//! Weights repacked at load time, losslessly, into groups of 8 rows so that
//! one 256-bit register holds the same 4 input positions of 8 output rows.
//!
//! With that layout a `vpdpbusd` of the weight register against 4 broadcast
//! activation bytes adds to each 32-bit lane the partial dot product of a
//! different output row: no horizontal sums, and the 8 rows' scales load as
//! one vector (`vcvtph2ps`). A tile of 8 rows × T activation rows unpacks
//! each weight byte once for all T rows. This is the layout llama.cpp uses for
//! its repacked CPU kernels, applied to the formats of our GGUFs.
//!
//! Group-block layout (one per 8 rows × 32 inputs):
//!
//! ```text
//! Q4_1 (160 B): d[8] f16 | m[8] f16 | 4 chunks × (row0 qs[4c..4c+4] | … | row7 qs[4c..4c+4])
//! Q8_0 (272 B): d[8] f16 |           8 chunks × (row0 q[4c..4c+4]  | … | row7 q[4c..4c+4])
//! ```
//!
//! A Q4_1 chunk's low nibbles are inputs 4c..4c+4 and its high nibbles
//! inputs 16+4c..16+4c+4 (GGML's nibble order). Rows are padded with zero
//! blocks to a multiple of 8.

use crate::act::QuantizedRows;
use crate::format::{BLOCK, QFormat, f16_at};

/// Rows per group.
pub(crate) const GROUP: usize = 8;

/// Formats with a packed kernel.
pub(crate) fn packable(format: QFormat) -> bool {
    matches!(format, QFormat::Q4_1 | QFormat::Q8_0)
}

/// Bytes of one group-block.
pub(crate) const fn group_block_bytes(format: QFormat) -> usize {
    match format {
        QFormat::Q4_1 => 32 + 4 * 32,
        QFormat::Q8_0 => 16 + 8 * 32,
        QFormat::Q4_0 => 0,
    }
}

/// Repacks GGML row-major blocks (`rows × cols`) into groups of 8 rows.
pub(crate) fn pack(format: QFormat, rows: usize, cols: usize, src: &[u8]) -> Vec<u8> {
    let nb = cols / BLOCK;
    let groups = rows.div_ceil(GROUP);
    let gbb = group_block_bytes(format);
    let bb = format.block_bytes();
    let mut out = vec![0u8; groups * nb * gbb];
    for g in 0..groups {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * gbb..][..gbb];
            for j in 0..GROUP {
                let row = g * GROUP + j;
                if row >= rows {
                    continue; // zero padding: d = m = 0, q = 0
                }
                let blk = &src[(row * nb + b) * bb..][..bb];
                dst[2 * j..2 * j + 2].copy_from_slice(&blk[0..2]);
                match format {
                    QFormat::Q4_1 => {
                        dst[16 + 2 * j..16 + 2 * j + 2].copy_from_slice(&blk[2..4]);
                        for c in 0..4 {
                            let at = 32 + c * 32 + j * 4;
                            dst[at..at + 4].copy_from_slice(&blk[4 + 4 * c..4 + 4 * c + 4]);
                        }
                    }
                    QFormat::Q8_0 => {
                        for c in 0..8 {
                            let at = 16 + c * 32 + j * 4;
                            dst[at..at + 4].copy_from_slice(&blk[2 + 4 * c..2 + 4 * c + 4]);
                        }
                    }
                    QFormat::Q4_0 => unreachable!("Q4_0 is not packed"),
                }
            }
        }
    }
    out
}

/// Dequantizes row `row` of a packed matrix into `out` (`cols` values).
pub(crate) fn dequantize_row(
    format: QFormat,
    data: &[u8],
    cols: usize,
    row: usize,
    out: &mut [f32],
) {
    let nb = cols / BLOCK;
    let gbb = group_block_bytes(format);
    let (g, j) = (row / GROUP, row % GROUP);
    for (b, out) in out.chunks_exact_mut(BLOCK).enumerate() {
        let gb = &data[(g * nb + b) * gbb..][..gbb];
        let d = f16_at(gb, 2 * j);
        match format {
            QFormat::Q4_1 => {
                let m = f16_at(gb, 16 + 2 * j);
                for c in 0..4 {
                    for e in 0..4 {
                        let byte = gb[32 + c * 32 + j * 4 + e];
                        out[4 * c + e] = d * (byte & 0x0f) as f32 + m;
                        out[16 + 4 * c + e] = d * (byte >> 4) as f32 + m;
                    }
                }
            }
            QFormat::Q8_0 => {
                for c in 0..8 {
                    for e in 0..4 {
                        out[4 * c + e] = d * (gb[16 + c * 32 + j * 4 + e] as i8) as f32;
                    }
                }
            }
            QFormat::Q4_0 => unreachable!("Q4_0 is not packed"),
        }
    }
}

/// Portable kernel over a packed group: `out[t][j]` = row (8g + j) · act row
/// (r0 + t). Same accumulation structure as the SIMD kernels (one float
/// accumulator per lane, fed block by block), though not the same bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_scalar(
    format: QFormat,
    data: &[u8],
    cols: usize,
    g: usize,
    acts: &QuantizedRows,
    r0: usize,
    t: usize,
    out: &mut [[f32; GROUP]; 8],
) {
    let nb = cols / BLOCK;
    let gbb = group_block_bytes(format);
    for (ti, out) in out.iter_mut().enumerate().take(t) {
        let arow = acts.row(r0 + ti);
        let mut acc = [0.0f32; GROUP];
        let mut macc = [0.0f32; GROUP];
        for (b, a) in arow.iter().enumerate() {
            let gb = &data[(g * nb + b) * gbb..][..gbb];
            for j in 0..GROUP {
                let d = f16_at(gb, 2 * j);
                let mut isum = 0i32;
                match format {
                    QFormat::Q4_1 => {
                        for c in 0..4 {
                            for e in 0..4 {
                                let byte = gb[32 + c * 32 + j * 4 + e];
                                isum += (byte & 0x0f) as i32 * a.qs[4 * c + e] as i32;
                                isum += (byte >> 4) as i32 * a.qs[16 + 4 * c + e] as i32;
                            }
                        }
                        macc[j] += f16_at(gb, 16 + 2 * j) * a.s;
                    }
                    QFormat::Q8_0 => {
                        for c in 0..8 {
                            for e in 0..4 {
                                isum += (gb[16 + c * 32 + j * 4 + e] as i8) as i32
                                    * a.qs[4 * c + e] as i32;
                            }
                        }
                    }
                    QFormat::Q4_0 => unreachable!("Q4_0 is not packed"),
                }
                acc[j] += isum as f32 * (d * a.d);
            }
        }
        for j in 0..GROUP {
            out[j] = acc[j] + macc[j];
        }
    }
}
