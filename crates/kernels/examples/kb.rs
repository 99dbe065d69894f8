//! Kernel micro-benchmark: one weight matrix for k = 1, 4, 8, 16 activation
//! rows on every supported ISA, with random weights of the format.
//!
//! `T=2 cargo run --release -p specmesh-kernels --example kb` (T = threads).
//! `FMT=q4_k ROWS=8960 COLS=1536` picks the format and shape (default: Q4_1
//! 1536×576, SmolLM2's FFN); `ISA=avx2` and `KS=1,8` narrow the run.

use specmesh_kernels::*;
use std::time::Instant;

fn main() {
    let env = |k: &str| std::env::var(k).ok();
    let fmt = match env("FMT").as_deref().unwrap_or("q4_1") {
        "q4_0" => QFormat::Q4_0,
        "q4_1" => QFormat::Q4_1,
        "q5_0" => QFormat::Q5_0,
        "q8_0" => QFormat::Q8_0,
        "q4_k" => QFormat::Q4_K,
        "q6_k" => QFormat::Q6_K,
        other => panic!("unknown FMT {other}"),
    };
    let num = |k: &str, d: usize| env(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (rows, cols) = (num("ROWS", 1536), num("COLS", 576));
    let mut data = vec![0u8; rows * fmt.row_bytes(cols)];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    // Small positive f16 scales where each format keeps them.
    let scale_at: &[usize] = match fmt {
        QFormat::Q4_K => &[0, 2],
        QFormat::Q6_K => &[208],
        QFormat::Q4_1 => &[0, 2],
        _ => &[0],
    };
    for blk in data.chunks_exact_mut(fmt.block_bytes()) {
        for &at in scale_at {
            blk[at] = 0;
            blk[at + 1] = 0x14;
        }
    }
    let w = QMatrix::new(rows, cols, Weights::Quant { format: fmt, data }).unwrap();
    let pool = ThreadPool::new(num("T", 1));
    let only = env("ISA");
    let ks: Vec<usize> = env("KS")
        .map(|v| v.split(',').filter_map(|k| k.parse().ok()).collect())
        .unwrap_or(vec![1, 4, 8, 16]);
    let isas: Vec<Isa> = Isa::ALL
        .into_iter()
        .filter(|i| i.supported() && only.as_deref().is_none_or(|o| o == i.to_string()))
        .collect();
    if isas.contains(&Isa::AmxInt8) {
        // amx-int8 runs tiles for the rows the load-time measurement chose.
        println!("tile plan: {}", tile_plan());
    }
    for isa in isas {
        for &k in &ks {
            let x: Vec<f32> = (0..k * cols).map(|i| (i % 13) as f32 - 6.0).collect();
            let mut out = vec![0.0; k * rows];
            let mut s = QuantizedRows::default();
            // The fastest of many short batches: this VM's timings drift
            // with its neighbours, and the minimum is what the kernel costs.
            // About SECS seconds per k (default 2).
            let secs: f64 = env("SECS").and_then(|v| v.parse().ok()).unwrap_or(2.0);
            let t0 = Instant::now();
            w.forward(&x, &mut s, &mut out, isa, &pool);
            let once = t0.elapsed().as_secs_f64();
            let n = ((0.05 / once) as usize).clamp(1, 200);
            let batches = ((secs / (once * n as f64)) as usize).clamp(3, 50);
            let mut us = f64::INFINITY;
            for _ in 0..batches {
                let t = Instant::now();
                for _ in 0..n {
                    w.forward(&x, &mut s, &mut out, isa, &pool);
                }
                us = us.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
            }
            println!(
                "{fmt:?} {rows}x{cols} {isa} k={k} {us:.1} us  ({:.1} GMAC/s, {:.1} GB/s of weights)",
                (rows * cols * k) as f64 / us / 1e3,
                w.nbytes() as f64 / us / 1e3
            );
        }
    }
}
