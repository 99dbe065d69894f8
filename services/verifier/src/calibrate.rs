//! The verify cost curve of this machine: one forward over k new tokens at
//! a fixed context, relative to k = 1. Drafters size their trees from it,
//! so it must come from the hardware the verifier actually runs on.

use std::time::Instant;

use specmesh_model::{Block, Model};

/// Block sizes measured.
pub const KS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Measures the curve at `context` tokens, median of `reps` runs per k.
/// Costs are made non-decreasing (timing noise can invert neighbours).
pub fn measure(model: &Model, context: usize, reps: usize) -> anyhow::Result<Vec<(usize, f64)>> {
    let context = context.min(
        model
            .config()
            .max_context
            .saturating_sub(KS[KS.len() - 1] + 1),
    );
    let tokens: Vec<u32> = (0..context.max(1))
        .map(|i| 1000 + (i as u32 * 7919) % 20_000)
        .collect();
    let mut seq = model.new_sequence();
    model.forward(
        &mut seq,
        &Block::chain(tokens.clone(), 0)?.last_logits_only(),
    )?;
    seq.commit(&(0..tokens.len()).collect::<Vec<_>>())?;
    let mut times = Vec::new();
    for &k in &KS {
        let block = Block::chain(tokens[..k.min(tokens.len())].to_vec(), seq.len())?;
        // One untimed run warms caches and scratch buffers.
        model.forward(&mut seq, &block)?;
        seq.discard();
        let mut t: Vec<f64> = (0..reps.max(1))
            .map(|_| {
                let t0 = Instant::now();
                let r = model.forward(&mut seq, &block);
                let dt = t0.elapsed().as_secs_f64();
                seq.discard();
                r.map(|_| dt)
            })
            .collect::<Result<_, _>>()?;
        t.sort_by(f64::total_cmp);
        times.push((k, t[t.len() / 2]));
    }
    let base = times[0].1;
    let mut curve = Vec::with_capacity(times.len());
    let mut last = 1.0f64;
    for (k, t) in times {
        let rel = if k == 1 { 1.0 } else { (t / base).max(last) };
        curve.push((k, rel));
        last = rel;
    }
    Ok(curve)
}
