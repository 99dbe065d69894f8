use specmesh_tree::TreeLimits;
use std::sync::{Arc, Mutex};

use super::*;
use crate::lookup::PromptLookup;
use crate::recycle::TokenRecycler;
use crate::suffix::SuffixDrafter;

fn ctx(tokens: &[u32], nodes: usize, depth: usize) -> DraftContext<'_> {
    DraftContext {
        tokens,
        prompt_len: tokens.len(),
        limits: TreeLimits::new(nodes, depth, 100),
    }
}

fn paths(t: &TokenTree) -> Vec<Vec<u32>> {
    let mut p: Vec<Vec<u32>> = t.leaves().map(|l| t.path_tokens(l)[1..].to_vec()).collect();
    p.sort();
    p
}

/// Proposes fixed (parent, token, score) nodes under whatever root it is
/// given, and counts the feedback it sees.
struct Fixed {
    nodes: Vec<(u32, u32, f32)>,
    root: Option<u32>,
    seen: Arc<Mutex<Vec<Vec<u32>>>>,
}

impl Drafter for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let root = self.root.unwrap_or(*ctx.tokens.last().unwrap());
        let limits = TreeLimits::new(64, 16, 1000);
        TokenTree::from_untrusted(root, self.nodes.iter().copied(), [], limits).unwrap()
    }

    fn observe(&mut self, feedback: &Feedback<'_>) {
        self.seen.lock().unwrap().push(feedback.committed.to_vec());
    }
}

fn fixed(nodes: &[(u32, u32, f32)], seen: &Arc<Mutex<Vec<Vec<u32>>>>) -> Box<dyn Drafter> {
    Box::new(Fixed {
        nodes: nodes.to_vec(),
        root: None,
        seen: Arc::clone(seen),
    })
}

#[test]
fn merges_best_first_and_forwards_feedback_to_all() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut m = Merged::new(vec![
        fixed(&[(0, 2, 0.9), (1, 3, 0.8), (2, 4, 0.1)], &seen),
        fixed(&[(0, 2, 0.5), (1, 5, 0.7), (0, 6, 0.2)], &seen),
    ]);
    assert_eq!(m.names().collect::<Vec<_>>(), vec!["fixed", "fixed"]);
    let t = m.propose(&ctx(&[1], 4, 8));
    // 2 (0.9), 2→3 (0.8), 2→5 (0.7); 6 (0.2) and 2→3→4 (0.1) are cut.
    assert_eq!(paths(&t), vec![vec![2, 3], vec![2, 5]]);
    assert_eq!(t.score(t.child_with(0, 2).unwrap()), 0.9);
    m.observe(&Feedback {
        tree: &t,
        path: &[0, 1],
        committed: &[2, 7],
        top_k: &[],
    });
    assert_eq!(*seen.lock().unwrap(), vec![vec![2, 7], vec![2, 7]]);
}

#[test]
fn unusable_subtrees_are_dropped() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let wrong_root = Box::new(Fixed {
        nodes: vec![(0, 8, 0.9)],
        root: Some(3),
        seen: Arc::clone(&seen),
    });
    let out_of_vocab = fixed(&[(0, 500, 0.9)], &seen);
    let good = fixed(&[(0, 2, 0.4)], &seen);
    let mut m = Merged::new(vec![wrong_root, out_of_vocab]);
    m.push(good);
    assert_eq!(m.len(), 3);
    let t = m.propose(&ctx(&[1], 8, 8));
    assert_eq!(paths(&t), vec![vec![2]]);
}

#[test]
fn no_drafters_or_a_broken_context_give_the_root_alone() {
    let mut m = Merged::new(Vec::new());
    assert!(m.is_empty());
    assert_eq!(m.propose(&ctx(&[1, 2], 8, 8)).tokens(), &[2]);
    assert_eq!(m.propose(&ctx(&[], 8, 8)).len(), 1);
    let t = m.propose(&ctx(&[u32::MAX], 8, 8));
    assert_eq!(t.len(), 1);
    assert!(format!("{m:?}").contains("Merged"));
}

#[test]
fn repetitive_text_is_predicted_by_the_merged_drafters() {
    let tokens: Vec<u32> = [10, 11, 12, 13, 14]
        .iter()
        .cycle()
        .take(33)
        .copied()
        .collect();
    let mut m = Merged::new(vec![
        Box::new(PromptLookup::default()),
        Box::new(SuffixDrafter::default()),
        Box::new(TokenRecycler::default()),
    ]);
    let t = m.propose(&ctx(&tokens, 8, 6));
    let deepest = (0..t.len()).max_by_key(|&i| t.depth(i)).unwrap();
    assert_eq!(t.path_tokens(deepest), vec![12, 13, 14, 10, 11, 12, 13]);
}
