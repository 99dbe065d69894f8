use std::cell::RefCell;

use specmesh_tree::{TreeBuilder, TreeLimits};

use super::*;
use crate::RowMajor;
use specmesh_sampling::sample;

const V: u32 = 6;

fn limits() -> TreeLimits {
    TreeLimits::new(16, 8, V)
}

/// A row whose argmax is `token`, with a clear margin.
fn peaked(token: u32) -> Vec<f32> {
    (0..V)
        .map(|t| if t == token { 10.0 } else { 0.0 })
        .collect()
}

/// Rows that record which nodes were read.
struct Counting {
    rows: Vec<Vec<f32>>,
    read: RefCell<Vec<usize>>,
}

impl LogitRows for Counting {
    fn num_rows(&self) -> usize {
        self.rows.len()
    }

    fn row(&self, node: usize) -> &[f32] {
        self.read.borrow_mut().push(node);
        &self.rows[node]
    }
}

/// root(5) ─ 1:"1" ─ 3:"2"
///          └ 2:"3" ─ 4:"4"
fn two_branches() -> TokenTree {
    let mut b = TreeBuilder::new(5, limits()).unwrap();
    let n1 = b.push(0, 1, 0.9).unwrap();
    let n2 = b.push(0, 3, 0.5).unwrap();
    b.push(n1, 2, 0.8).unwrap();
    b.push(n2, 4, 0.4).unwrap();
    b.build()
}

#[test]
fn greedy_follows_the_argmax_and_reads_only_the_path() {
    let tree = two_branches();
    // Root prefers 3 (node 2), node 2 prefers 4 (node 4), node 4 prefers 0.
    // Rows 1 and 3 are malformed: they must not be read.
    let rows = Counting {
        rows: vec![peaked(3), vec![], peaked(4), vec![], peaked(0)],
        read: RefCell::new(Vec::new()),
    };
    let v = verify(&tree, &rows, &SamplingParams::greedy(), 0, 0).unwrap();
    assert_eq!(v.path, [0, 2, 4]);
    assert_eq!(v.accepted, [3, 4]);
    assert_eq!(v.bonus, 0);
    assert_eq!(v.accepted_len(), 2);
    assert_eq!(v.committed(), [3, 4, 0]);
    assert_eq!(v.top_k, vec![Vec::new(); 3]);
    assert!(rows.read.borrow().iter().all(|n| [0, 2, 4].contains(n)));
}

#[test]
fn nothing_accepted_commits_the_bonus_alone() {
    let tree = two_branches();
    let rows = vec![peaked(0); 5];
    let v = verify(&tree, &rows, &SamplingParams::greedy(), 3, 2).unwrap();
    assert_eq!(v.path, [0]);
    assert!(v.accepted.is_empty());
    assert_eq!(v.committed(), [0]);
    assert_eq!(v.top_k.len(), 1);
    assert_eq!(v.top_k[0][0].0, 0);
    assert_eq!(v.top_k[0].len(), 2);
}

#[test]
fn greedy_ignores_draft_distributions() {
    let mut b = TreeBuilder::new(5, limits()).unwrap();
    b.push(0, 1, 0.9).unwrap();
    b.push(0, 2, 0.9).unwrap();
    b.set_draft_dist(0, vec![(1, 0.5), (2, 0.5)]).unwrap();
    let tree = b.build();
    let rows = vec![peaked(2), peaked(0), peaked(0)];
    let v = verify(&tree, &rows, &SamplingParams::greedy(), 0, 0).unwrap();
    assert_eq!(v.committed(), [2, 0]);
}

#[test]
fn top_k_covers_every_path_node() {
    let tree = two_branches();
    let rows: Vec<f32> = [peaked(1), peaked(2), peaked(0), peaked(0), peaked(0)].concat();
    let rows = RowMajor::new(&rows, V as usize).unwrap();
    let v = verify(&tree, &rows, &SamplingParams::greedy(), 0, 3).unwrap();
    assert_eq!(v.path, [0, 1, 3]);
    let firsts: Vec<u32> = v.top_k.iter().map(|k| k[0].0).collect();
    assert_eq!(firsts, [1, 2, 0]);
    assert!(v.top_k.iter().all(|k| k.len() == 3));
}

#[test]
fn too_few_rows_and_wrong_row_lengths_are_refused() {
    let tree = two_branches();
    let greedy = SamplingParams::greedy();
    assert_eq!(
        verify(&tree, &vec![peaked(0); 4], &greedy, 0, 0).unwrap_err(),
        VerifyError::TooFewRows { nodes: 5, rows: 4 }
    );
    let mut rows = vec![peaked(1); 5];
    rows[1] = vec![0.0; 3];
    assert_eq!(
        verify(&tree, &rows, &greedy, 0, 0).unwrap_err(),
        VerifyError::RowLength {
            node: 1,
            len: 3,
            vocab: 6
        }
    );
}

#[test]
fn probability_free_sampling_takes_plain_sampling_draws() {
    let tree = two_branches();
    let flat: Vec<f32> = (0..V).map(|t| t as f32 * 0.1).collect();
    let rows = vec![flat.clone(); 5];
    for seed in 0..200 {
        let params = SamplingParams::new(1.0, 1.0, 0, seed).unwrap();
        let v = verify(&tree, &rows, &params, 10, 0).unwrap();
        // Each committed token is plain sampling's at its position.
        for (d, &t) in v.committed().iter().enumerate() {
            assert_eq!(t, sample(&flat, &params, 10 + d as u64));
        }
    }
}

#[test]
fn rejection_sampling_recurses_to_the_only_token_the_target_allows() {
    // p is one-hot on 2 (top-k 1); q = {1: 0.5, 2: 0.5} drew children
    // [1, 2]. Candidate 1 is rejected (p(1) = 0), the residual is {2: 1}
    // and q without 1 is {2: 1}: candidate 2 is accepted for every seed.
    let mut b = TreeBuilder::new(5, limits()).unwrap();
    b.push(0, 1, 0.9).unwrap();
    b.push(0, 2, 0.9).unwrap();
    b.set_draft_dist(0, vec![(1, 0.5), (2, 0.5)]).unwrap();
    let tree = b.build();
    let flat: Vec<f32> = (0..V).map(|t| t as f32 * 0.1).collect();
    let rows = vec![peaked(2), flat.clone(), flat];
    for seed in 0..100 {
        let params = SamplingParams::new(1.0, 1.0, 1, seed).unwrap();
        let v = verify(&tree, &rows, &params, 0, 0).unwrap();
        assert_eq!(v.path, [0, 2]);
    }
}

#[test]
fn unusable_logits_with_a_draft_fall_back_to_plain_sampling() {
    let mut b = TreeBuilder::new(5, limits()).unwrap();
    b.push(0, 1, 0.9).unwrap();
    b.set_draft_dist(0, vec![(1, 1.0)]).unwrap();
    let tree = b.build();
    let nan = vec![f32::NAN; V as usize];
    let rows = vec![nan.clone(), nan.clone()];
    let params = SamplingParams::new(1.0, 1.0, 0, 3).unwrap();
    let v = verify(&tree, &rows, &params, 0, 2).unwrap();
    let plain = sample(&nan, &params, 0);
    assert_eq!(v.committed()[0], plain);
}
