//! The KV cache in f16 against f32: one forward of `K` tokens on `CTX`
//! committed tokens (zero K/V, imported: a forward's cost does not depend on
//! the values), the two types interleaved per repetition in one process so
//! that the VM's drift stays out of the ratio.
//!
//! `CTX=4096 K=1 REPS=9 cargo run --release -p specmesh-model --example kv_ab -- MODEL.gguf [THREADS]`
use std::time::Instant;

use specmesh_model::{Block, KvDtype, LoadOptions, Model};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: kv_ab MODEL.gguf [THREADS]");
    let threads = std::env::args().nth(2).map(|t| t.parse().expect("threads"));
    let (ctx, k, reps) = (env("CTX", 4096), env("K", 1), env("REPS", 9));
    let opts = LoadOptions {
        threads,
        ..LoadOptions::default()
    };
    let base = Model::load(path.as_ref(), &opts).expect("loading the model");
    let models = [KvDtype::F32, KvDtype::F16].map(|d| base.with_kv_dtype(d));
    let mut seqs: Vec<_> = models
        .iter()
        .map(|m| {
            let mut s = m.new_sequence();
            s.import(&vec![0u8; ctx * s.bytes_per_token()])
                .expect("context");
            s
        })
        .collect();
    let block = Block::chain((0..k as u32).map(|i| 1000 + i).collect(), ctx).expect("block");
    let mut t = [Vec::new(), Vec::new()];
    for _ in 0..reps {
        for (i, (m, s)) in models.iter().zip(seqs.iter_mut()).enumerate() {
            let t0 = Instant::now();
            m.forward(s, &block).expect("forward");
            t[i].push(t0.elapsed().as_secs_f64() * 1e3);
            s.discard();
        }
    }
    for v in &mut t {
        v.sort_by(f64::total_cmp);
    }
    let median = |v: &[f64]| v[v.len() / 2];
    println!(
        "context {ctx} k={k}: f32 {:.2} ms (fastest {:.2}), f16 {:.2} ms (fastest {:.2}), f16/f32 {:.3}",
        median(&t[0]),
        t[0][0],
        median(&t[1]),
        t[1][0],
        median(&t[1]) / median(&t[0])
    );
}
