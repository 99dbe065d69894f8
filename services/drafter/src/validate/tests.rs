//! The drafter's wire edge: starts and outcomes, valid and refused.

use super::ANONYMOUS_TENANT;
use super::start::CurveFallback;
use specmesh_draft::{CostCurve, PolicyError, TreeLimits};
use specmesh_tree::TreeBuilder;

use super::*;

/// `w` read at the edge, then checked against `tree`.
fn outcome_of(w: v1::StepOutcome, tree: &TokenTree) -> Result<Outcome, DrafterError> {
    Outcome::from_report(Report::from_wire(w, 10)?, tree)
}

/// `w` read at the edge, then checked as reporting `steps` root-only steps.
fn span_of(w: v1::StepOutcome, steps: usize) -> Result<SpanOutcome, DrafterError> {
    SpanOutcome::from_report(Report::from_wire(w, 10)?, steps)
}

fn wire_start() -> v1::DraftStart {
    v1::DraftStart {
        session_id: "s".into(),
        tokens: vec![1, 2, 3],
        prompt_len: 2,
        vocab_size: 10,
        max_draft_tokens: 8,
        max_depth: 4,
        ..Default::default()
    }
}

fn err(r: Result<StartSpec, DrafterError>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn the_output_limit_is_known_only_when_sent() {
    assert_eq!(start(wire_start(), 100).unwrap().max_new_tokens, None);
    let limited = v1::DraftStart {
        max_new_tokens: 96,
        ..wire_start()
    };
    assert_eq!(start(limited, 100).unwrap().max_new_tokens, Some(96));
}

#[test]
fn a_good_start_becomes_a_spec_with_the_default_curve() {
    let s = start(wire_start(), 100).unwrap();
    assert!(s.sampling.is_greedy(), "an unset sampling is greedy");
    assert_eq!(s.tenant.as_str(), ANONYMOUS_TENANT);
    assert_eq!(s.curve, CostCurve::cpu_default());
    assert_eq!(s.curve_fallback, Some(CurveFallback::Missing));
    assert_eq!((s.prompt_len, s.vocab), (2, 10));
}

#[test]
fn bad_starts_name_the_field() {
    let bad = |f: fn(&mut v1::DraftStart)| {
        let mut s = wire_start();
        f(&mut s);
        err(start(s, 100))
    };
    assert!(bad(|s| s.tokens.clear()).starts_with("`start.tokens` must not be empty"));
    assert_eq!(
        bad(|s| s.vocab_size = 0),
        "`start.vocab_size` must be >= 1, got 0"
    );
    assert_eq!(
        bad(|s| s.tokens[1] = 10),
        "`start.tokens[1]` is 10, outside the vocabulary of 10"
    );
    assert!(bad(|s| s.prompt_len = 4).starts_with("`start.prompt_len` is 4"));
    assert!(
        bad(|s| s.tenant = "t".repeat(300))
            .starts_with("`start.tenant` must be at most 128 bytes, got 300")
    );
    assert_eq!(
        bad(|s| {
            s.sampling = Some(v1::SamplingParams {
                temperature: -1.0,
                ..Default::default()
            })
        }),
        "`start.sampling.temperature` must be a finite number >= 0, got -1"
    );
    assert!(
        bad(|s| {
            s.sampling = Some(v1::SamplingParams {
                top_k: 11,
                ..Default::default()
            })
        })
        .starts_with("`start.sampling.top_k` must be at most the vocabulary size (10)")
    );
    let long = start(wire_start(), 2);
    assert!(err(long).contains("over the drafter's context limit of 2"));
}

#[test]
fn an_invalid_curve_falls_back_and_says_why() {
    let mut s = wire_start();
    s.cost_curve = vec![
        v1::CostPoint {
            tokens: 1,
            relative_cost: 1.0,
        },
        v1::CostPoint {
            tokens: 4,
            relative_cost: 0.5,
        },
    ];
    let s = start(s, 100).unwrap();
    assert_eq!(s.curve, CostCurve::cpu_default());
    assert!(matches!(
        s.curve_fallback,
        Some(CurveFallback::Invalid(PolicyError::DecreasingCost { .. }))
    ));
}

/// root 5 ─┬─ 6 ── 7
///         └─ 8
fn tree() -> TokenTree {
    let mut b = TreeBuilder::new(5, TreeLimits::new(8, 4, 10)).unwrap();
    let a = b.push(0, 6, 0.9).unwrap();
    b.push(a, 7, 0.8).unwrap();
    b.push(0, 8, 0.3).unwrap();
    b.build()
}

fn outcome(path: Vec<u32>, committed: Vec<u32>) -> v1::StepOutcome {
    v1::StepOutcome {
        path,
        committed,
        ..Default::default()
    }
}

fn row(tokens: Vec<u32>) -> v1::TopTokens {
    v1::TopTokens {
        logprobs: vec![-1.0; tokens.len()],
        tokens,
    }
}

#[test]
fn a_span_outcome_has_one_token_per_step() {
    let mut w = outcome(vec![], vec![4, 5, 6]);
    w.top_k = vec![row(vec![4]), row(vec![5, 1]), row(vec![6])];
    let o = span_of(w, 3).unwrap();
    assert_eq!(o.committed, [4, 5, 6]);
    assert_eq!(o.top_k[1], [(5, -1.0), (1, -1.0)]);
    assert_eq!(o.batch_size, 1);
    // One step may name its root as the path.
    assert!(span_of(outcome(vec![0], vec![4]), 1).is_ok());
}

#[test]
fn bad_span_outcomes_name_the_field() {
    let bad = |o, steps| span_of(o, steps).unwrap_err().to_string();
    assert!(bad(outcome(vec![0], vec![4, 5]), 2).starts_with("`outcome.path` is [0]"));
    assert!(bad(outcome(vec![0, 1], vec![4]), 1).starts_with("`outcome.path`"));
    assert!(
        bad(outcome(vec![], vec![4, 5]), 3)
            .starts_with("`outcome.committed` has 2 tokens, but the outcome reports 3 steps")
    );
    assert_eq!(
        bad(outcome(vec![], vec![4, 10]), 2),
        "`outcome.committed[1]` is 10, outside the vocabulary of 10"
    );
    let mut w = outcome(vec![], vec![4, 5]);
    w.top_k = vec![row(vec![1]), row(vec![2]), row(vec![3])];
    assert_eq!(
        bad(w, 2),
        "`outcome.top_k` has 3 rows, more than 2: one per step reported"
    );
}

#[test]
fn a_pruned_outcome_reads_the_path_in_the_verified_part() {
    let mut w = outcome(vec![0, 1, 2], vec![6, 7, 9]);
    w.pruned = true;
    w.granted = vec![1, 2];
    w.node_budget = Some(4);
    let o = outcome_of(w, &tree()).unwrap();
    let p = o.pruned.expect("pruned");
    assert_eq!(p.tree.tokens(), &[5, 6, 7]);
    assert_eq!(p.path, [0, 1, 2]);
    assert_eq!(o.path, [0, 1, 2], "the path stays in the drafter's indices");
    assert_eq!(o.node_budget, Some(4));
    // Pruned to the root alone: nothing was verified but the root.
    let mut w = outcome(vec![0], vec![9]);
    w.pruned = true;
    let o = outcome_of(w, &tree()).unwrap();
    assert_eq!(o.pruned.unwrap().tree.len(), 1);
    assert_eq!(o.node_budget, None);
}

#[test]
fn bad_grants_name_the_field() {
    let bad = |path: Vec<u32>, committed: Vec<u32>, pruned: bool, granted: Vec<u32>| {
        let mut w = outcome(path, committed);
        w.pruned = pruned;
        w.granted = granted;
        outcome_of(w, &tree()).unwrap_err().to_string()
    };
    let e = bad(vec![0, 1], vec![6, 9], true, vec![2, 1]);
    assert!(
        e.contains("outcome.granted") && e.contains("ascending"),
        "{e}"
    );
    let e = bad(vec![0], vec![9], true, vec![0, 1]);
    assert!(e.contains("outcome.granted") && e.contains("root"), "{e}");
    let e = bad(vec![0], vec![9], true, vec![2]);
    assert!(
        e.contains("outcome.granted") && e.contains("ancestor"),
        "{e}"
    );
    let e = bad(vec![0], vec![9], true, vec![9]);
    assert!(e.contains("outcome.granted"), "{e}");
    let e = bad(vec![0, 1, 2], vec![6, 7, 9], true, vec![1]);
    assert!(e.contains("outcome.path") && e.contains("granted"), "{e}");
    let e = bad(vec![0, 1], vec![6, 9], false, vec![1]);
    assert!(e.contains("outcome.granted") && e.contains("pruned"), "{e}");
    let mut w = outcome(vec![], vec![4]);
    w.pruned = true;
    let e = span_of(w, 1).unwrap_err().to_string();
    assert!(e.contains("outcome.granted"), "{e}");
}

#[test]
fn a_good_outcome_is_accepted() {
    let o = outcome_of(outcome(vec![0, 1, 2], vec![6, 7, 9]), &tree()).unwrap();
    assert_eq!(o.path, [0, 1, 2]);
    assert_eq!(o.batch_size, 1);
    // Not our tree: any committed tokens, one top-k row (the root's).
    let mut w = outcome(vec![], vec![4]);
    w.top_k = vec![v1::TopTokens {
        tokens: vec![4, 3],
        logprobs: vec![-0.1, -3.0],
    }];
    let o = outcome_of(w, &tree()).unwrap();
    assert_eq!(o.top_k, [vec![(4, -0.1), (3, -3.0)]]);
}

#[test]
fn bad_outcomes_name_the_field() {
    let bad = |o| outcome_of(o, &tree()).unwrap_err().to_string();
    assert_eq!(
        bad(outcome(vec![0, 9], vec![1])),
        "`outcome.path[1]` is 9, but the tree has 4 nodes"
    );
    assert!(bad(outcome(vec![1], vec![1])).contains("starts at the root"));
    assert!(bad(outcome(vec![0, 2], vec![1])).contains("not a child of node 0"));
    assert!(bad(outcome(vec![0], vec![])).starts_with("`outcome.committed` must not be empty"));
    assert_eq!(
        bad(outcome(vec![], vec![3, 12])),
        "`outcome.committed[1]` is 12, outside the vocabulary of 10"
    );
    assert!(bad(outcome(vec![0, 1], vec![8, 1])).starts_with("`outcome.committed[0]` is 8"));
    assert!(bad(outcome(vec![0, 1], vec![6, 1, 2])).starts_with("`outcome.committed` has 3"));
    let mut o = outcome(vec![0], vec![1]);
    o.top_k = vec![v1::TopTokens {
        tokens: vec![1],
        logprobs: vec![f32::NAN],
    }];
    assert_eq!(bad(o), "`outcome.top_k[0].logprobs[0]` is NaN");
}
