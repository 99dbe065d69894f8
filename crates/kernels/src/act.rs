//! Activation rows quantized to int8 blocks (GGML's Q8_1 idea, with f32
//! scales), the left operand of every quantized matmul.
//!
//! Each row is quantized on its own, from its own values only, so a row's
//! int8 image never depends on which other rows are in the batch.

use half::f16;

use crate::format::BLOCK;

/// One 32-element block of a quantized activation row.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(16))]
pub struct BlockQ8 {
    /// Scale: element i ≈ d · qs\[i\].
    pub d: f32,
    /// d · Σ qs, the block sum that Q4_1's offset `m` multiplies.
    pub s: f32,
    /// Σ qs as an integer, for Q4_0's −8 bias.
    pub qsum: i32,
    _pad: i32,
    pub qs: [i8; BLOCK],
}

/// `rows` activation rows of `cols` elements, quantized block-wise.
///
/// The buffer is reused across calls ([`QuantizedRows::quantize`] resizes in
/// place) so the decode loop does not allocate.
#[derive(Clone, Debug, Default)]
pub struct QuantizedRows {
    rows: usize,
    blocks_per_row: usize,
    blocks: Vec<BlockQ8>,
}

impl QuantizedRows {
    /// Quantizes `x` (`rows × cols`, row-major) into `self`.
    ///
    /// # Panics
    /// If `cols` is not a multiple of 32 or `x.len()` is not a multiple of
    /// `cols`; callers check shapes when the weights are loaded.
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        assert!(
            cols.is_multiple_of(BLOCK) && x.len().is_multiple_of(cols),
            "bad activation shape"
        );
        self.rows = x.len() / cols;
        self.blocks_per_row = cols / BLOCK;
        self.blocks
            .resize(self.rows * self.blocks_per_row, BlockQ8::default());
        for (chunk, blk) in x.chunks_exact(BLOCK).zip(self.blocks.iter_mut()) {
            quantize_block(chunk, blk);
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.blocks_per_row * BLOCK
    }

    /// The blocks of row `r`.
    #[inline(always)]
    pub fn row(&self, r: usize) -> &[BlockQ8] {
        &self.blocks[r * self.blocks_per_row..(r + 1) * self.blocks_per_row]
    }
}

/// GGML's `quantize_row_q8_1`: scale from the block maximum, values rounded
/// to nearest, and the scale and block sum stored through f16 as GGML's
/// block format does. Keeping GGML's exact recipe keeps our logits within
/// rounding noise of llama.cpp's on the same GGUF, which users compare to.
#[inline]
fn quantize_block(x: &[f32], out: &mut BlockQ8) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut qsum = 0i32;
    for (q, v) in out.qs.iter_mut().zip(x) {
        // |v · id| <= 127 by construction; round() is half-away-from-zero.
        let r = (v * id).round() as i32;
        *q = r as i8;
        qsum += r;
    }
    out.d = f16::from_f32(d).to_f32();
    out.qsum = qsum;
    out.s = f16::from_f32(d * qsum as f32).to_f32();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13)
            .collect();
        let mut q = QuantizedRows::default();
        q.quantize(&x, 64);
        for (b, chunk) in q.row(0).iter().zip(x.chunks(32)) {
            for (qi, v) in b.qs.iter().zip(chunk) {
                // d is stored through f16 (relative error 2^-11).
                assert!((b.d * *qi as f32 - v).abs() <= b.d * 0.5 + b.d * 127.0 / 1024.0 + 1e-6);
            }
        }
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let mut q = QuantizedRows::default();
        q.quantize(&[0.0; 32], 32);
        assert_eq!(q.row(0)[0].d, 0.0);
        assert!(q.row(0)[0].qs.iter().all(|&v| v == 0));
    }
}
