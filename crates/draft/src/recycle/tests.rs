use super::*;
use specmesh_tree::TreeLimits;

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

fn ln(p: f32) -> f32 {
    p.ln()
}

#[test]
fn rows_keep_k_distinct_successors_in_order() {
    let mut r = TokenRecycler::new(RecycleConfig {
        k: 3,
        shape: vec![3],
    });
    assert!(r.is_empty());
    r.record(
        1,
        &[
            (5, -0.1),
            (5, -0.2),
            (6, f32::NAN),
            (u32::MAX, 0.0),
            (7, -3.0),
            (8, -4.0),
        ],
    );
    let row: Vec<(u32, f32)> = r.successors(1).collect();
    assert_eq!(row, vec![(5, -0.1), (6, f32::NEG_INFINITY), (7, -3.0)]);
    // A new observation replaces the row, shorter ones included.
    r.record(1, &[(9, -0.5)]);
    assert_eq!(r.successors(1).collect::<Vec<_>>(), vec![(9, -0.5)]);
    assert_eq!(r.successors(2).count(), 0);
    assert_eq!(r.len(), 1);
}

#[test]
fn feedback_updates_the_table_along_the_accepted_path() {
    let limits = TreeLimits::new(8, 4, 100);
    let tree =
        TokenTree::from_untrusted(5, [(0, 6, 0.9), (0, 9, 0.5), (1, 7, 0.8)], [], limits).unwrap();
    let mut r = TokenRecycler::default();
    let top_k = vec![
        vec![(6, -0.1), (9, -2.0)],
        vec![(7, -0.3)],
        vec![(3, -0.2), (4, -1.0)],
    ];
    r.observe(&Feedback {
        tree: &tree,
        path: &[0, 1, 3],
        committed: &[6, 7, 3],
        top_k: &top_k,
    });
    assert_eq!(
        r.successors(5).collect::<Vec<_>>(),
        vec![(6, -0.1), (9, -2.0)]
    );
    assert_eq!(r.successors(6).collect::<Vec<_>>(), vec![(7, -0.3)]);
    assert_eq!(
        r.successors(7).collect::<Vec<_>>(),
        vec![(3, -0.2), (4, -1.0)]
    );
    assert_eq!(r.len(), 3);
    // Mismatched lengths and bad node indices are tolerated.
    r.observe(&Feedback {
        tree: &tree,
        path: &[0, 99],
        committed: &[1],
        top_k: &[vec![(1, -0.1)], vec![(2, -0.1)], vec![]],
    });
    assert_eq!(r.successors(5).collect::<Vec<_>>(), vec![(1, -0.1)]);
}

#[test]
fn the_tree_follows_the_fixed_shape() {
    let mut r = TokenRecycler::new(RecycleConfig {
        k: 4,
        shape: vec![2, 1],
    });
    r.record(1, &[(2, ln(0.5)), (3, ln(0.3)), (4, ln(0.2))]);
    r.record(2, &[(5, ln(0.6)), (6, ln(0.4))]);
    r.record(3, &[(7, ln(0.9))]);
    r.record(5, &[(8, ln(0.9))]);
    let t = r.propose(&ctx(&[9, 1], 32, 8));
    assert_eq!(paths(&t), vec![vec![2, 5], vec![3, 7]]);
    let s = t.score(t.child_with(t.child_with(0, 3).unwrap(), 7).unwrap());
    assert!((s - 0.27).abs() < 1e-6);
}

#[test]
fn a_small_budget_keeps_the_most_probable_part() {
    let mut r = TokenRecycler::default();
    r.record(1, &[(2, ln(0.5)), (3, ln(0.3)), (4, ln(0.2))]);
    r.record(2, &[(5, ln(0.9))]);
    // 2 (0.5), 2→5 (0.45), 3 (0.3), 4 (0.2): three drafts keep the first three.
    let t = r.propose(&ctx(&[1], 4, 8));
    assert_eq!(paths(&t), vec![vec![2, 5], vec![3]]);
    let t = r.propose(&ctx(&[1], 8, 1));
    assert_eq!(paths(&t), vec![vec![2], vec![3], vec![4]]);
}

#[test]
fn successors_outside_the_vocabulary_are_skipped() {
    let mut r = TokenRecycler::default();
    r.record(1, &[(500, -0.1), (2, -0.2)]);
    let t = r.propose(&ctx(&[1], 8, 4));
    assert_eq!(paths(&t), vec![vec![2]]);
    // Unknown root, or a root outside the vocabulary: the root alone.
    assert_eq!(r.propose(&ctx(&[3], 8, 4)).len(), 1);
    assert_eq!(r.propose(&ctx(&[300], 8, 4)).len(), 1);
}

#[test]
fn repetitive_text_is_predicted() {
    // The target keeps saying 10 11 12 13 14 10 …; each step it accepts
    // nothing but reports its top-2 after the root.
    let next = |t: u32| 10 + (t - 9) % 5;
    let mut r = TokenRecycler::default();
    let mut tokens = vec![10u32];
    for _ in 0..12 {
        let tree = r.propose(&ctx(&tokens, 16, 6));
        let root = *tokens.last().unwrap();
        let top = vec![vec![(next(root), -0.05), (99, -3.0)]];
        r.observe(&Feedback {
            tree: &tree,
            path: &[0],
            committed: &[next(root)],
            top_k: &top,
        });
        tokens.push(next(root));
    }
    assert_eq!(*tokens.last().unwrap(), 12);
    let t = r.propose(&ctx(&tokens, 8, 6));
    let best = (1..t.len())
        .filter(|&i| t.depth(i) == 6)
        .max_by(|&a, &b| t.score(a).total_cmp(&t.score(b)));
    assert_eq!(
        t.path_tokens(best.unwrap()),
        vec![12, 13, 14, 10, 11, 12, 13]
    );
}
