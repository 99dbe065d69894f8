//! A node's candidate children from one row of draft logits, and sampling
//! them without replacement.
//!
//! Candidates are the top of the draft's distribution, most likely first
//! (ties: lower id first, as everywhere in specmesh). Greedy requests score
//! them with the plain softmax; sampling requests use the request's
//! processed distribution (temperature → top-k → top-p), truncated to a
//! fixed support and renormalised: that sparse q is what the children are
//! drawn from and what travels with the tree as its `DraftDist`.
//!
//! This runs once per expanded node, so the vocabulary is scanned, never
//! sorted: one streaming pass keeps the few candidates, one vectorised pass
//! computes the softmax normaliser (`specmesh_numeric`'s, shared with the
//! sampler and the verifier).

use specmesh_numeric::softmax_normaliser;
use specmesh_sampling::{SamplingParams, uniform};

/// Mixed into the request seed so the drafter's randomness is independent
/// of the target's, which draws `uniform(seed, position)` for the same
/// request. ("draftmdl" in ASCII.)
const DRAFT_DOMAIN: u64 = 0x6472_6166_746d_646c;

/// The `n` largest logits of `row` as (id, logit), largest first, lower id
/// first on ties: one streaming pass, since `n` is tiny next to the
/// vocabulary.
fn top_n(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    let mut floor = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        // Ids arrive in increasing order, so an equal logit never displaces
        // an earlier one.
        if top.len() == n && v <= floor {
            continue;
        }
        let at = top.partition_point(|e| e.1 >= v);
        top.insert(at, (i as u32, v));
        top.truncate(n);
        if top.len() == n {
            floor = top[n - 1].1;
        }
    }
    top
}

/// The ids of the `k` largest logits (any order), for a top-k cut larger
/// than the candidate list.
fn top_k_ids(row: &[f32], k: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    if k > 0 && k < ids.len() {
        let by_logit =
            |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        ids.select_nth_unstable_by(k - 1, by_logit);
        ids.truncate(k);
    }
    ids
}

/// `exp((v − max) / t)` in f64: the few candidates' own weights, exact;
/// only the normaliser over the whole row uses the vectorisable exponential.
fn weight(v: f32, max: f32, t: f32) -> f64 {
    ((v as f64 - max as f64) / t as f64).exp()
}

/// The `n` most likely tokens with their plain softmax probabilities (not
/// renormalised: scores estimate the chance the path is right). `None` when
/// the row is not finite.
pub(crate) fn greedy_candidates(row: &[f32], n: usize) -> Option<Vec<(u32, f32)>> {
    if row.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let top = top_n(row, n);
    let max = top.first()?.1;
    let z = softmax_normaliser(row, max, 1.0);
    Some(
        top.into_iter()
            .map(|(t, v)| (t, (weight(v, max, 1.0) / z) as f32))
            .collect(),
    )
}

/// The request's processed distribution (temperature → top-k → top-p, as
/// [`SamplingParams::distribution`]) truncated to its `n` most likely
/// tokens and renormalised; zero-probability tokens are dropped. `None`
/// when the row is not finite or `params` is greedy.
pub(crate) fn sampled_candidates(
    row: &[f32],
    params: &SamplingParams,
    n: usize,
) -> Option<Vec<(u32, f32)>> {
    let t = params.temperature;
    if !t.is_finite() || t <= 0.0 || row.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let top_k = if params.top_k == 0 {
        row.len()
    } else {
        params.top_k.min(row.len())
    };
    let top = top_n(row, n.min(top_k));
    let max = top.first()?.1;
    // The normaliser runs over the top-k set (the whole row without one).
    let z = if top_k == row.len() {
        softmax_normaliser(row, max, t)
    } else {
        let values: Vec<f32> = if top_k <= n {
            top.iter().map(|e| e.1).collect()
        } else {
            top_k_ids(row, top_k)
                .into_iter()
                .map(|i| row[i as usize])
                .collect()
        };
        softmax_normaliser(&values, max, t)
    };
    let mut probs: Vec<(u32, f64)> = top
        .into_iter()
        .map(|(i, v)| (i, weight(v, max, t) / z))
        .collect();
    if params.top_p < 1.0 {
        let mut acc = 0.0;
        if let Some(cut) = probs.iter().position(|p| {
            acc += p.1;
            acc >= params.top_p as f64
        }) {
            probs.truncate(cut + 1);
        }
    }
    let kept: f64 = probs.iter().map(|p| p.1).sum();
    let out: Vec<(u32, f32)> = probs
        .into_iter()
        .map(|(i, p)| (i, (p / kept) as f32))
        .filter(|e| e.1 > 0.0)
        .collect();
    (!out.is_empty()).then_some(out)
}

/// The key of one node's draws: a function of the request seed, the
/// drafter's step counter and the node, so no two nodes of a session share
/// uniforms and a rerun of the session draws the same trees.
pub(crate) fn node_seed(seed: u64, step: u64, node: usize) -> u64 {
    let mut z = seed ^ DRAFT_DOMAIN;
    for v in [step, node as u64] {
        z = mix(z ^ mix(v.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    }
    z
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Draws `m` distinct entries of `q` without replacement, in draw order:
/// draw j picks from the entries not yet drawn with probability
/// proportional to their q, by inverse CDF on `uniform(seed, j)`. Returns
/// indices into `q`; fewer than `m` only if `q` has fewer positive entries.
pub(crate) fn sample_without_replacement(q: &[(u32, f32)], m: usize, seed: u64) -> Vec<usize> {
    let mut taken = vec![false; q.len()];
    let mut out = Vec::with_capacity(m.min(q.len()));
    for j in 0..m as u64 {
        let left: f64 = q
            .iter()
            .zip(&taken)
            .filter(|(_, t)| !**t)
            .map(|(e, _)| e.1 as f64)
            .sum();
        if left <= 0.0 {
            break;
        }
        let target = uniform(seed, j) * left;
        let mut acc = 0.0;
        let mut pick = None;
        for (i, e) in q.iter().enumerate() {
            if taken[i] || e.1 <= 0.0 {
                continue;
            }
            pick = Some(i);
            acc += e.1 as f64;
            if target < acc {
                break;
            }
        }
        // Rounding may leave `target` above the last sum: take the last
        // positive entry, as `specmesh_sampling::sample` does.
        let Some(i) = pick else { break };
        taken[i] = true;
        out.push(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Vec<f32> {
        (0..200).map(|i| ((i * 37) % 101) as f32 * 0.05).collect()
    }

    #[test]
    fn greedy_candidates_are_the_top_logits_with_softmax_probs() {
        let mut r = row();
        r[7] = 9.0;
        r[3] = 9.0;
        let c = greedy_candidates(&r, 4).unwrap();
        assert_eq!(c[0].0, 3, "ties go to the lower id");
        assert_eq!(c[1].0, 7);
        assert!(c.windows(2).all(|w| w[0].1 >= w[1].1));
        let all: f32 = greedy_candidates(&r, 200)
            .unwrap()
            .iter()
            .map(|e| e.1)
            .sum();
        assert!((all - 1.0).abs() < 1e-4);
        r[5] = f32::NAN;
        assert_eq!(greedy_candidates(&r, 4), None);
    }

    #[test]
    fn sampled_candidates_are_the_processed_distribution_truncated() {
        let r = row();
        for (temp, top_p, top_k) in [
            (1.0, 1.0, 0),
            (0.7, 0.9, 0),
            (1.3, 1.0, 20),
            (0.5, 0.3, 50),
            (0.9, 1.0, 10),
            (0.05, 1.0, 0),
        ] {
            let params = SamplingParams::new(temp, top_p, top_k, 1).unwrap();
            let full = params.distribution(&r);
            let n = 16;
            let got = sampled_candidates(&r, &params, n).unwrap();
            let head = &full[..n.min(full.len())];
            let z: f64 = head.iter().map(|e| e.1).sum();
            assert_eq!(got.len(), head.len(), "{temp} {top_p} {top_k}");
            for (g, w) in got.iter().zip(head) {
                assert_eq!(g.0, w.0);
                assert!((g.1 as f64 - w.1 / z).abs() < 1e-6, "{g:?} vs {w:?}");
            }
        }
        assert_eq!(sampled_candidates(&r, &SamplingParams::greedy(), 4), None);
    }

    #[test]
    fn draws_are_distinct_and_follow_q_without_replacement() {
        let q = [(10u32, 0.5f32), (11, 0.3), (12, 0.2), (13, 0.0)];
        let n = 40_000u64;
        let mut first = [0usize; 4];
        let mut second_after_10 = [0usize; 4];
        let mut after_10 = 0;
        for s in 0..n {
            let picks = sample_without_replacement(&q, 3, node_seed(s, 0, 0));
            assert_eq!(picks.len(), 3, "the zero entry is never drawn");
            let mut sorted = picks.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2]);
            first[picks[0]] += 1;
            if picks[0] == 0 {
                after_10 += 1;
                second_after_10[picks[1]] += 1;
            }
        }
        let check = |count: usize, total: usize, want: f64| {
            let f = count as f64 / total as f64;
            let sd = (want * (1.0 - want) / total as f64).sqrt();
            assert!((f - want).abs() < 5.0 * sd, "{f} vs {want}");
        };
        check(first[0], n as usize, 0.5);
        check(first[1], n as usize, 0.3);
        // Given 10 first, 11 follows with 0.3 / 0.5.
        check(second_after_10[1], after_10, 0.6);
    }

    #[test]
    fn node_seeds_differ_and_are_stable() {
        assert_eq!(node_seed(1, 2, 3), node_seed(1, 2, 3));
        assert_ne!(node_seed(1, 2, 3), node_seed(1, 2, 4));
        assert_ne!(node_seed(1, 2, 3), node_seed(1, 3, 3));
        assert_ne!(node_seed(1, 2, 3), node_seed(2, 2, 3));
    }
}
