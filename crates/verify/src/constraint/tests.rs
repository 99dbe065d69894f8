use specmesh_sampling::SamplingParams;
use specmesh_tree::{TreeBuilder, TreeLimits};

use super::*;
use crate::{Extras, verify, verify_with};

const V: u32 = 8;

/// A toy grammar: at output position `i` the tokens of `sets[i]` are
/// allowed, then only EOS (7). What it forces is the run of positions with
/// a single allowed token.
#[derive(Debug)]
struct Sets {
    sets: Vec<Vec<u32>>,
    at: usize,
    words: Vec<u32>,
    advanced: Vec<u32>,
}

impl Sets {
    fn new(sets: &[&[u32]]) -> Sets {
        Sets {
            sets: sets.iter().map(|s| s.to_vec()).collect(),
            at: 0,
            words: vec![0],
            advanced: Vec::new(),
        }
    }

    fn here(&self, at: usize) -> Vec<u32> {
        self.sets.get(at).cloned().unwrap_or_else(|| vec![7])
    }
}

impl Constraint for Sets {
    fn allowed(&mut self) -> Result<&[u32], ConstraintError> {
        self.words[0] = self.here(self.at).iter().fold(0, |w, t| w | 1 << t);
        Ok(&self.words)
    }

    fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        Ok(self.here(self.at).contains(&token))
    }

    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !self.allows(token)? {
            return Err(ConstraintError(format!("{token} at {}", self.at)));
        }
        self.at += 1;
        self.advanced.push(token);
        Ok(())
    }

    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        self.at -= n;
        self.advanced.truncate(self.advanced.len() - n);
        Ok(())
    }

    fn forced(&mut self) -> Result<Vec<u32>, ConstraintError> {
        let mut out = Vec::new();
        let mut at = self.at;
        while at < self.sets.len() && self.sets[at].len() == 1 {
            out.push(self.sets[at][0]);
            at += 1;
        }
        Ok(out)
    }
}

/// root(0) ─ 1:"1" ─ 3:"2"
///          └ 2:"3" ─ 4:"4"
fn two_branches() -> TokenTree {
    let mut b = TreeBuilder::new(0, TreeLimits::new(16, 8, V)).unwrap();
    let n1 = b.push(0, 1, 0.9).unwrap();
    let n2 = b.push(0, 3, 0.5).unwrap();
    b.push(n1, 2, 0.8).unwrap();
    b.push(n2, 4, 0.4).unwrap();
    b.build()
}

fn row_preferring(order: &[u32]) -> Vec<f32> {
    let mut row = vec![0.0f32; V as usize];
    for (i, &t) in order.iter().enumerate() {
        row[t as usize] = 10.0 - i as f32;
    }
    row
}

#[test]
fn forbidden_nodes_are_cut_and_forced_ones_grafted() {
    // Position 0 allows 1 or 3, position 1 only 2, then 5 and 6 forced.
    let mut c = Sets::new(&[&[1, 3], &[2], &[5], &[6]]);
    let fitted = constrain(&two_branches(), &mut c, 8).unwrap();
    // "1 2" stays and gets 5 6 grafted; "3 4" loses "4" (position 1
    // allows only 2), and the grammar's 2 5 6 are grafted under "3".
    let t = &fitted.tree;
    assert_eq!(t.tokens(), [0, 1, 2, 5, 6, 3, 2, 5, 6]);
    assert_eq!(
        fitted.origin,
        [
            Some(0),
            Some(1),
            Some(3),
            None,
            None,
            Some(2),
            None,
            None,
            None
        ]
    );
    assert_eq!(fitted.grafted(), 5);
    assert_eq!(c.at, 0, "the constraint is left where it was");
    // A budget bounds what is grafted.
    let fitted = constrain(&two_branches(), &mut c, 1).unwrap();
    assert_eq!(fitted.tree.tokens(), [0, 1, 2, 5, 3]);
    assert_eq!(fitted.grafted(), 1);
}

#[test]
fn the_root_alone_gets_the_forced_chain() {
    let mut c = Sets::new(&[&[4], &[5], &[1, 2]]);
    let root = TokenTree::root_only(0, TreeLimits::new(1, 0, V)).unwrap();
    let fitted = constrain(&root, &mut c, 8).unwrap();
    assert_eq!(fitted.tree.tokens(), [0, 4, 5]);
    // Verified greedily against rows that prefer other tokens: the masked
    // argmax is the forced token, so the chain is accepted, then the best
    // allowed token of position 2 is the bonus.
    let rows = vec![
        row_preferring(&[3, 4]),
        row_preferring(&[6, 5]),
        row_preferring(&[6, 2, 1]),
    ];
    let extras = Extras {
        constraint: Some(&mut c),
        logprobs: Some(2),
        rejections: &[],
    };
    let v = verify_with(&fitted.tree, &rows, &SamplingParams::greedy(), 0, 0, extras).unwrap();
    assert_eq!(v.accepted, [4, 5]);
    assert_eq!(v.bonus, 2);
    assert_eq!(c.advanced, [4, 5, 2], "advanced past every committed token");
    // A single allowed token is certain: log-probability 0.
    assert_eq!(v.logprobs.len(), 3);
    assert_eq!(v.logprobs[0].logprob, 0.0);
    assert_eq!(v.logprobs[0].top, [(4, 0.0)]);
    // At position 2 only 1 and 2 are allowed: renormalised over them.
    let lp = &v.logprobs[2];
    let z = (9.0f64).exp() + (8.0f64).exp();
    assert!((lp.logprob as f64 - (9.0 - z.ln())).abs() < 1e-5);
    assert_eq!(lp.top.iter().map(|e| e.0).collect::<Vec<_>>(), [2, 1]);
}

#[test]
fn sampling_never_leaves_the_mask_and_matches_plain_masked_sampling() {
    let params = SamplingParams::new(1.0, 1.0, 0, 11).unwrap();
    let row: Vec<f32> = (0..V).map(|t| t as f32 * 0.3).collect();
    for position in 0..300u64 {
        let mut c = Sets::new(&[&[1, 2, 5]]);
        let root = TokenTree::root_only(0, TreeLimits::new(1, 0, V)).unwrap();
        let extras = Extras {
            constraint: Some(&mut c),
            logprobs: None,
            rejections: &[],
        };
        let v = verify_with(&root, &vec![row.clone()], &params, position, 0, extras).unwrap();
        assert!([1, 2, 5].contains(&v.bonus));
        let words = [0b100110u32];
        let plain = specmesh_sampling::sample_in(
            &row,
            &params,
            position,
            Some(specmesh_sampling::Allowed::new(&words)),
        );
        assert_eq!(v.bonus, plain);
    }
}

#[test]
fn a_node_that_lost_a_drafted_child_still_rejects_over_every_candidate() {
    let mut b = TreeBuilder::new(0, TreeLimits::new(8, 4, V)).unwrap();
    b.push(0, 1, 0.6).unwrap();
    b.push(0, 2, 0.4).unwrap();
    b.set_draft_dist(0, vec![(1, 0.5), (2, 0.5)]).unwrap();
    let tree = b.build();
    let mut keeps_both = Sets::new(&[&[1, 2], &[3]]);
    let fitted = constrain(&tree, &mut keeps_both, 0).unwrap();
    assert!(fitted.tree.draft_dist(0).is_some());
    assert!(fitted.rejections.iter().all(Option::is_none));
    let mut cuts_one = Sets::new(&[&[1, 3], &[3]]);
    let fitted = constrain(&tree, &mut cuts_one, 0).unwrap();
    assert_eq!(fitted.tree.tokens(), [0, 1]);
    assert!(fitted.tree.draft_dist(0).is_none());
    let r = fitted.rejections[0].clone().unwrap();
    assert_eq!(r.candidates, [1, 2]);
    // Lossless whatever was cut: the masked target is {1: 1/2, 3: 1/2};
    // `q` drew 1 or 2 with 1/2 each. Averaged over both draws (2 cut when
    // drawn), each position's token must follow the masked target.
    let row = vec![0.0f32, 1.0, 5.0, 1.0, 0.0, 0.0, 0.0, 0.0];
    let params = SamplingParams::new(1.0, 1.0, 0, 5).unwrap();
    let mut counts = [0usize; 8];
    let n = 40_000u64;
    let cut_two = {
        let mut b = TreeBuilder::new(0, TreeLimits::new(8, 4, V)).unwrap();
        b.push(0, 2, 0.6).unwrap();
        b.set_draft_dist(0, vec![(1, 0.5), (2, 0.5)]).unwrap();
        b.build()
    };
    for position in 0..n {
        // The drafter's draw: candidate 1 or 2 with q's probabilities,
        // from a stream independent of the verifier's uniforms.
        let drawn_one = specmesh_sampling::uniform(99, position) < 0.5;
        let drafted = if drawn_one { &tree } else { &cut_two };
        let mut c = Sets::new(&[&[1, 3]]);
        let fitted = constrain(drafted, &mut c, 0).unwrap();
        let extras = Extras {
            constraint: Some(&mut c),
            logprobs: None,
            rejections: &fitted.rejections,
        };
        let rows = vec![row.clone(); fitted.tree.len()];
        let v = verify_with(&fitted.tree, &rows, &params, position, 0, extras).unwrap();
        counts[v.committed()[0] as usize] += 1;
    }
    for (t, want) in [(1usize, 0.5f64), (3, 0.5)] {
        let got = counts[t] as f64 / n as f64;
        let sd = (want * (1.0 - want) / n as f64).sqrt();
        assert!((got - want).abs() < 5.0 * sd, "{counts:?}");
    }
    assert_eq!(counts[1] + counts[3], n as usize, "{counts:?}");
}

#[test]
fn without_a_constraint_nothing_changes() {
    let tree = two_branches();
    let rows: Vec<Vec<f32>> = (0..tree.len()).map(|_| row_preferring(&[3, 4])).collect();
    let a = verify(&tree, &rows, &SamplingParams::greedy(), 0, 2).unwrap();
    let b = verify_with(
        &tree,
        &rows,
        &SamplingParams::greedy(),
        0,
        2,
        Extras::default(),
    )
    .unwrap();
    assert_eq!(a, b);
    assert!(a.logprobs.is_empty());
}
