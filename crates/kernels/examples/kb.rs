//! Kernel micro-benchmark: one Q4_1 576×1536 layer (SmolLM2's FFN shape)
//! for k = 1, 4, 8, 16 activation rows on every supported ISA.
//! `T=2 cargo run --release -p specmesh-kernels --example kb` (T = threads).

use specmesh_kernels::*;
use std::time::Instant;
fn main() {
    let (rows, cols) = (1536usize, 576usize);
    let fmt = QFormat::Q4_1;
    let mut data = vec![0u8; rows * fmt.row_bytes(cols)];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    for blk in data.chunks_exact_mut(20) {
        blk[0] = 0;
        blk[1] = 0x20;
        blk[2] = 0;
        blk[3] = 0xa0;
    }
    let w = QMatrix::new(rows, cols, Weights::Quant { format: fmt, data }).unwrap();
    let threads: usize = std::env::var("T")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let pool = ThreadPool::new(threads);
    for isa in Isa::ALL.into_iter().filter(|i| i.supported()) {
        for k in [1usize, 4, 8, 16] {
            let x: Vec<f32> = (0..k * cols).map(|i| (i % 13) as f32 - 6.0).collect();
            let mut out = vec![0.0; k * rows];
            let mut s = QuantizedRows::default();
            let n = 2000 / k;
            let t = Instant::now();
            for _ in 0..n {
                w.forward(&x, &mut s, &mut out, isa, &pool);
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            println!(
                "{isa} k={k} {us:.1} us  ({:.1} GMAC/s)",
                (rows * cols * k) as f64 / us / 1e3
            );
        }
    }
}
