//! 8-row group layouts of the 32-element formats.
//!
//! Group-block layout (one per 8 rows × 32 inputs; row j of the group):
//!
//! ```text
//! Q4_0 (144 B): d[8] f16 |            4 chunks × (row0 qs[4c..4c+4] | … | row7 qs[4c..4c+4])
//! Q4_1 (160 B): d[8] f16 | m[8] f16 | 4 chunks × (row0 qs[4c..4c+4] | … | row7 qs[4c..4c+4])
//! Q5_0 (176 B): d[8] f16 | h (32 B)       | 4 chunks × (row0 qs[4c..4c+4] | … )
//! Q8_0 (272 B): d[8] f16 |             8 chunks × (row0 q[4c..4c+4]  | … | row7 q[4c..4c+4])
//! ```
//!
//! A chunk's low nibbles are inputs 4c..4c+4 and its high nibbles inputs
//! 16+4c..16+4c+4 (GGML's nibble order), so one 32-byte load and a mask or
//! a shift give the 4 inputs of all 8 rows that one `vpmaddubsw` takes.
//! Q5_0's fifth bits form one bit plane in the same byte order: bit 2c + s
//! of byte 4j + e of `h` is the fifth bit of row j's input 16s + 4c + e, so
//! one shift and one mask put a chunk's fifth bits at bit 4 of the bytes of
//! its register (llama.cpp spreads a 32-bit mask to 32 bytes instead, a
//! shuffle and a compare per chunk half: twice the work, and at one token a
//! Q5_0 matmul is bound by it).

use crate::act::BlockQ8;
use crate::format::{BLOCK, QFormat, f16_at, q5_0_values};

use super::GROUP;

pub(crate) const Q4_0_GBB: usize = 16 + 4 * 32;
pub(crate) const Q4_1_GBB: usize = 32 + 4 * 32;
pub(crate) const Q5_0_GBB: usize = 16 + 32 + 4 * 32;
pub(crate) const Q8_0_GBB: usize = 16 + 8 * 32;

/// Byte offset of Q4_0's nibble chunks.
pub(crate) const Q4_0_NIBBLES: usize = 16;
/// Byte offset of Q5_0's fifth-bit plane.
pub(crate) const Q5_0_BITS: usize = 16;
/// Byte offset of Q5_0's nibble chunks.
pub(crate) const Q5_0_NIBBLES: usize = 48;

/// Writes GGML block `blk` as row `j` of group-block `dst`.
pub(super) fn pack_row(format: QFormat, blk: &[u8], j: usize, dst: &mut [u8]) {
    dst[2 * j..2 * j + 2].copy_from_slice(&blk[0..2]);
    match format {
        QFormat::Q4_0 => {
            for c in 0..4 {
                let at = Q4_0_NIBBLES + c * 32 + j * 4;
                dst[at..at + 4].copy_from_slice(&blk[2 + 4 * c..2 + 4 * c + 4]);
            }
        }
        QFormat::Q4_1 => {
            dst[16 + 2 * j..16 + 2 * j + 2].copy_from_slice(&blk[2..4]);
            for c in 0..4 {
                let at = 32 + c * 32 + j * 4;
                dst[at..at + 4].copy_from_slice(&blk[4 + 4 * c..4 + 4 * c + 4]);
            }
        }
        QFormat::Q5_0 => {
            let q = q5_0_values(blk);
            for c in 0..4 {
                for s in 0..2 {
                    for e in 0..4 {
                        dst[Q5_0_BITS + 4 * j + e] |= (q[16 * s + 4 * c + e] >> 4) << (2 * c + s);
                    }
                }
                let at = Q5_0_NIBBLES + c * 32 + j * 4;
                dst[at..at + 4].copy_from_slice(&blk[6 + 4 * c..6 + 4 * c + 4]);
            }
        }
        QFormat::Q8_0 => {
            for c in 0..8 {
                let at = 16 + c * 32 + j * 4;
                dst[at..at + 4].copy_from_slice(&blk[2 + 4 * c..2 + 4 * c + 4]);
            }
        }
        _ => unreachable!("{format:?} is not a packed 32-element format"),
    }
}

/// The values of row `j` of one packed group-block, as integers before the
/// format's offset (Q4_0 and Q4_1: 0..16, Q5_0: 0..32, Q8_0: i8).
fn row_values(format: QFormat, gb: &[u8], j: usize) -> [i32; BLOCK] {
    let mut q = [0i32; BLOCK];
    match format {
        QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 => {
            let base = match format {
                QFormat::Q4_0 => Q4_0_NIBBLES,
                QFormat::Q4_1 => 32,
                _ => Q5_0_NIBBLES,
            };
            for c in 0..4 {
                for e in 0..4 {
                    let byte = gb[base + c * 32 + j * 4 + e];
                    q[4 * c + e] = (byte & 0x0f) as i32;
                    q[16 + 4 * c + e] = (byte >> 4) as i32;
                }
            }
            if format == QFormat::Q5_0 {
                for c in 0..4 {
                    for s in 0..2 {
                        for e in 0..4 {
                            let h = (gb[Q5_0_BITS + 4 * j + e] >> (2 * c + s)) & 1;
                            q[16 * s + 4 * c + e] |= (h as i32) << 4;
                        }
                    }
                }
            }
        }
        QFormat::Q8_0 => {
            for c in 0..8 {
                for e in 0..4 {
                    q[4 * c + e] = (gb[16 + c * 32 + j * 4 + e] as i8) as i32;
                }
            }
        }
        _ => unreachable!("{format:?} is not a packed 32-element format"),
    }
    q
}

/// Dequantizes row `j` of one group-block into `out` (32 values).
pub(super) fn dequantize(format: QFormat, gb: &[u8], j: usize, out: &mut [f32]) {
    let d = f16_at(gb, 2 * j);
    let q = row_values(format, gb, j);
    match format {
        QFormat::Q4_1 => {
            let m = f16_at(gb, 16 + 2 * j);
            for (o, q) in out.iter_mut().zip(q) {
                *o = d * q as f32 + m;
            }
        }
        QFormat::Q4_0 => {
            for (o, q) in out.iter_mut().zip(q) {
                *o = d * (q - 8) as f32;
            }
        }
        QFormat::Q5_0 => {
            for (o, q) in out.iter_mut().zip(q) {
                *o = d * (q - 16) as f32;
            }
        }
        _ => {
            for (o, q) in out.iter_mut().zip(q) {
                *o = d * q as f32;
            }
        }
    }
}

/// `out[j]` = row j of `group` (all its group-blocks) · the activation row.
pub(super) fn dot_scalar(format: QFormat, group: &[u8], arow: &[BlockQ8], out: &mut [f32; GROUP]) {
    let gbb = super::group_block_bytes(format);
    for (j, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        let mut macc = 0.0f32;
        for (gb, a) in group.chunks_exact(gbb).zip(arow) {
            let q = row_values(format, gb, j);
            let isum: i32 = q.iter().zip(&a.qs).map(|(&w, &a)| w * a as i32).sum();
            let d = f16_at(gb, 2 * j);
            match format {
                QFormat::Q4_1 => {
                    acc += isum as f32 * (d * a.d);
                    macc += f16_at(gb, 16 + 2 * j) * a.s;
                }
                // The SIMD kernel's steps: the −8 / −16 offset through the
                // activation sum, then one fused multiply-add.
                QFormat::Q4_0 => acc = ((isum - 8 * a.qsum) as f32).mul_add(d * a.d, acc),
                QFormat::Q5_0 => acc = ((isum - 16 * a.qsum) as f32).mul_add(d * a.d, acc),
                _ => acc += isum as f32 * (d * a.d),
            }
        }
        *o = acc + macc;
    }
}
