use super::*;
use specmesh_tree::{TokenTree, TreeBuilder};

fn policy_with(rate: f64, curve: CostCurve) -> SpecPolicy {
    let mut p = SpecPolicy::new(curve, PolicyConfig::default()).unwrap();
    p.stats_mut().set_prior(rate);
    p
}

/// A policy that has seen `steps` chain steps, each accepting a depth
/// with probability exactly `rate` in the long run (deterministic
/// pattern).
fn trained(rate: f64, steps: usize) -> SpecPolicy {
    let mut p = SpecPolicy::new(CostCurve::cpu_default(), PolicyConfig::default()).unwrap();
    observe_chains(&mut p, rate, steps);
    p
}

/// Shows `p` `steps` chain steps of 8 that accept each depth with
/// probability `rate` in the long run (a deterministic pattern).
pub(super) fn observe_chains(p: &mut SpecPolicy, rate: f64, steps: usize) {
    let mut acc = 0.0;
    for _ in 0..steps {
        let mut accepted = 0;
        while accepted < 8 {
            acc += rate;
            if acc >= 1.0 {
                acc -= 1.0;
                accepted += 1;
            } else {
                break;
            }
        }
        p.observe(8, accepted);
    }
}

#[test]
fn cost_curve_interpolates_and_extrapolates() {
    let c = CostCurve::cpu_default();
    assert_eq!(c.cost(1), 1.0);
    assert_eq!(c.cost(0), 1.0);
    assert!((c.cost(3) - (1.26 + 1.85) / 2.0).abs() < 1e-12);
    assert!((c.cost(16) - 5.02).abs() < 1e-12);
    // Last segment slope (5.02 - 2.99) / 8 per token.
    assert!((c.cost(24) - (5.02 + 8.0 * (5.02 - 2.99) / 8.0)).abs() < 1e-12);
    assert!((c.step_cost(0, 4) - 1.0).abs() < 1e-12);
    assert!((c.step_cost(1, 4) - 2.99 / 1.85).abs() < 1e-12);
}

#[test]
fn cost_curve_validation_names_the_problem() {
    assert_eq!(
        CostCurve::new(vec![(1, 1.0)]),
        Err(PolicyError::TooFewPoints(1))
    );
    assert!(matches!(
        CostCurve::new(vec![(2, 1.0), (4, 2.0)]),
        Err(PolicyError::BadFirstPoint { k: 2, .. })
    ));
    assert!(matches!(
        CostCurve::new(vec![(1, 1.0), (4, 2.0), (4, 3.0)]),
        Err(PolicyError::UnsortedK { index: 2, .. })
    ));
    assert!(matches!(
        CostCurve::new(vec![(1, 1.0), (4, 2.0), (8, 1.5)]),
        Err(PolicyError::DecreasingCost { index: 2, .. })
    ));
    assert!(matches!(
        CostCurve::new(vec![(1, 1.0), (4, f64::NAN)]),
        Err(PolicyError::BadCost { index: 1, .. })
    ));
    let c = CostCurve::from_times(&[(1, 2.0), (2, 2.5), (4, 4.0)]).unwrap();
    assert_eq!(c.points(), &[(1, 1.0), (2, 1.25), (4, 2.0)]);
    // A flat stretch is allowed (extra tokens may be free).
    assert!(CostCurve::new(vec![(1, 1.0), (2, 1.0)]).is_ok());
    assert!(
        CostCurve::new(vec![(1, 1.0), (4, 2.0), (8, 1.5)])
            .unwrap_err()
            .to_string()
            .contains("cannot be cheaper")
    );
}

#[test]
fn stats_follow_observations_and_forget() {
    let mut s = AcceptanceStats::new(0.5, 2.0, 0.9).unwrap();
    assert_eq!(s.rate(1), 0.5);
    for _ in 0..50 {
        s.observe(4, 4);
    }
    assert!(s.rate(1) > 0.9 && s.rate(4) > 0.9, "{}", s.rate(4));
    // Unreached depths inherit the deepest measured rate.
    assert!(s.rate(7) > 0.9);
    for _ in 0..50 {
        s.observe(4, 0);
    }
    assert!(s.rate(1) < 0.1, "forgets: {}", s.rate(1));
    // Depth 2 was never reached after depth 1 started failing: it keeps
    // the counts it had (a conditional rate), decayed only when observed.
    assert!(s.rate(2) > 0.5, "{}", s.rate(2));
    assert!(AcceptanceStats::new(1.5, 2.0, 0.9).is_err());
    assert!(AcceptanceStats::new(0.5, 0.0, 0.9).is_err());
    assert!(AcceptanceStats::new(0.5, 1.0, 0.0).is_err());
}

#[test]
fn learned_rates_are_priors_per_depth_and_records_absorb() {
    let mut s = AcceptanceStats::new(0.5, 2.0, 0.9).unwrap();
    s.set_learned(&[0.9, 0.6, f64::NAN, 0.1]);
    // The learned depths, then (after a rate that is not a number) the
    // chain from the deepest learned one.
    assert_eq!(s.rates(4), [0.9, 0.6, 0.6, 0.6]);
    // Observations weigh against the learned prior at its strength.
    s.observe(1, 0);
    assert!((s.rate(1) - 0.6).abs() < 1e-12, "{}", s.rate(1));
    assert_eq!(s.rate(2), 0.6);
    // A record of sessions: keep 0.5 of the old weight, add the new.
    let mut record = s.unobserved();
    assert_eq!(record.weight(), 0.0);
    assert_eq!(record.rates(2), [0.5, 0.5]);
    record.absorb(&s, 0.5);
    record.absorb(&s, 0.5);
    assert!((record.weight() - 1.5).abs() < 1e-12);
    assert!(record.rate(1) < 0.5);
}

#[test]
fn a_leaf_on_the_accepted_path_counts_no_refusal() {
    let mut b = TreeBuilder::new(1, TreeLimits::new(8, 4, 100)).unwrap();
    let a = b.push(0, 2, 0.9).unwrap();
    let c = b.push(a, 3, 0.8).unwrap();
    b.push(0, 4, 0.1).unwrap();
    let t = b.build();
    assert_eq!(offered_and_accepted(&t, &[0, a, c]), (2, 2));
    assert_eq!(offered_and_accepted(&t, &[0, a]), (2, 1));
    assert_eq!(offered_and_accepted(&t, &[0]), (1, 0));
    let root_only = TokenTree::root_only(1, TreeLimits::new(1, 0, 100)).unwrap();
    assert_eq!(offered_and_accepted(&root_only, &[0]), (0, 0));
}

#[test]
fn high_acceptance_gives_a_large_budget() {
    let p = trained(0.95, 200);
    let d = p.best(1);
    assert!(d.budget.max_nodes >= 9, "{d:?}");
    assert!(d.budget.max_depth >= 6, "{d:?}");
    assert!(d.expected_speedup() > 1.5, "{d:?}");
}

#[test]
fn a_depth_cap_bounds_the_tree_and_a_cap_of_zero_drafts_nothing() {
    let mut p = trained(0.95, 200);
    p.set_depth_cap(Some(2));
    let d = p.best(1);
    assert!(!d.budget.is_off() && d.budget.max_depth <= 2, "{d:?}");
    assert!(p.upper_bound(1) <= 3.0 + 1e-9);
    p.set_depth_cap(Some(0));
    assert_eq!(p.best(1).budget, Budget::OFF);
    assert_eq!(p.upper_bound(1), 1.0);
    // Not even a probe: no tree could arrive in time.
    let mut off = trained(0.0, 200);
    off.set_depth_cap(Some(0));
    for step in 0..4 * off.config().probe_interval {
        assert_eq!(off.decide(1).budget, Budget::OFF, "step {step}");
    }
    p.set_depth_cap(None);
    assert!(p.best(1).budget.max_depth >= 6);
}

#[test]
fn zero_acceptance_turns_speculation_off_except_on_probes() {
    let mut p = trained(0.0, 200);
    let interval = p.config().probe_interval as usize;
    let mut probes = Vec::new();
    for step in 0..4 * interval {
        let d = p.decide(1);
        if d.probe {
            probes.push(step);
            assert_eq!(
                d.budget,
                Budget {
                    max_nodes: 3,
                    max_depth: 2
                }
            );
            // The probe fails too.
            p.observe(2, 0);
        } else {
            assert_eq!(d.budget, Budget::OFF, "step {step}");
            assert!(d.budget.is_off());
        }
    }
    let expected: Vec<usize> = (1..=4).map(|i| i * interval - 1).collect();
    assert_eq!(probes, expected, "every {interval}-th off step probes");
}

#[test]
fn probes_let_speculation_turn_back_on() {
    let mut p = trained(0.0, 100);
    let mut on_at = None;
    for step in 0..200 {
        let d = p.decide(1);
        if d.probe {
            // The text became predictable: the probe is fully accepted.
            p.observe(d.budget.max_depth, d.budget.max_depth);
        } else if !d.budget.is_off() {
            on_at = Some(step);
            break;
        }
    }
    assert!(on_at.is_some(), "speculation never came back on");
}

#[test]
fn steeper_cost_curve_gives_a_smaller_budget() {
    let flat = policy_with(0.8, CostCurve::cpu_default());
    let steep = policy_with(
        0.8,
        CostCurve::new(vec![(1, 1.0), (2, 1.8), (4, 3.5), (8, 7.0), (16, 14.0)]).unwrap(),
    );
    let (a, b) = (flat.best(1).budget, steep.best(1).budget);
    assert!(b.max_nodes < a.max_nodes, "flat {a:?}, steep {b:?}");
    // Linear cost (no batching gain at all): speculation never pays.
    let linear = policy_with(0.8, CostCurve::new(vec![(1, 1.0), (2, 2.0)]).unwrap());
    assert_eq!(linear.best(1).budget, Budget::OFF);
}

#[test]
fn larger_batch_gives_a_smaller_budget() {
    let p = policy_with(0.8, CostCurve::cpu_default());
    let sizes: Vec<usize> = [1, 2, 4, 8, 16]
        .iter()
        .map(|&b| p.best(b).budget.max_nodes)
        .collect();
    assert!(sizes.windows(2).all(|w| w[1] <= w[0]), "{sizes:?}");
    assert!(sizes[4] < sizes[0], "{sizes:?}");
}

#[test]
fn budget_grows_monotonically_with_acceptance() {
    let mut last = 1;
    let mut seen_off = false;
    for i in 0..=20 {
        let rate = i as f64 / 20.0;
        let b = policy_with(rate, CostCurve::cpu_default()).best(1).budget;
        seen_off |= b.is_off();
        assert!(b.max_nodes >= last, "rate {rate}: {b:?} < {last}");
        assert!(b.max_nodes <= 17 && b.max_depth <= 8);
        last = b.max_nodes;
    }
    assert!(seen_off && last > 1);
}

#[test]
fn expectation_never_falls_with_more_nodes() {
    for rate in [0.1, 0.5, 0.9] {
        let p = policy_with(rate, CostCurve::cpu_default());
        let e: Vec<f64> = (0..=16).map(|k| p.expected_tokens(k)).collect();
        assert_eq!(e[0], 1.0);
        assert!(e.windows(2).all(|w| w[1] >= w[0]), "{rate}: {e:?}");
        // Chains: the first node adds exactly a_1.
        assert!((e[1] - (1.0 + rate)).abs() < 1e-12);
    }
}

#[test]
fn bad_configs_are_refused() {
    let c = CostCurve::cpu_default();
    let cfg = |f: fn(&mut PolicyConfig)| {
        let mut cfg = PolicyConfig::default();
        f(&mut cfg);
        SpecPolicy::new(c.clone(), cfg)
    };
    assert!(cfg(|c| c.max_nodes = 0).is_err());
    assert!(cfg(|c| c.width_gain = 1.0).is_err());
    assert!(cfg(|c| c.prior_accept = -0.1).is_err());
    // Without room for a probe, an off policy stays off.
    let mut p = cfg(|c| c.max_nodes = 1).unwrap();
    assert!((0..40).all(|_| p.decide(1).budget.is_off()));
    let b = Budget {
        max_nodes: 5,
        max_depth: 3,
    };
    assert_eq!(b.limits(100), TreeLimits::new(5, 3, 100));
    assert_eq!(b.drafted(), 4);
}

#[test]
fn under_load_probes_are_rarer() {
    let probes = |batch: usize| {
        let mut p = trained(0.0, 200);
        (0..1024).filter(|_| p.decide(batch).probe).count()
    };
    let interval = PolicyConfig::default().probe_interval as usize;
    assert_eq!(probes(1), 1024 / interval);
    assert_eq!(probes(16), 1024 / (16 * interval));
}

#[test]
fn a_decided_run_equals_deciding_each_step() {
    let configs = [
        PolicyConfig::default(),
        PolicyConfig {
            probe_interval: 3,
            ..PolicyConfig::default()
        },
        PolicyConfig {
            probe_interval: 1,
            ..PolicyConfig::default()
        },
        // Never probing: off for good.
        PolicyConfig {
            probe_interval: 0,
            ..PolicyConfig::default()
        },
        PolicyConfig {
            max_nodes: 1,
            ..PolicyConfig::default()
        },
    ];
    let (mut cases, mut runs) = (0, 0);
    for config in configs {
        for rate in [0.0, 0.3, 0.95] {
            let mut p = SpecPolicy::new(CostCurve::cpu_default(), config.clone()).unwrap();
            p.stats_mut().set_prior(rate);
            // Every phase of the probe counter.
            for _ in 0..20 {
                for max in [0, 1, 2, 5, 64] {
                    for batch in [1, 4] {
                        let mut run = p.clone();
                        let mut each = p.clone();
                        let (first, n) = run.decide_run(batch, max);
                        assert!(n >= 1 && n <= max.max(1), "{n} steps for max {max}");
                        assert_eq!(first, each.decide(batch));
                        for i in 1..n {
                            let d = each.decide(batch);
                            assert_eq!(d, first, "step {i} of a run of {n}");
                            assert!(d.budget.is_off());
                        }
                        if first.budget.is_off() && n < max {
                            // The run ends where `decide` would speculate.
                            assert!(!each.clone().decide(batch).budget.is_off());
                        }
                        runs += usize::from(n > 1);
                        for step in 0..40 {
                            assert_eq!(run.decide(batch), each.decide(batch), "after: step {step}");
                        }
                        cases += 1;
                    }
                }
                p.decide(1);
            }
        }
    }
    assert_eq!(cases, 5 * 3 * 20 * 5 * 2);
    assert!(
        runs > cases / 4,
        "runs of off steps are exercised: {runs} of {cases}"
    );
}

#[test]
fn a_measured_step_overhead_is_priced_into_every_speculative_step() {
    let curve =
        CostCurve::new(vec![(1, 1.0), (2, 1.18), (4, 1.47), (8, 2.17), (16, 3.71)]).unwrap();
    for (accepted, still_pays) in [(3usize, true), (1, false)] {
        let mut p = SpecPolicy::new(curve.clone(), PolicyConfig::default()).unwrap();
        for _ in 0..200 {
            p.observe(4, accepted);
        }
        let free = p.best(1);
        assert!(
            !free.budget.is_off(),
            "speculation pays at no overhead: {free:?}"
        );
        // Plain steps take 10 ms and speculative ones 10 ms more than the
        // curve says: a whole plain step of overhead.
        p.observe_step_time(0, 1, 4, 0.040);
        for _ in 0..200 {
            let predicted = p.curve().step_cost(free.budget.drafted(), 1);
            p.observe_step_time(free.budget.drafted(), 1, 1, 0.010 * (predicted + 1.0));
        }
        assert!(
            (p.timing().overhead() - 1.0).abs() < 0.01,
            "{}",
            p.timing().overhead()
        );
        let taxed = p.best(1);
        assert!(taxed.expected_speedup() < free.expected_speedup());
        assert_eq!(!taxed.budget.is_off(), still_pays, "{free:?} -> {taxed:?}");
        if still_pays {
            let plain = p.curve().step_cost(taxed.budget.drafted(), 1);
            assert!((taxed.relative_cost - plain - 1.0).abs() < 0.01);
        }
    }
}
