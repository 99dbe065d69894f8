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

/// Timings of a 1-token step on one context length.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSample {
    pub context: usize,
    /// Median forward time, seconds.
    pub median: f64,
    /// Fastest forward time, seconds.
    pub fastest: f64,
}

/// Measures a 1-token step on top of each of `contexts` committed tokens,
/// `reps` times each, round-robin (as [`measure`]). The contexts are
/// filled with zero K and V instead of being prefilled: a step's cost does
/// not depend on what the cache holds (no kernel branches on values), and
/// a 16k-token prefill of a 1.5B model takes minutes on a small CPU.
/// Contexts the model cannot hold with one more token are skipped.
pub fn measure_steps(model: &Model, contexts: &[usize], reps: usize) -> Result<Vec<StepSample>> {
    let max = model.config().max_context;
    let mut runs = Vec::new();
    for &context in contexts.iter().filter(|&&c| c < max) {
        let mut seq = model.new_sequence();
        seq.reserve_total(context + 1);
        seq.import(&vec![0u8; context * seq.bytes_per_token()])?;
        let block = Block::chain(ordinary_tokens(1, 5), context)?;
        runs.push((context, seq, block));
    }
    for _ in 0..2 {
        for (_, seq, block) in &mut runs {
            model.forward(seq, block)?;
            seq.discard();
        }
    }
    let mut times = vec![Vec::with_capacity(reps); runs.len()];
    for _ in 0..reps.max(1) {
        for ((_, seq, block), times) in runs.iter_mut().zip(&mut times) {
            let t = Instant::now();
            let r = model.forward(seq, block);
            times.push(t.elapsed().as_secs_f64());
            seq.discard();
            r?;
        }
    }
    Ok(runs
        .iter()
        .zip(times)
        .map(|((context, _, _), mut t)| {
            t.sort_by(f64::total_cmp);
            StepSample {
                context: *context,
                median: t[t.len() / 2],
                fastest: t[0],
            }
        })
        .collect())
}
