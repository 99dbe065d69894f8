//! Invariants of token trees: construction, untrusted input, merging.

use proptest::prelude::*;
use specmesh_tree::{TokenTree, TreeBuilder, TreeError, TreeLimits, merge};

fn limits(nodes: usize, depth: usize) -> TreeLimits {
    TreeLimits::new(nodes, depth, 100)
}

/// The example of the crate docs.
fn example() -> TokenTree {
    let mut b = TreeBuilder::new(10, limits(16, 4)).unwrap();
    let cat = b.push(0, 11, 0.6).unwrap();
    b.push(0, 12, 0.3).unwrap();
    b.push(cat, 13, 0.5).unwrap();
    b.push(cat, 14, 0.1).unwrap();
    b.build()
}

#[test]
fn structure_of_a_small_tree() {
    let t = example();
    assert_eq!(t.len(), 5);
    assert_eq!(t.draft_len(), 4);
    assert_eq!(t.tokens(), &[10, 11, 12, 13, 14]);
    assert_eq!(
        t.parent_list(),
        vec![None, Some(0), Some(0), Some(1), Some(1)]
    );
    assert_eq!(t.children(0), &[1, 2]);
    assert_eq!(t.children(1), &[3, 4]);
    assert!(t.children(2).is_empty());
    assert_eq!(t.depth(4), 2);
    assert_eq!(t.max_depth(), 2);
    assert_eq!(t.path_to(4), vec![0, 1, 4]);
    assert_eq!(t.path_tokens(3), vec![10, 11, 13]);
    assert_eq!(t.child_with(1, 14), Some(4));
    assert_eq!(t.child_with(2, 14), None);
    assert!(t.is_ancestor(1, 3) && !t.is_ancestor(2, 3) && t.is_ancestor(0, 4));
    assert_eq!(t.leaves().collect::<Vec<_>>(), vec![2, 3, 4]);
    let m = t.attention_mask();
    let row = |i: usize| (0..5).filter(|&j| m[i * 5 + j]).collect::<Vec<_>>();
    assert_eq!(row(3), vec![0, 1, 3]);
    assert_eq!(row(2), vec![0, 2]);
}

#[test]
fn builder_collapses_duplicate_siblings_and_clamps_scores() {
    let mut b = TreeBuilder::new(1, limits(8, 8)).unwrap();
    let a = b.push(0, 5, 0.2).unwrap();
    assert_eq!(b.push(0, 5, 0.7).unwrap(), a);
    assert_eq!(b.score(a), 0.7);
    let c = b.push(a, 6, 0.9).unwrap();
    assert_eq!(b.score(c), 0.7, "a child never scores above its parent");
    assert_eq!(b.len(), 3);
}

#[test]
fn builder_enforces_budgets_and_vocabulary() {
    let mut b = TreeBuilder::new(1, limits(3, 1)).unwrap();
    let a = b.push(0, 2, 0.5).unwrap();
    assert!(matches!(
        b.push(a, 3, 0.5),
        Err(TreeError::TooDeep {
            depth: 2,
            max: 1,
            ..
        })
    ));
    b.push(0, 3, 0.5).unwrap();
    assert!(b.is_full());
    assert!(matches!(
        b.push(0, 4, 0.5),
        Err(TreeError::TooManyNodes { nodes: 4, max: 3 })
    ));
    assert!(matches!(
        b.push(0, 100, 0.5),
        Err(TreeError::TokenOutOfVocab { token: 100, .. })
    ));
    assert!(matches!(
        b.push(0, 4, f32::NAN),
        Err(TreeError::BadScore { .. })
    ));
    assert!(matches!(
        b.push(7, 4, 0.5),
        Err(TreeError::BadParent { parent: 7, .. })
    ));
    assert!(TreeBuilder::new(100, limits(3, 1)).is_err());
}

#[test]
fn untrusted_input_is_checked_with_clear_errors() {
    let l = limits(4, 3);
    let ok = TokenTree::from_untrusted(1, [(0, 2, 0.5), (1, 3, 0.4)], [], l).unwrap();
    assert_eq!(ok.path_tokens(2), vec![1, 2, 3]);

    let cycle = TokenTree::from_untrusted(1, [(0, 2, 0.5), (2, 3, 0.4)], [], l).unwrap_err();
    assert_eq!(
        cycle.to_string(),
        "node 2 names parent 2: a parent must be an earlier node (a later one would allow a cycle)"
    );
    let dup = TokenTree::from_untrusted(1, [(0, 2, 0.5), (0, 2, 0.4)], [], l).unwrap_err();
    assert_eq!(
        dup,
        TreeError::DuplicateSibling {
            index: 2,
            sibling: 1,
            token: 2
        }
    );
    let big = TokenTree::from_untrusted(1, (0..4).map(|i| (0, i + 2, 0.1)), [], l).unwrap_err();
    assert_eq!(
        big.to_string(),
        "the tree has 5 nodes, over the budget of 4"
    );
    let vocab = TokenTree::from_untrusted(1, [(0, 1000, 0.5)], [], l).unwrap_err();
    assert_eq!(
        vocab.to_string(),
        "node 1 has token 1000, but the vocabulary has 100 tokens"
    );
    let deep = TokenTree::from_untrusted(
        1,
        [(0, 2, 1.0), (1, 3, 1.0), (2, 4, 1.0), (3, 5, 1.0)],
        [],
        limits(8, 3),
    );
    assert!(matches!(
        deep,
        Err(TreeError::TooDeep {
            index: 4,
            depth: 4,
            max: 3
        })
    ));
}

#[test]
fn draft_distributions_must_cover_their_children() {
    let l = limits(8, 3);
    let t = TokenTree::from_untrusted(
        1,
        [(0, 2, 0.5), (0, 3, 0.3)],
        [(0, vec![(2, 0.5), (3, 0.3), (4, 0.2)])],
        l,
    )
    .unwrap();
    assert!((t.draft_dist(0).unwrap().prob(3) - 0.3).abs() < 1e-6);
    assert!(t.draft_dist(1).is_none() && t.has_draft_dists());

    let missing =
        TokenTree::from_untrusted(1, [(0, 2, 0.5), (0, 3, 0.3)], [(0, vec![(2, 1.0)])], l);
    assert!(matches!(
        missing,
        Err(TreeError::BadDraftDist { index: 0, .. })
    ));
    let not_normalised = TokenTree::from_untrusted(1, [(0, 2, 0.5)], [(0, vec![(2, 0.5)])], l);
    assert!(matches!(
        not_normalised,
        Err(TreeError::BadDraftDist { .. })
    ));
    let negative = TokenTree::from_untrusted(1, [(0, 2, 0.5)], [(0, vec![(2, 1.5), (3, -0.5)])], l);
    assert!(negative.is_err());
    let repeated = TokenTree::from_untrusted(1, [(0, 2, 0.5)], [(0, vec![(2, 0.5), (2, 0.5)])], l);
    assert!(repeated.is_err());
    let no_node = TokenTree::from_untrusted(1, [(0, 2, 0.5)], [(5, vec![(2, 1.0)])], l);
    assert!(no_node.is_err());
}

#[test]
fn merge_collapses_shared_prefixes_and_keeps_the_best() {
    let l = limits(16, 8);
    let a = TokenTree::from_untrusted(1, [(0, 2, 0.9), (1, 3, 0.8), (2, 4, 0.2)], [], l).unwrap();
    let b = TokenTree::from_untrusted(1, [(0, 2, 0.5), (1, 5, 0.45), (0, 6, 0.3)], [], l).unwrap();
    let m = merge(&[&a, &b], l).unwrap();
    // root, 2, 3, 4, 5, 6: the shared "2" appears once.
    assert_eq!(m.len(), 6);
    let two = m.child_with(0, 2).unwrap();
    assert_eq!(m.score(two), 0.9);
    assert_eq!(m.children(two).len(), 2);

    // Budget 4: root + the three best nodes (2: 0.9, 3: 0.8, 5: 0.45).
    let small = merge(&[&a, &b], limits(4, 8)).unwrap();
    let mut kept: Vec<u32> = small.tokens()[1..].to_vec();
    kept.sort();
    assert_eq!(kept, vec![2, 3, 5]);

    let other_root = TokenTree::root_only(9, l).unwrap();
    assert_eq!(
        merge(&[&a, &other_root], l).unwrap_err(),
        TreeError::RootMismatch { first: 1, other: 9 }
    );
    assert_eq!(merge(&[], l).unwrap_err(), TreeError::NothingToMerge);
}

#[test]
fn draft_distributions_survive_only_an_uncut_single_tree() {
    let l = limits(16, 4);
    let q = vec![(2, 0.5), (3, 0.3), (4, 0.2)];
    let t =
        TokenTree::from_untrusted(1, [(0, 2, 0.5), (0, 3, 0.4), (0, 4, 0.1)], [(0, q)], l).unwrap();
    let whole = merge(&[&t], l).unwrap();
    assert!(whole.draft_dist(0).is_some());
    assert_eq!(
        whole.tokens(),
        t.tokens(),
        "child order is the sampling order"
    );
    // Any cut depends on which tokens were drawn (through their scores), so
    // q goes, even when the kept children are a prefix of the sampled ones.
    let cut = merge(&[&t], limits(3, 4)).unwrap();
    assert_eq!(cut.tokens(), &[1, 2, 3]);
    assert!(!cut.has_draft_dists());
    // Two trees: candidates are no longer a sample of one q.
    let mixed = merge(&[&t, &t.clone()], l).unwrap();
    assert!(!mixed.has_draft_dists());
}

/// Random wire input: (parent offset, token, score) triples.
fn arb_nodes() -> impl Strategy<Value = Vec<(u32, u32, f32)>> {
    prop::collection::vec((0u32..40, 0u32..12, 0.0f32..=1.0), 0..40)
}

fn check_invariants(t: &TokenTree) {
    let l = t.limits();
    assert!(t.len() <= l.max_nodes);
    assert!(t.max_depth() <= l.max_depth);
    for i in 1..t.len() {
        let p = t.parent(i).unwrap();
        assert!(p < i);
        assert_eq!(t.depth(i), t.depth(p) + 1);
        assert!(t.score(i) <= t.score(p));
        assert!(t.token(i) < l.vocab);
        assert!(t.children(p).contains(&(i as u32)));
        assert_eq!(t.path_to(i).last(), Some(&i));
    }
    for i in 0..t.len() {
        let mut toks: Vec<u32> = t.children(i).iter().map(|&c| t.token(c as usize)).collect();
        let n = toks.len();
        toks.sort();
        toks.dedup();
        assert_eq!(toks.len(), n, "siblings are distinct");
    }
    let total: usize = (0..t.len()).map(|i| t.children(i).len()).sum();
    assert_eq!(total, t.len() - 1);
}

proptest! {
    #[test]
    fn untrusted_input_never_panics_and_valid_trees_keep_invariants(
        nodes in arb_nodes(), max_nodes in 1usize..48, max_depth in 0usize..10,
    ) {
        let l = TreeLimits::new(max_nodes, max_depth, 10);
        let wire: Vec<_> = nodes.iter().enumerate()
            .map(|(j, &(off, tok, s))| ((j as u32 + 1).saturating_sub(off % 3), tok, s))
            .collect();
        if let Ok(t) = TokenTree::from_untrusted(0, wire, [], l) {
            check_invariants(&t);
        }
    }

    #[test]
    fn builder_and_merge_keep_invariants(
        a in arb_nodes(), b in arb_nodes(), max_nodes in 1usize..48, max_depth in 0usize..10,
    ) {
        let big = TreeLimits::new(64, 16, 12);
        let build = |nodes: &[(u32, u32, f32)]| {
            let mut bld = TreeBuilder::new(0, big).unwrap();
            for &(p, tok, s) in nodes {
                let parent = p as usize % bld.len();
                let _ = bld.push(parent, tok, s);
            }
            bld.build()
        };
        let (ta, tb) = (build(&a), build(&b));
        check_invariants(&ta);
        let l = TreeLimits::new(max_nodes, max_depth, 12);
        let m = merge(&[&ta, &tb], l).unwrap();
        check_invariants(&m);
        // Every merged path exists in one of the inputs.
        for i in 0..m.len() {
            let path = m.path_tokens(i);
            let found = |t: &TokenTree| (0..t.len()).any(|j| t.path_tokens(j) == path);
            prop_assert!(found(&ta) || found(&tb));
        }
        // With room for everything, nothing is lost.
        let all = merge(&[&ta, &tb], TreeLimits::new(128, 16, 12)).unwrap();
        for t in [&ta, &tb] {
            for j in 0..t.len() {
                let path = t.path_tokens(j);
                prop_assert!((0..all.len()).any(|i| all.path_tokens(i) == path));
            }
        }
    }
}

#[test]
fn a_subtree_is_rerooted_with_its_order_scores_and_draft_distributions() {
    // 10 ─┬─ 11 (0.6) ─┬─ 13 (0.5) ── 15 (0.4)
    //     │            └─ 14 (0.1)
    //     └─ 12 (0.3)
    let t = TokenTree::from_untrusted(
        10,
        [
            (0, 11, 0.6),
            (0, 12, 0.3),
            (1, 13, 0.5),
            (1, 14, 0.1),
            (3, 15, 0.4),
        ],
        [
            (1, vec![(13, 0.7), (14, 0.2), (16, 0.1)]),
            (3, vec![(15, 1.0)]),
        ],
        limits(16, 4),
    )
    .unwrap();
    let s = t.subtree(1, limits(16, 4)).unwrap();
    assert_eq!(s.tokens(), &[11, 13, 14, 15]);
    assert_eq!(s.parent_list(), vec![None, Some(0), Some(0), Some(1)]);
    assert_eq!(s.score(0), 1.0);
    assert!((s.score(1) - 0.5 / 0.6).abs() < 1e-6);
    assert!((s.score(3) - 0.4 / 0.6).abs() < 1e-6);
    assert!((s.draft_dist(0).unwrap().prob(14) - 0.2).abs() < 1e-6);
    assert!(s.draft_dist(1).is_some());

    // Budgets cut the deepest level and the last-drafted nodes; a kept
    // distribution describes a prefix of its node's children.
    let shallow = t.subtree(1, limits(16, 1)).unwrap();
    assert_eq!(shallow.tokens(), &[11, 13, 14]);
    assert!(shallow.draft_dist(1).is_none(), "13 lost its only child");
    let small = t.subtree(1, limits(2, 4)).unwrap();
    assert_eq!(small.tokens(), &[11, 13]);
    assert!(small.draft_dist(0).is_some());

    // A leaf is a root-only tree; a node that does not exist is an error.
    assert_eq!(t.subtree(2, limits(16, 4)).unwrap().tokens(), &[12]);
    assert_eq!(
        t.subtree(6, limits(16, 4)),
        Err(TreeError::NoSuchNode { index: 6, len: 6 })
    );
}

#[test]
fn a_placeholder_is_the_root_alone_as_far_as_the_limits_allow() {
    let limits = TreeLimits::new(8, 4, 100);
    let t = TokenTree::placeholder(Some(7), limits);
    assert_eq!((t.len(), t.token(0)), (1, 7));
    // A root outside the vocabulary keeps its token under a vocabulary
    // just wide enough; no root at all is token 0.
    assert_eq!(TokenTree::placeholder(Some(500), limits).token(0), 500);
    assert_eq!(TokenTree::placeholder(None, limits).token(0), 0);
}
