//! Portable reference kernels: per block, an exact i32 dot product scaled
//! into an f32 accumulator.

use super::{Out, TileFn};
use crate::act::QuantizedRows;
use crate::format::{BLOCK, QFormat, f16_at};

pub(super) fn tile_fn(fmt: QFormat) -> TileFn {
    match fmt {
        QFormat::Q4_0 => q4_0,
        QFormat::Q4_1 => q4_1,
        QFormat::Q8_0 => q8_0,
        _ => unreachable!("{fmt:?} is always packed"),
    }
}

fn unpack_nibbles(qs: &[u8]) -> [i32; BLOCK] {
    let mut w = [0i32; BLOCK];
    for j in 0..16 {
        w[j] = (qs[j] & 0x0f) as i32;
        w[j + 16] = (qs[j] >> 4) as i32;
    }
    w
}

fn idot(w: &[i32; BLOCK], a: &[i8; BLOCK]) -> i32 {
    w.iter().zip(a).map(|(&w, &a)| w * a as i32).sum()
}

fn q4_1(w: &[u8], rb: usize, r: usize, acts: &QuantizedRows, r0: usize, t: usize, out: &mut Out) {
    for (j, out) in out.iter_mut().enumerate().take(r) {
        let w = &w[j * rb..(j + 1) * rb];
        for (i, o) in out.iter_mut().enumerate().take(t) {
            let row = acts.row(r0 + i);
            let (mut acc, mut macc) = (0.0f32, 0.0f32);
            for (blk, a) in w.chunks_exact(QFormat::Q4_1.block_bytes()).zip(row) {
                let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
                let q = unpack_nibbles(&blk[4..20]);
                acc += idot(&q, &a.qs) as f32 * (d * a.d);
                macc += m * a.s;
            }
            *o = acc + macc;
        }
    }
}

fn q4_0(w: &[u8], rb: usize, r: usize, acts: &QuantizedRows, r0: usize, t: usize, out: &mut Out) {
    for (j, out) in out.iter_mut().enumerate().take(r) {
        let w = &w[j * rb..(j + 1) * rb];
        for (i, o) in out.iter_mut().enumerate().take(t) {
            let row = acts.row(r0 + i);
            let mut acc = 0.0f32;
            for (blk, a) in w.chunks_exact(QFormat::Q4_0.block_bytes()).zip(row) {
                let q = unpack_nibbles(&blk[2..18]);
                acc += (idot(&q, &a.qs) - 8 * a.qsum) as f32 * (f16_at(blk, 0) * a.d);
            }
            *o = acc;
        }
    }
}

fn q8_0(w: &[u8], rb: usize, r: usize, acts: &QuantizedRows, r0: usize, t: usize, out: &mut Out) {
    for (j, out) in out.iter_mut().enumerate().take(r) {
        let w = &w[j * rb..(j + 1) * rb];
        for (i, o) in out.iter_mut().enumerate().take(t) {
            let row = acts.row(r0 + i);
            let mut acc = 0.0f32;
            for (blk, a) in w.chunks_exact(QFormat::Q8_0.block_bytes()).zip(row) {
                let isum: i32 = blk[2..34]
                    .iter()
                    .zip(&a.qs)
                    .map(|(&w, &a)| (w as i8) as i32 * a as i32)
                    .sum();
                acc += isum as f32 * (f16_at(blk, 0) * a.d);
            }
            *o = acc;
        }
    }
}
