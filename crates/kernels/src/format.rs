//! Weight block formats, byte-compatible with GGML's so that GGUF tensor data
//! is used as-is, without a copy into another layout.
//!
//! | format | block | bytes | value of element i               |
//! |--------|-------|-------|----------------------------------|
//! | Q4_0   | 32    | 18    | d · (q_i − 8), q_i a 4-bit nibble |
//! | Q4_1   | 32    | 20    | d · q_i + m                       |
//! | Q8_0   | 32    | 34    | d · q_i, q_i an i8                |
//!
//! Nibbles are packed as in GGML: byte j holds element j in its low nibble and
//! element j + 16 in its high nibble. d and m are little-endian f16.

use half::f16;

/// Elements per quantization block, for every quantized format here.
pub const BLOCK: usize = 32;

/// Quantized weight formats with native kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    Q4_0,
    Q4_1,
    Q8_0,
}

/// A weight buffer whose size does not match its declared shape.
#[derive(Debug, thiserror::Error)]
pub enum WeightLayoutError {
    #[error("weight row length {cols} is not a multiple of the block size {BLOCK}")]
    Unaligned { cols: usize },
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
    /// Bytes of one 32-element block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
            QFormat::Q8_0 => 34,
        }
    }

    /// Bytes of one row of `cols` elements.
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / BLOCK * self.block_bytes()
    }

    /// Dequantizes one row into `out` (`out.len()` elements).
    pub fn dequantize_row(self, row: &[u8], out: &mut [f32]) {
        debug_assert_eq!(row.len(), self.row_bytes(out.len()));
        for (blk, out) in row
            .chunks_exact(self.block_bytes())
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let d = f16_at(blk, 0);
            match self {
                QFormat::Q4_0 => {
                    for j in 0..16 {
                        let b = blk[2 + j];
                        out[j] = d * ((b & 0x0f) as f32 - 8.0);
                        out[j + 16] = d * ((b >> 4) as f32 - 8.0);
                    }
                }
                QFormat::Q4_1 => {
                    let m = f16_at(blk, 2);
                    for j in 0..16 {
                        let b = blk[4 + j];
                        out[j] = d * (b & 0x0f) as f32 + m;
                        out[j + 16] = d * (b >> 4) as f32 + m;
                    }
                }
                QFormat::Q8_0 => {
                    for j in 0..BLOCK {
                        out[j] = d * (blk[2 + j] as i8) as f32;
                    }
                }
            }
        }
    }
}

/// Reads the little-endian f16 at byte `at` of a block as f32.
#[inline(always)]
pub(crate) fn f16_at(blk: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([blk[at], blk[at + 1]])).to_f32()
}
