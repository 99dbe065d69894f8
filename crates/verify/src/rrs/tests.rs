use super::*;

/// Runs the rejection with fixed uniforms per draw index and records which
/// draws were taken.
fn run(
    p: &[(u32, f64)],
    q: &[(u32, f32)],
    candidates: &[u32],
    uniforms: &[f64],
) -> (Decision, Vec<u64>) {
    let mut taken = Vec::new();
    let d = recursive_rejection(p, q, candidates, 4, |i| {
        taken.push(i);
        uniforms[i as usize]
    });
    (d, taken)
}

const P: [(u32, f64); 3] = [(0, 0.5), (1, 0.3), (2, 0.2)];

#[test]
fn a_candidate_the_target_likes_more_is_always_accepted() {
    // p(1) = 0.3 > q(1) = 0.2: ratio above 1.
    let q = [(1, 0.2), (3, 0.8)];
    let (d, taken) = run(&P, &q, &[1], &[0.0, 0.999_999]);
    assert_eq!(d, Decision::Accept(0));
    assert_eq!(taken, [1]);
}

#[test]
fn acceptance_threshold_is_p_over_q() {
    // p(0) / q(0) = 0.5 / 0.8.
    let q = [(0, 0.8), (1, 0.2)];
    assert_eq!(run(&P, &q, &[0], &[0.0, 0.62, 0.0]).0, Decision::Accept(0));
    assert_ne!(run(&P, &q, &[0], &[0.0, 0.63, 0.0]).0, Decision::Accept(0));
}

#[test]
fn rejection_recurses_on_the_residual_and_the_remaining_draft() {
    // Reject 0: p_2 = norm(max(0, p − q)) = {1: 0.1, 2: 0.2} / 0.3 and
    // q_2 = {1: 1}, so candidate 1 is accepted with probability 1/3.
    let q = [(0, 0.8), (1, 0.2)];
    let (d, taken) = run(&P, &q, &[0, 1], &[0.0, 0.9, 0.33, 0.0]);
    assert_eq!(d, Decision::Accept(1));
    assert_eq!(taken, [1, 2]);
    // Reject it too: p_3 = norm(max(0, p_2 − q_2)) = {2: 1}, whatever the
    // bonus uniform.
    let (d, taken) = run(&P, &q, &[0, 1], &[0.0, 0.9, 0.34, 0.0]);
    assert_eq!(d, Decision::Bonus(2));
    assert_eq!(taken, [1, 2, 3]);
    let (d, _) = run(&P, &q, &[0, 1], &[0.0, 0.9, 0.34, 0.999_999]);
    assert_eq!(d, Decision::Bonus(2));
}

#[test]
fn bonus_after_one_rejection_follows_the_residual() {
    // Reject 0 (q(0) = 0.8): residual {1: 0.1, 2: 0.2} / 0.3 in p's order.
    let q = [(0, 0.8), (1, 0.2)];
    assert_eq!(run(&P, &q, &[0], &[0.0, 0.9, 0.33]).0, Decision::Bonus(1));
    assert_eq!(run(&P, &q, &[0], &[0.0, 0.9, 0.34]).0, Decision::Bonus(2));
}

#[test]
fn draft_mass_outside_the_target_support_is_always_rejected() {
    // Token 3 is outside p (say cut by top-k): rejected even with u = 0.
    // The residual still subtracts all of q:
    // norm(max(0, p − q)) = {0: 0.25, 1: 0.05, 2: 0.2} / 0.5.
    let q = [(3, 0.5), (0, 0.25), (1, 0.25)];
    assert_eq!(run(&P, &q, &[3], &[0.0, 0.0, 0.49]).0, Decision::Bonus(0));
    assert_eq!(run(&P, &q, &[3], &[0.0, 0.0, 0.51]).0, Decision::Bonus(1));
    assert_eq!(run(&P, &q, &[3], &[0.0, 0.0, 0.61]).0, Decision::Bonus(2));
    // The next candidate faces that residual against q without token 3,
    // {0: 0.5, 1: 0.5}: p_2(0) / q_2(0) = 1, always accepted.
    let (d, _) = run(&P, &q, &[3, 0], &[0.0, 0.0, 0.999_999, 0.0]);
    assert_eq!(d, Decision::Accept(1));
}

#[test]
fn identical_distributions_accept_the_first_candidate() {
    let p = [(0, 0.5), (1, 0.25), (2, 0.25)];
    let q = [(2, 0.25), (0, 0.5), (1, 0.25)];
    for c in 0..3 {
        let (d, _) = run(&p, &q, &[c], &[0.0, 0.999_999_999, 0.0]);
        assert_eq!(d, Decision::Accept(0));
    }
}

#[test]
fn a_numerically_empty_residual_falls_back() {
    // p(0) / q(0) = 1 − 1e-14: a rejection leaves a residual of 1e-14,
    // under the floor.
    let p = [(0, 1.0 - 1e-14), (1, 1e-14)];
    let q = [(0, 1.0)];
    let (d, _) = run(&p, &q, &[0], &[0.0, 0.999_999_999_999_999, 0.0]);
    assert_eq!(d, Decision::Fallback);
}

#[test]
fn a_target_that_is_not_a_distribution_falls_back() {
    let q = [(0, 1.0)];
    assert_eq!(
        run(&[(0, f64::NAN), (1, 0.5)], &q, &[0], &[0.0; 3]).0,
        Decision::Fallback
    );
    assert_eq!(run(&[], &q, &[0], &[0.0; 3]).0, Decision::Fallback);
}

#[test]
fn a_candidate_outside_the_draft_is_skipped_without_a_draw() {
    let q = [(0, 0.8), (1, 0.2)];
    let (d, taken) = run(&P, &q, &[2, 1], &[0.0, 0.0, 0.0, 0.0]);
    assert_eq!(d, Decision::Accept(1));
    assert_eq!(taken, [2]);
}

#[test]
fn no_candidates_draws_the_bonus_from_p() {
    let q = [(0, 1.0)];
    assert_eq!(run(&P, &q, &[], &[0.0, 0.49]).0, Decision::Bonus(0));
    assert_eq!(run(&P, &q, &[], &[0.0, 0.81]).0, Decision::Bonus(2));
}
