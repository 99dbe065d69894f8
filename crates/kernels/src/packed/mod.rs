//! Weights repacked at load time, losslessly, into groups of 8 rows so that
//! one 256-bit register holds the same 4 input positions of 8 output rows.
//!
//! With that layout a `vpdpbusd` (or `vpmaddubsw`) of the weight register
//! against 4 broadcast activation bytes adds to each 32-bit lane the partial
//! dot product of a different output row: no horizontal sums, and the 8
//! rows' scales load as one vector (`vcvtph2ps`). A tile of 8 rows × T
//! activation rows unpacks each weight byte once for all T rows. This is the
//! layout llama.cpp uses for its repacked CPU kernels, applied to the
//! formats of our GGUFs. Rows are padded with zero blocks to a multiple of 8.
//!
//! The 32-element formats (Q4_1, Q5_0, Q8_0) are laid out in
//! [`blocks32`], the K-quants (Q4_K, Q6_K) in [`kquant`]; each module's doc
//! draws its group-block. The kernels over these layouts are grouped by
//! instruction set: `x86` (AVX2 and AVX-VNNI group kernels, and the
//! AVX-512 VNNI pair kernels: `x86::kquant`, `x86::blocks32_512`,
//! `x86::kquant_512`) and `amx` (AMX-INT8 tile kernels), each chosen at run
//! time by measurement (`crate::width_plan`, `crate::tile_plan`).

use crate::act::QuantizedRows;
use crate::format::QFormat;

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub(crate) mod blocks32;
pub(crate) mod kquant;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// Rows per group.
pub(crate) const GROUP: usize = 8;

/// Bytes of one group-block (8 rows × one block of the format).
pub(crate) const fn group_block_bytes(format: QFormat) -> usize {
    match format {
        QFormat::Q4_1 => blocks32::Q4_1_GBB,
        QFormat::Q5_0 => blocks32::Q5_0_GBB,
        QFormat::Q8_0 => blocks32::Q8_0_GBB,
        QFormat::Q4_K => kquant::Q4_K_GBB,
        QFormat::Q6_K => kquant::Q6_K_GBB,
        QFormat::Q4_0 => blocks32::Q4_0_GBB,
    }
}

/// Repacks GGML row-major blocks (`rows × cols`) into groups of 8 rows.
pub(crate) fn pack(format: QFormat, rows: usize, cols: usize, src: &[u8]) -> Vec<u8> {
    let nb = cols / format.block_len();
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
                    continue; // zero padding: zero scales, zero values
                }
                let blk = &src[(row * nb + b) * bb..][..bb];
                match format {
                    QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q8_0 => {
                        blocks32::pack_row(format, blk, j, dst)
                    }
                    QFormat::Q4_K | QFormat::Q6_K => kquant::pack_row(format, blk, j, dst),
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
    let nb = cols / format.block_len();
    let gbb = group_block_bytes(format);
    let (g, j) = (row / GROUP, row % GROUP);
    for (b, out) in out.chunks_exact_mut(format.block_len()).enumerate() {
        let gb = &data[(g * nb + b) * gbb..][..gbb];
        match format {
            QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q8_0 => {
                blocks32::dequantize(format, gb, j, out)
            }
            QFormat::Q4_K | QFormat::Q6_K => kquant::dequantize(format, gb, j, out),
        }
    }
}

/// Portable kernel over a packed group: `out[t][j]` = row (8g + j) · act row
/// (r0 + t). The K-quant, Q5_0 and Q4_0 kernels here compute the very operations
/// of the SIMD ones (exact integer sums, the same fused float steps), so
/// their results are bit-identical on every ISA; Q4_1 and Q8_0 keep the
/// accumulation structure but not the bits.
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
    let nb = cols / format.block_len();
    let gbb = group_block_bytes(format);
    let group = &data[g * nb * gbb..(g + 1) * nb * gbb];
    for (ti, out) in out.iter_mut().enumerate().take(t) {
        match format {
            QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q8_0 => {
                blocks32::dot_scalar(format, group, acts.row(r0 + ti), out)
            }
            QFormat::Q4_K | QFormat::Q6_K => {
                kquant::dot_scalar(format, group, acts.row_k(r0 + ti), out)
            }
        }
    }
}
