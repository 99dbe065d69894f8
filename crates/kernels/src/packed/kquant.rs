//! 8-row group layouts of the K-quants (GGML's Q4_K and Q6_K), whose
//! kernels sum integers over a whole 256-input super-block before one float
//! step, against activations quantized in 256-element blocks
//! ([`BlockQ8K`]).
//!
//! Why not unpack each sub-block into a Q4_1-like block with f32 scales:
//! that is 24 bytes per 32 weights where Q4_K has 18, and a decode step
//! reads every weight byte once, so it would run a third slower. Here the
//! bytes stay as many as GGML's (Q6_K exactly; Q4_K's 6-bit scales widened
//! to bytes, +2.8%), and the per-block float epilogue that bounds the Q4_1
//! kernels happens once per 256 inputs instead of once per 32.
//!
//! Group-block layouts (8 rows × 256 inputs; row j of the group):
//!
//! ```text
//! Q4_K (1184 B): d[8] f16 | dmin[8] f16 | sc[8 sub][8 rows] u8
//!              | m[4 pairs][8 rows][2] u8 | 8 sub × 4 chunks × (row0 q[4c..4c+4] | … )
//! Q6_K (1680 B): d[8] f16 | sc[16 sub][8 rows] i8
//!              | 8 × { 4 chunks × (row0 lo4[4c..4c+4] | …) | h0 (32 B) | h1 (32 B) }
//! ```
//!
//! A chunk holds 4 inputs of each row in its low nibbles and 4 more in its
//! high nibbles: Q4_K chunk c of sub-block s has inputs 32s + 4c + e (low)
//! and 32s + 16 + 4c + e (high), both of sub-block s, so both nibbles go to
//! the same scale. Q6_K's 32-input group g holds sub-blocks 2g (low
//! nibbles) and 2g + 1 (high nibbles); byte 4j + e of `h0` keeps the top two
//! bits of row j's inputs 32g + 4c + e at bits 2c..2c+2, `h1` the same for
//! the high-nibble inputs. Q4_K's mins are stored in pairs of sub-blocks,
//! the order in which `vpmaddwd` multiplies them with pairs of activation
//! sums.

use crate::act::BlockQ8K;
use crate::format::{QFormat, SUPER_BLOCK, f16_at, q4_k_scale_min, q4_k_values, q6_k_values};

use super::GROUP;

pub(crate) const Q4_K_GBB: usize = 16 + 16 + 64 + 64 + 32 * 32;
pub(crate) const Q6_K_GBB: usize = 16 + 128 + 8 * Q6_K_GROUP;

/// Q4_K offsets: dmin, scales, mins, nibble chunks.
pub(crate) const Q4_K_DMIN: usize = 16;
pub(crate) const Q4_K_SC: usize = 32;
pub(crate) const Q4_K_MIN: usize = 96;
pub(crate) const Q4_K_NIB: usize = 160;

/// Q6_K offsets: scales, then one 192-byte record per 32 inputs.
pub(crate) const Q6_K_SC: usize = 16;
pub(crate) const Q6_K_VALUES: usize = 144;
pub(crate) const Q6_K_GROUP: usize = 4 * 32 + 64;

/// Writes GGML super-block `blk` as row `j` of group-block `dst`.
pub(super) fn pack_row(format: QFormat, blk: &[u8], j: usize, dst: &mut [u8]) {
    match format {
        QFormat::Q4_K => {
            dst[2 * j..2 * j + 2].copy_from_slice(&blk[0..2]);
            dst[Q4_K_DMIN + 2 * j..Q4_K_DMIN + 2 * j + 2].copy_from_slice(&blk[2..4]);
            let scales: &[u8; 12] = blk[4..16].try_into().unwrap();
            for s in 0..8 {
                let (sc, m) = q4_k_scale_min(scales, s);
                dst[Q4_K_SC + 8 * s + j] = sc;
                dst[Q4_K_MIN + 16 * (s / 2) + 2 * j + s % 2] = m;
            }
            let q = q4_k_values(blk);
            for s in 0..8 {
                for c in 0..4 {
                    for e in 0..4 {
                        let lo = q[32 * s + 4 * c + e];
                        let hi = q[32 * s + 16 + 4 * c + e];
                        dst[Q4_K_NIB + (4 * s + c) * 32 + 4 * j + e] = lo | (hi << 4);
                    }
                }
            }
        }
        QFormat::Q6_K => {
            dst[2 * j..2 * j + 2].copy_from_slice(&blk[208..210]);
            for s in 0..16 {
                dst[Q6_K_SC + 8 * s + j] = blk[192 + s];
            }
            let q = q6_k_values(blk);
            for g in 0..8 {
                let rec = Q6_K_VALUES + g * Q6_K_GROUP;
                for c in 0..4 {
                    for e in 0..4 {
                        let (lo, hi) = (q[32 * g + 4 * c + e], q[32 * g + 16 + 4 * c + e]);
                        dst[rec + 32 * c + 4 * j + e] = (lo & 0x0f) | ((hi & 0x0f) << 4);
                        dst[rec + 128 + 4 * j + e] |= (lo >> 4) << (2 * c);
                        dst[rec + 160 + 4 * j + e] |= (hi >> 4) << (2 * c);
                    }
                }
            }
        }
        _ => unreachable!("{format:?} is not a K-quant"),
    }
}

/// Row `j`'s 256 values of one group-block, before scales and offsets
/// (Q4_K: 0..16, Q6_K: 0..64).
fn row_values(format: QFormat, gb: &[u8], j: usize) -> [u8; SUPER_BLOCK] {
    let mut q = [0u8; SUPER_BLOCK];
    match format {
        QFormat::Q4_K => {
            for s in 0..8 {
                for c in 0..4 {
                    for e in 0..4 {
                        let byte = gb[Q4_K_NIB + (4 * s + c) * 32 + 4 * j + e];
                        q[32 * s + 4 * c + e] = byte & 0x0f;
                        q[32 * s + 16 + 4 * c + e] = byte >> 4;
                    }
                }
            }
        }
        QFormat::Q6_K => {
            for g in 0..8 {
                let rec = Q6_K_VALUES + g * Q6_K_GROUP;
                for c in 0..4 {
                    for e in 0..4 {
                        let byte = gb[rec + 32 * c + 4 * j + e];
                        let h0 = (gb[rec + 128 + 4 * j + e] >> (2 * c)) & 3;
                        let h1 = (gb[rec + 160 + 4 * j + e] >> (2 * c)) & 3;
                        q[32 * g + 4 * c + e] = (byte & 0x0f) | (h0 << 4);
                        q[32 * g + 16 + 4 * c + e] = (byte >> 4) | (h1 << 4);
                    }
                }
            }
        }
        _ => unreachable!("{format:?} is not a K-quant"),
    }
    q
}

/// Dequantizes row `j` of one group-block into `out` (256 values), with
/// GGML's arithmetic (`d · sc` first, then the value).
pub(super) fn dequantize(format: QFormat, gb: &[u8], j: usize, out: &mut [f32]) {
    let d = f16_at(gb, 2 * j);
    let q = row_values(format, gb, j);
    match format {
        QFormat::Q4_K => {
            let dmin = f16_at(gb, Q4_K_DMIN + 2 * j);
            for s in 0..8 {
                let sc = gb[Q4_K_SC + 8 * s + j];
                let m = gb[Q4_K_MIN + 16 * (s / 2) + 2 * j + s % 2];
                let (d1, m1) = (d * sc as f32, dmin * m as f32);
                for i in 32 * s..32 * s + 32 {
                    out[i] = d1 * q[i] as f32 - m1;
                }
            }
        }
        QFormat::Q6_K => {
            for s in 0..16 {
                let ds = d * (gb[Q6_K_SC + 8 * s + j] as i8) as f32;
                for i in 16 * s..16 * s + 16 {
                    out[i] = ds * (q[i] as i32 - 32) as f32;
                }
            }
        }
        _ => unreachable!("{format:?} is not a K-quant"),
    }
}

/// `out[j]` = row j of `group` (all its group-blocks) · the activation row,
/// with the SIMD kernels' exact steps: per super-block, integer sums with
/// the sub-block scales applied in integers, then one fused multiply-add
/// (and, for Q4_K, one for the mins).
pub(super) fn dot_scalar(format: QFormat, group: &[u8], arow: &[BlockQ8K], out: &mut [f32; GROUP]) {
    let gbb = super::group_block_bytes(format);
    for (j, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (gb, a) in group.chunks_exact(gbb).zip(arow) {
            let q = row_values(format, gb, j);
            let d = f16_at(gb, 2 * j);
            match format {
                QFormat::Q4_K => {
                    let (mut isum, mut msum) = (0i32, 0i32);
                    for s in 0..8 {
                        let dot: i32 = (32 * s..32 * s + 32)
                            .map(|i| q[i] as i32 * a.qs[i] as i32)
                            .sum();
                        isum += gb[Q4_K_SC + 8 * s + j] as i32 * dot;
                        let m = gb[Q4_K_MIN + 16 * (s / 2) + 2 * j + s % 2];
                        msum += m as i32 * a.bsums32[s] as i32;
                    }
                    let dmin = f16_at(gb, Q4_K_DMIN + 2 * j);
                    acc = (isum as f32).mul_add(d * a.d, acc);
                    acc = (-(msum as f32)).mul_add(dmin * a.d, acc);
                }
                QFormat::Q6_K => {
                    let (mut isum, mut corr) = (0i32, 0i32);
                    for s in 0..16 {
                        let dot: i32 = (16 * s..16 * s + 16)
                            .map(|i| q[i] as i32 * a.qs[i] as i32)
                            .sum();
                        let sc = (gb[Q6_K_SC + 8 * s + j] as i8) as i32;
                        isum += sc * dot;
                        corr += sc * a.bsums[s] as i32;
                    }
                    acc = ((isum - 32 * corr) as f32).mul_add(d * a.d, acc);
                }
                _ => unreachable!("{format:?} is not a K-quant"),
            }
        }
        *o = acc;
    }
}
