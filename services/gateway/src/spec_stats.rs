//! Speculation statistics of one request, summed over every verifier it
//! ran on.

use specmesh_proto::v1::{Committed, SpeculationStats};

/// Counts verify steps and draft tokens as `Committed` events arrive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    verify_steps: u32,
    drafted: u32,
    accepted: u32,
    /// Tokens the target committed, EOS included (see [`Self::to_wire`]).
    committed: u64,
    /// Microseconds the steps waited for the drafter's trees.
    tree_wait_us: u64,
    /// Steps that verified a tree drafted ahead.
    drafted_ahead: u32,
    /// Tokens accepted from what a grammar forced.
    forced: u32,
    /// `histogram[j]`: steps that accepted exactly `j` draft tokens.
    histogram: Vec<u32>,
}

impl SpecStats {
    /// Records one verify step.
    pub fn record(&mut self, step: &Committed) {
        self.verify_steps = self.verify_steps.saturating_add(1);
        self.drafted = self.drafted.saturating_add(step.drafted);
        // A verifier cannot accept more than it drafted; don't let a bad one
        // report an acceptance rate above 1.
        let accepted = step.accepted.min(step.drafted);
        self.accepted = self.accepted.saturating_add(accepted);
        // A draft of at most the server's limit (64 by default) per step.
        let j = (accepted as usize).min(MAX_HISTOGRAM - 1);
        if self.histogram.len() <= j {
            self.histogram.resize(j + 1, 0);
        }
        self.histogram[j] = self.histogram[j].saturating_add(1);
        let eos = u64::from(step.eos);
        self.committed = self
            .committed
            .saturating_add(step.tokens.len() as u64 + eos);
        self.tree_wait_us = self
            .tree_wait_us
            .saturating_add(u64::from(step.tree_wait_us));
        self.drafted_ahead = self
            .drafted_ahead
            .saturating_add(u32::from(step.drafted_ahead));
        self.forced = self
            .forced
            .saturating_add(step.forced.min(step.tokens.len() as u32));
    }

    /// The wire form. `mean_accepted_per_step` is committed tokens per verify
    /// step, counting an EOS as the token its step committed, so plain
    /// decoding reads exactly 1.0 whether it ended on EOS or on length.
    /// Tokens a stop string cut off still count: the target committed them.
    pub fn to_wire(&self) -> SpeculationStats {
        let mean = if self.verify_steps == 0 {
            0.0
        } else {
            self.committed as f64 / f64::from(self.verify_steps)
        };
        SpeculationStats {
            verify_steps: self.verify_steps,
            drafted_tokens: self.drafted,
            accepted_tokens: self.accepted,
            mean_accepted_per_step: mean,
            tree_wait_seconds: self.tree_wait_us as f64 * 1e-6,
            drafted_ahead_steps: self.drafted_ahead,
            forced_tokens: self.forced,
            acceptance_histogram: self.histogram.clone(),
        }
    }
}

/// Buckets of the acceptance histogram: a step's accepted drafts beyond
/// the last are counted in it (a bad verifier cannot grow it unbounded).
const MAX_HISTOGRAM: usize = 1025;

/// The length of the longest common subsequence of `a` and `b`: with `a`
/// a prediction and `b` the output, the prediction's tokens the output used
/// (OpenAI's `accepted_prediction_tokens`). Bit-parallel (Allison and Dix
/// 1986, Hyyrö 2004): `|b| · ⌈|a| / 64⌉` word operations, a few
/// microseconds for a thousand tokens each, where the textbook table would
/// take a million cells.
pub fn common_subsequence(a: &[u32], b: &[u32]) -> usize {
    if a.is_empty() || b.is_empty() {
        return 0;
    }
    let words = a.len().div_ceil(64);
    // Per token of `a`: the positions where it occurs, as bits.
    let mut masks: std::collections::HashMap<u32, Vec<u64>> = std::collections::HashMap::new();
    for (i, &t) in a.iter().enumerate() {
        masks.entry(t).or_insert_with(|| vec![0; words])[i / 64] |= 1 << (i % 64);
    }
    // Zero bits of `v` mark the positions of `a` matched so far.
    let mut v = vec![u64::MAX; words];
    for t in b {
        let Some(m) = masks.get(t) else { continue };
        let mut carry = false;
        for (vw, &mw) in v.iter_mut().zip(m) {
            let u = *vw & mw;
            let (sum, c1) = vw.overflowing_add(u);
            let (sum, c2) = sum.overflowing_add(u64::from(carry));
            carry = c1 || c2;
            *vw = sum | (*vw & !mw);
        }
    }
    let tail = a.len() % 64;
    v.iter()
        .enumerate()
        .map(|(w, &vw)| {
            let valid = if w == words - 1 && tail != 0 {
                (1u64 << tail) - 1
            } else {
                u64::MAX
            };
            (!vw & valid).count_ones() as usize
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(tokens: usize, drafted: u32, accepted: u32, eos: bool) -> Committed {
        Committed {
            step: 0,
            tokens: vec![7; tokens],
            drafted,
            accepted,
            finished: eos,
            eos,
            ..Committed::default()
        }
    }

    #[test]
    fn plain_decoding_is_one_token_per_step() {
        let mut s = SpecStats::default();
        for _ in 0..4 {
            s.record(&step(1, 0, 0, false));
        }
        // The last step generated EOS, which is not in `tokens`.
        s.record(&step(0, 0, 0, true));
        let w = s.to_wire();
        assert_eq!(
            (w.verify_steps, w.drafted_tokens, w.accepted_tokens),
            (5, 0, 0)
        );
        assert_eq!(w.mean_accepted_per_step, 1.0);
    }

    #[test]
    fn speculation_counts_accepted_drafts_plus_the_bonus_token() {
        let mut s = SpecStats::default();
        s.record(&step(4, 8, 3, false));
        s.record(&step(2, 8, 1, false));
        s.record(&step(3, 5, 2, false));
        let w = s.to_wire();
        assert_eq!(
            (w.verify_steps, w.drafted_tokens, w.accepted_tokens),
            (3, 21, 6)
        );
        assert_eq!(w.mean_accepted_per_step, 3.0);
        // Steps by accepted drafts: one each with 1, 2 and 3.
        assert_eq!(w.acceptance_histogram, [0, 1, 1, 1]);
    }

    #[test]
    fn tree_waits_and_drafted_ahead_steps_add_up() {
        let mut s = SpecStats::default();
        for (wait, ahead) in [(1500, false), (0, true), (250, true)] {
            s.record(&Committed {
                tree_wait_us: wait,
                drafted_ahead: ahead,
                ..step(2, 4, 1, false)
            });
        }
        let w = s.to_wire();
        assert!((w.tree_wait_seconds - 0.00175).abs() < 1e-12);
        assert_eq!(w.drafted_ahead_steps, 2);
    }

    #[test]
    fn no_steps_and_bad_counts_do_not_break_the_numbers() {
        assert_eq!(SpecStats::default().to_wire().mean_accepted_per_step, 0.0);
        let mut s = SpecStats::default();
        s.record(&step(1, 2, 9, false));
        s.record(&step(1, u32::MAX, u32::MAX, false));
        let w = s.to_wire();
        assert_eq!(w.drafted_tokens, u32::MAX);
        assert!(w.accepted_tokens <= w.drafted_tokens);
    }

    /// The textbook table, for reference.
    fn lcs_table(a: &[u32], b: &[u32]) -> usize {
        let mut row = vec![0usize; b.len() + 1];
        for &x in a {
            let mut diag = 0;
            for (j, &y) in b.iter().enumerate() {
                let up = row[j + 1];
                row[j + 1] = if x == y { diag + 1 } else { up.max(row[j]) };
                diag = up;
            }
        }
        row[b.len()]
    }

    #[test]
    fn common_subsequence_counts_the_prediction_tokens_used() {
        assert_eq!(common_subsequence(&[], &[1, 2]), 0);
        assert_eq!(common_subsequence(&[1, 2, 3], &[]), 0);
        assert_eq!(common_subsequence(&[1, 2, 3, 4], &[1, 9, 3, 4]), 3);
        assert_eq!(common_subsequence(&[1, 2, 3], &[3, 2, 1]), 1);
        // Across word boundaries, against the table.
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for (la, lb, alphabet) in [
            (63, 70, 4),
            (64, 64, 3),
            (65, 200, 5),
            (300, 257, 8),
            (1, 500, 2),
        ] {
            let a: Vec<u32> = (0..la).map(|_| next() % alphabet).collect();
            let b: Vec<u32> = (0..lb).map(|_| next() % alphabet).collect();
            assert_eq!(common_subsequence(&a, &b), lcs_table(&a, &b), "{la}x{lb}");
        }
    }
}
