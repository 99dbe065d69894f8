//! The verify cost curve: the time of one forward over k new tokens on top
//! of a committed context, for several k. Speculation pays exactly this, so
//! drafters size their trees from it (the verifier measures it at start) and
//! `specmesh bench-model` reports it.

use std::time::Instant;

use crate::block::Block;
use crate::error::Result;
use crate::model::Model;

/// Timings of one block size.
#[derive(Clone, Debug, PartialEq)]
pub struct CostSample {
    pub k: usize,
    /// Median forward time, seconds.
    pub median: f64,
    /// Fastest forward time, seconds: what the forward costs when the
    /// machine is quiet.
    pub fastest: f64,
}

/// `n` deterministic ordinary token ids (no special tokens in a 20k-token
/// vocabulary); `salt` picks another sequence. The cost of a forward does
/// not depend on which tokens it sees.
pub fn ordinary_tokens(n: usize, salt: u64) -> Vec<u32> {
    (0..n as u64)
        .map(|i| (100 + (i.wrapping_mul(2654435761).wrapping_add(salt * 7919)) % 20_000) as u32)
        .collect()
}

/// Measures forwards of k = `ks` new tokens on a `context`-token prefix of
/// ordinary token ids, `reps` times each.
///
/// The k are measured round-robin, one of each per repetition: a shared
/// VM's speed drifts by tens of percent from one minute to the next, and
/// measuring every k in each round keeps that drift out of the ratios.
pub fn measure(
    model: &Model,
    context: usize,
    ks: &[usize],
    reps: usize,
) -> Result<Vec<CostSample>> {
    let context = context.max(1);
    let mut seq = model.new_sequence();
    let prompt = Block::chain(ordinary_tokens(context, 1), 0)?.last_logits_only();
    model.forward(&mut seq, &prompt)?;
    seq.commit(&(0..context).collect::<Vec<_>>())?;
    let blocks = ks
        .iter()
        .map(|&k| Block::chain(ordinary_tokens(k, 3), seq.len()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // Untimed rounds warm caches and scratch buffers, and wake the threads:
    // the first forwards after idle time run ~40% slower.
    for _ in 0..2 {
        for block in &blocks {
            model.forward(&mut seq, block)?;
            seq.discard();
        }
    }
    let mut times = vec![Vec::with_capacity(reps); blocks.len()];
    for _ in 0..reps.max(1) {
        for (block, times) in blocks.iter().zip(&mut times) {
            let t = Instant::now();
            let r = model.forward(&mut seq, block);
            times.push(t.elapsed().as_secs_f64());
            seq.discard();
            r?;
        }
    }
    Ok(ks
        .iter()
        .zip(times)
        .map(|(&k, mut t)| {
            t.sort_by(f64::total_cmp);
            CostSample {
                k,
                median: t[t.len() / 2],
                fastest: t[0],
            }
        })
        .collect())
}
