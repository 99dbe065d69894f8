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
    // ISA=name and KS=1,8 narrow the run.
    let only = std::env::var("ISA").ok();
    let ks: Vec<usize> = std::env::var("KS")
        .ok()
        .map(|v| v.split(',').filter_map(|k| k.parse().ok()).collect())
        .unwrap_or(vec![1, 4, 8, 16]);
    let isas = Isa::ALL
        .into_iter()
        .filter(|i| i.supported() && only.as_deref().is_none_or(|o| o == i.to_string()));
    for isa in isas {
        for &k in &ks {
            let x: Vec<f32> = (0..k * cols).map(|i| (i % 13) as f32 - 6.0).collect();
            let mut out = vec![0.0; k * rows];
            let mut s = QuantizedRows::default();
            // The fastest of many short batches: this VM's timings drift
            // with its neighbours, and the minimum is what the kernel costs.
            let n = (200 / k).max(4);
            let mut us = f64::INFINITY;
            for _ in 0..50 {
                let t = Instant::now();
                for _ in 0..n {
                    w.forward(&x, &mut s, &mut out, isa, &pool);
                }
                us = us.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
            }
            println!(
                "{isa} k={k} {us:.1} us  ({:.1} GMAC/s)",
                (rows * cols * k) as f64 / us / 1e3
            );
        }
    }
}
