//! The concurrency sweep: `n` clients at once, speculation off and auto in
//! alternating waves.
//!
//! A wave is `n` requests launched together; its time is until the last one
//! ends. Waves alternate off / auto over the same prompts, so drift hits both
//! alike. Aggregate tok/s is every token of a configuration over the sum of
//! its wave times. Prompts are cycled when there are fewer than `n`; a
//! repeated prompt gets its own tenant so the drafter cannot recall the
//! earlier answer.

use anyhow::Result;
use serde::Serialize;
use specmesh_proto::v1::generation_client::GenerationClient;
use std::time::Instant;
use tonic::transport::Channel;

use super::gateway::request;
use super::{Config, Run};
use crate::specbench::Question;

#[derive(Clone, Debug, Serialize)]
pub struct Wave {
    pub concurrency: usize,
    pub config: Config,
    pub index: usize,
    pub wall_seconds: f64,
    pub runs: Vec<Run>,
}

/// The prompts of wave `index` at concurrency `n`, each with its repeat
/// count (0 the first time a prompt is used at this level).
pub fn wave_prompts(len: usize, n: usize, index: usize) -> Vec<(usize, usize)> {
    (0..n)
        .map(|j| {
            let k = index * n + j;
            (k % len, k / len)
        })
        .collect()
}

/// How many waves cover every prompt once at concurrency `n`.
pub fn waves(len: usize, n: usize) -> usize {
    len.div_ceil(n)
}

pub async fn wave(
    client: &GenerationClient<Channel>,
    questions: &[Question],
    n: usize,
    index: usize,
    config: Config,
    max_new: u32,
    tenant: &str,
) -> Result<Wave> {
    let t0 = Instant::now();
    let tasks: Vec<_> = wave_prompts(questions.len(), n, index)
        .into_iter()
        .map(|(q, repeat)| {
            let mut client = client.clone();
            let q = questions[q].clone();
            let tenant = format!("{tenant}-c{n}-r{repeat}");
            tokio::spawn(async move { request(&mut client, &q, config, max_new, &tenant).await })
        })
        .collect();
    let mut runs = Vec::with_capacity(n);
    for t in tasks {
        runs.push(t.await??);
    }
    Ok(Wave {
        concurrency: n,
        config,
        index,
        wall_seconds: t0.elapsed().as_secs_f64(),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_cover_every_prompt_and_mark_repeats() {
        assert_eq!(waves(28, 16), 2);
        assert_eq!(waves(28, 4), 7);
        let all: Vec<_> = (0..waves(28, 16))
            .flat_map(|w| wave_prompts(28, 16, w))
            .collect();
        assert_eq!(all.len(), 32);
        for q in 0..28 {
            assert!(all.contains(&(q, 0)), "prompt {q} never ran");
        }
        // The 4 that fill the last wave are second uses.
        assert_eq!(all.iter().filter(|(_, r)| *r == 1).count(), 4);
        assert_eq!(wave_prompts(3, 8, 0).last(), Some(&(1, 2)));
    }
}
