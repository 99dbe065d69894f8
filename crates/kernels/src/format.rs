//! Weight block formats, byte-compatible with GGML's so that GGUF tensor data
//! is read as-is (and, for the packed kernels, only reordered).
//!
//! | format | block | bytes | value of element i                                   |
//! |--------|-------|-------|------------------------------------------------------|
//! | Q4_0   | 32    | 18    | d · (q_i − 8), q_i a 4-bit nibble                     |
//! | Q4_1   | 32    | 20    | d · q_i + m                                           |
//! | Q5_0   | 32    | 22    | d · (q_i − 16), q_i 4 bits + a fifth bit from `qh`     |
//! | Q8_0   | 32    | 34    | d · q_i, q_i an i8                                    |
//! | Q4_K   | 256   | 144   | d · sc_j · q_i − dmin · m_j, 8 sub-blocks j of 32, 6-bit sc/m |
//! | Q6_K   | 256   | 210   | d · sc_j · (q_i − 32), 16 sub-blocks j of 16, i8 sc, 6-bit q |
//!
//! Nibbles of the 32-blocks are packed as in GGML: byte j holds element j in
//! its low nibble and element j + 16 in its high nibble. d, m and dmin are
//! little-endian f16. The K-quant layouts are GGML's `block_q4_K` and
//! `block_q6_K` (see [`q4_k_scale_min`] and [`QFormat::dequantize_row`]).

use half::f16;

/// Elements per quantization block of the 32-element formats, and per
/// activation block of their kernels.
pub const BLOCK: usize = 32;

/// Elements per super-block of the K-quant formats (GGML's `QK_K`).
pub const SUPER_BLOCK: usize = 256;

/// Quantized weight formats with native kernels (named as GGML names them).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4_K,
    Q6_K,
}

/// A weight buffer whose size does not match its declared shape.
#[derive(Debug, thiserror::Error)]
pub enum WeightLayoutError {
    #[error("weight row length {cols} is not a multiple of {format:?}'s block size {block}")]
    Unaligned {
        format: QFormat,
        cols: usize,
        block: usize,
    },
    #[error("weight data has {got} bytes, expected {expected} for {rows}x{cols} {format:?}")]
    Size {
        format: QFormat,
        rows: usize,
        cols: usize,
        got: usize,
        expected: usize,
    },
    #[error("weight data has {got} values, expected {expected} for {rows}x{cols} f32")]
    F32Size {
        rows: usize,
        cols: usize,
        got: usize,
        expected: usize,
    },
}

impl QFormat {
    /// Elements of one block.
    pub const fn block_len(self) -> usize {
        match self {
            QFormat::Q4_K | QFormat::Q6_K => SUPER_BLOCK,
            _ => BLOCK,
        }
    }

    /// Bytes of one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
            QFormat::Q5_0 => 22,
            QFormat::Q8_0 => 34,
            QFormat::Q4_K => 144,
            QFormat::Q6_K => 210,
        }
    }

    /// Whether the kernels for this format take activations quantized in
    /// 256-element blocks ([`crate::BlockQ8K`], GGML's Q8_K) instead of
    /// 32-element ones: the K-quants, whose integer sums run over a whole
    /// super-block before one float multiply.
    pub const fn super_block_activations(self) -> bool {
        matches!(self, QFormat::Q4_K | QFormat::Q6_K)
    }

    /// Bytes of one row of `cols` elements.
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_len() * self.block_bytes()
    }

    /// Dequantizes one row into `out` (`out.len()` elements), exactly as
    /// GGML's `dequantize_row_*` does.
    pub fn dequantize_row(self, row: &[u8], out: &mut [f32]) {
        debug_assert_eq!(row.len(), self.row_bytes(out.len()));
        for (blk, out) in row
            .chunks_exact(self.block_bytes())
            .zip(out.chunks_exact_mut(self.block_len()))
        {
            match self {
                QFormat::Q4_0 => {
                    let d = f16_at(blk, 0);
                    for j in 0..16 {
                        let b = blk[2 + j];
                        out[j] = d * ((b & 0x0f) as f32 - 8.0);
                        out[j + 16] = d * ((b >> 4) as f32 - 8.0);
                    }
                }
                QFormat::Q4_1 => {
                    let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
                    for j in 0..16 {
                        let b = blk[4 + j];
                        out[j] = d * (b & 0x0f) as f32 + m;
                        out[j + 16] = d * (b >> 4) as f32 + m;
                    }
                }
                QFormat::Q5_0 => {
                    let d = f16_at(blk, 0);
                    let q = q5_0_values(blk);
                    for (o, q) in out.iter_mut().zip(q) {
                        *o = d * (q as i32 - 16) as f32;
                    }
                }
                QFormat::Q8_0 => {
                    let d = f16_at(blk, 0);
                    for j in 0..BLOCK {
                        out[j] = d * (blk[2 + j] as i8) as f32;
                    }
                }
                QFormat::Q4_K => {
                    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                    let scales: &[u8; 12] = blk[4..16].try_into().unwrap();
                    let q = q4_k_values(blk);
                    for (j, (out, q)) in
                        out.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate()
                    {
                        let (sc, m) = q4_k_scale_min(scales, j);
                        let (d1, m1) = (d * sc as f32, dmin * m as f32);
                        for (o, &q) in out.iter_mut().zip(q) {
                            *o = d1 * q as f32 - m1;
                        }
                    }
                }
                QFormat::Q6_K => {
                    let d = f16_at(blk, 208);
                    let q = q6_k_values(blk);
                    for (j, (out, q)) in
                        out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate()
                    {
                        let sc = blk[192 + j] as i8;
                        let ds = d * sc as f32;
                        for (o, &q) in out.iter_mut().zip(q) {
                            *o = ds * (q as i32 - 32) as f32;
                        }
                    }
                }
            }
        }
    }
}

/// The 5-bit values (0..32) of one Q5_0 block, in element order.
pub(crate) fn q5_0_values(blk: &[u8]) -> [u8; BLOCK] {
    let qh = u32::from_le_bytes(blk[2..6].try_into().unwrap());
    let mut q = [0u8; BLOCK];
    for j in 0..16 {
        let b = blk[6 + j];
        q[j] = (b & 0x0f) | (((qh >> j) & 1) << 4) as u8;
        q[j + 16] = (b >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
    }
    q
}

/// The 4-bit values of one Q4_K super-block, in element order. GGML stores
/// sub-blocks 2p and 2p + 1 in the low and high nibbles of the same 32 bytes.
pub(crate) fn q4_k_values(blk: &[u8]) -> [u8; SUPER_BLOCK] {
    let qs = &blk[16..144];
    let mut q = [0u8; SUPER_BLOCK];
    for p in 0..4 {
        for l in 0..32 {
            let b = qs[32 * p + l];
            q[64 * p + l] = b & 0x0f;
            q[64 * p + 32 + l] = b >> 4;
        }
    }
    q
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K super-block
/// (GGML's `get_scale_min_k4`).
pub(crate) fn q4_k_scale_min(scales: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The 6-bit values (0..64, before the −32) of one Q6_K super-block, in
/// element order: low 4 bits from `ql`, high 2 bits from `qh`.
pub(crate) fn q6_k_values(blk: &[u8]) -> [u8; SUPER_BLOCK] {
    let mut q = [0u8; SUPER_BLOCK];
    for half in 0..2 {
        let ql = &blk[64 * half..64 * half + 64];
        let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
        let y = &mut q[128 * half..128 * half + 128];
        for l in 0..32 {
            y[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
            y[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// Reads the little-endian f16 at byte `at` of a block as f32.
#[inline(always)]
pub(crate) fn f16_at(blk: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([blk[at], blk[at + 1]])).to_f32()
}
