//! Recursive rejection sampling without replacement at one node.
//!
//! The node's children `x_1..x_m` were drawn from the draft distribution
//! `q` without replacement, in child order. Following Jeon et al. 2024,
//! "Recursive Speculative Decoding: Accelerating LLM Inference via Sampling
//! Without Replacement" (arXiv 2402.14160), with `p_1 = p` (the target's
//! processed distribution) and `q_1 = q`, candidate `k` is accepted with
//! probability `min(1, p_k(x_k) / q_k(x_k))`; on rejection
//! `p_{k+1} = norm(max(0, p_k − q_k))` and `q_{k+1}` is `q_k` without `x_k`,
//! renormalised. If every candidate is rejected the token is drawn from the
//! last residual. This is the single-candidate rule of Leviathan et al.,
//! ICML 2023 (arXiv 2211.17192) and Chen et al. 2023 (arXiv 2302.01318)
//! applied recursively; SpecInfer (Miao et al., ASPLOS 2024, arXiv
//! 2305.09781) is the variant for candidates drawn with replacement.
//!
//! Why it is lossless: whatever `q_k`, one step emits
//! `min(p_k, q_k) + (1 − Σ min(p_k, q_k)) · p_{k+1} = p_k`, provided the
//! steps after a rejection emit `p_{k+1}`, which holds by induction (the
//! last step draws from `p_{m+1}` directly). A rejected `x_k` has
//! `p_k(x_k) < q_k(x_k)`, so `p_{k+1}(x_k) = 0` and removing it from `q` loses
//! nothing. The first candidate is accepted with probability `Σ min(p, q)`.
//! The induction needs each candidate to follow `q_k` given the earlier
//! ones, and the accept tests' uniforms to be independent of how the
//! candidates were drawn; how many candidates there are may depend on the
//! earlier candidates but not on the candidate itself.
//!
//! Edge cases:
//! - *`q` has mass where `p` has none* (a token outside the target's
//!   top-k/top-p, or simply improbable to it): such a candidate is always
//!   rejected, and the residual is unchanged there because it is already 0.
//!   Truncation by top-k/top-p needs nothing else: `p` is the truncated
//!   distribution, so the residual and the bonus stay inside its support,
//!   exactly as plain sampling does.
//! - *Residual vanishes numerically* (`p_k ≤ q_k` everywhere up to rounding,
//!   e.g. drafter and target are the same model): the rejection that got
//!   there has probability at most the floor below, and the residual left is
//!   rounding noise. We then fall back to the probability-free rule, which
//!   emits a token distributed as `p` from draw 0, a uniform independent of
//!   the accept tests; the error is bounded by the floor.
//! - *`p` is not a distribution* (NaN or infinite logits): fall back to the
//!   probability-free rule, i.e. do exactly what plain sampling does.
//! - *A candidate with no draft mass left* cannot have been drawn (the tree
//!   guarantees children are distinct and inside `q`'s support); it is
//!   skipped, without spending its uniform.

/// A rejection that leaves less than this fraction of the residual mass is
/// treated as numerically impossible (see the module docs).
const RESIDUAL_FLOOR: f64 = 1e-12;

/// What recursive rejection sampling decided at one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Candidate `k` (the node's `k`-th child, from 0) was accepted.
    Accept(usize),
    /// Every candidate was rejected; the token was drawn from the residual.
    Bonus(u32),
    /// No well-defined residual: use the probability-free rule instead.
    Fallback,
}

/// Runs the recursive rejection over `candidates` (the children's tokens in
/// child order).
///
/// `p` is the target's processed distribution (any order; the bonus is
/// drawn by inverse CDF in that order), `q` the draft distribution, `vocab`
/// the row length (every token of `p` is below it). `draw(d)` supplies the
/// `d`-th uniform of this output position: candidate `k` uses draw `k + 1`
/// and the bonus draw `candidates.len() + 1`; draw 0 is never taken, it
/// belongs to the probability-free rule.
pub(crate) fn recursive_rejection(
    p: &[(u32, f64)],
    q: &[(u32, f32)],
    candidates: &[u32],
    vocab: usize,
    mut draw: impl FnMut(u64) -> f64,
) -> Decision {
    // The residual unnormalised: p_k = r / z. Dense over the vocabulary so
    // that the lookups and the subtraction of q are O(1) per token; one
    // O(vocab) buffer per visited node, the same order as computing p.
    let mut r = vec![0.0f64; vocab];
    for &(t, pt) in p {
        if let Some(slot) = r.get_mut(t as usize) {
            *slot = pt;
        }
    }
    let mut z = mass(p, &r);
    if !(z.is_finite() && z > 0.0) {
        return Decision::Fallback;
    }
    // The draft mass not yet drawn: q_k = rest / qz.
    let mut rest: Vec<(u32, f64)> = q.iter().map(|&(t, w)| (t, w as f64)).collect();
    let mut qz: f64 = rest.iter().map(|e| e.1).sum();

    for (k, &x) in candidates.iter().enumerate() {
        let Some(j) = rest.iter().position(|e| e.0 == x) else {
            continue;
        };
        let qx = rest[j].1;
        if !(qx > 0.0 && qz > 0.0) {
            continue;
        }
        let px = r.get(x as usize).copied().unwrap_or(0.0);
        // Accept with probability min(1, p_k(x) / q_k(x)), where
        // p_k(x) / q_k(x) = (px / z) / (qx / qz); multiplied out so that no
        // division can produce an infinity.
        if draw(k as u64 + 1) * z * qx < px * qz {
            return Decision::Accept(k);
        }
        // r ← max(0, r − z·q_k), i.e. z·max(0, p_k − q_k); only q's support
        // changes.
        let scale = z / qz;
        for &(t, w) in &rest {
            if let Some(slot) = r.get_mut(t as usize) {
                *slot = (*slot - scale * w).max(0.0);
            }
        }
        // Summed afresh rather than decremented, so that a small residual is
        // not swamped by cancellation.
        let left = mass(p, &r);
        if left.is_nan() || left <= z * RESIDUAL_FLOOR {
            return Decision::Fallback;
        }
        z = left;
        rest.remove(j);
        qz = rest.iter().map(|e| e.1).sum();
    }

    let target = draw(candidates.len() as u64 + 1) * z;
    let mut acc = 0.0;
    let mut last = None;
    for &(t, _) in p {
        let rt = r.get(t as usize).copied().unwrap_or(0.0);
        if rt > 0.0 {
            acc += rt;
            last = Some(t);
            if target < acc {
                return Decision::Bonus(t);
            }
        }
    }
    // Rounding left the uniform past the final sum: take the last token
    // with residual mass.
    last.map_or(Decision::Fallback, Decision::Bonus)
}

/// Σ r over the support of `p` (which contains the residual's support).
fn mass(p: &[(u32, f64)], r: &[f64]) -> f64 {
    p.iter()
        .map(|&(t, _)| r.get(t as usize).copied().unwrap_or(0.0))
        .sum()
}

#[cfg(test)]
mod tests;
