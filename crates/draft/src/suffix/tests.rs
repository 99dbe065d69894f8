use super::*;
use specmesh_tree::TreeLimits;

fn ctx(tokens: &[u32], prompt_len: usize, nodes: usize, depth: usize) -> DraftContext<'_> {
    DraftContext {
        tokens,
        prompt_len,
        limits: TreeLimits::new(nodes, depth, 100),
    }
}

fn paths(t: &TokenTree) -> Vec<Vec<u32>> {
    let mut p: Vec<Vec<u32>> = t.leaves().map(|l| t.path_tokens(l)[1..].to_vec()).collect();
    p.sort();
    p
}

/// A deterministic pseudo-random token stream over `0..vocab`.
fn stream(seed: u64, n: usize, vocab: u32) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % u64::from(vocab)) as u32
        })
        .collect()
}

#[test]
fn trie_counts_every_truncated_substring() {
    let mut t = SuffixTrie::new(3);
    t.insert(&[1, 2, 1, 2, 3], 1);
    let d = t.dump();
    assert_eq!(d[&vec![1]], (2, 2));
    assert_eq!(d[&vec![1, 2]], (2, 2));
    assert_eq!(d[&vec![1, 2, 1]], (1, 0));
    assert_eq!(d[&vec![2]], (2, 2));
    assert_eq!(d[&vec![2, 3]], (1, 0));
    assert_eq!(d[&vec![3]], (1, 0));
    assert!(!d.contains_key(&vec![1, 2, 1, 2]));
    assert_eq!(d[&vec![]].1, 5);
    assert_eq!(t.live_nodes(), d.len() - 1);
}

#[test]
fn trie_removal_exactly_undoes_insertion() {
    for seed in 0..20 {
        let a = stream(seed, 60, 4);
        let b = stream(seed + 100, 45, 4);
        let mut t = SuffixTrie::new(6);
        t.insert(&a, 2);
        t.insert(&b, 1);
        t.remove(&a, 2);
        let mut only_b = SuffixTrie::new(6);
        only_b.insert(&b, 1);
        assert_eq!(t.dump(), only_b.dump());
        assert_eq!(t.live_nodes(), only_b.live_nodes());
        t.remove(&b, 1);
        assert_eq!(t.live_nodes(), 0);
        // Freed nodes are reused.
        t.insert(&b, 1);
        assert_eq!(t.dump(), only_b.dump());
    }
}

#[test]
fn session_index_incremental_and_windowed_equals_rebuilt() {
    let cfg = SuffixConfig {
        max_depth: 5,
        session_window: 12,
        ..SuffixConfig::default()
    }
    .clamped();
    for seed in 0..10 {
        let tokens = stream(seed, 200, 3);
        let mut inc = SessionIndex::new(&cfg);
        let chunks = stream(seed + 7, 200, 5);
        let mut end = 0;
        let mut i = 0;
        while end < tokens.len() {
            end = (end + 1 + chunks[i] as usize).min(tokens.len());
            i += 1;
            inc.sync(&tokens[..end]);
            let mut fresh = SuffixTrie::new(5);
            fresh.insert(&tokens[end.saturating_sub(12)..end], 1);
            assert_eq!(inc.trie.dump(), fresh.dump(), "seed {seed} at {end}");
            assert_eq!(inc.trie.live_nodes(), fresh.live_nodes());
        }
    }
}

#[test]
fn a_diverging_context_rebuilds_the_session() {
    let mut s = SessionIndex::new(&SuffixConfig::default().clamped());
    s.sync(&[1, 2, 3, 4]);
    s.sync(&[7, 8, 7]);
    let mut fresh = SuffixTrie::new(24);
    fresh.insert(&[7, 8, 7], 1);
    assert_eq!(s.trie.dump(), fresh.dump());
}

#[test]
fn longest_match_needs_a_continuation() {
    let mut t = SuffixTrie::new(8);
    t.insert(&[5, 1, 2, 3, 9, 1, 2, 3], 1);
    // "1 2 3" occurs followed by 9; "9 1 2 3" occurs only at the end.
    let (_, m) = t.longest_match(&[4, 9, 1, 2, 3], 8).unwrap();
    assert_eq!(m, 3);
    assert_eq!(t.longest_match(&[4, 9, 1, 2, 3], 2).unwrap().1, 2);
    assert!(t.longest_match(&[6], 8).is_none());
    assert!(t.longest_match(&[], 8).is_none());
}

#[test]
fn proposes_a_tree_of_frequent_continuations() {
    let cfg = SuffixConfig {
        max_pattern: 2,
        spec_offset: 2.0,
        ..SuffixConfig::default()
    };
    let mut d = SuffixDrafter::new(cfg);
    let tokens = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2];
    let t = d.propose(&ctx(&tokens, tokens.len(), 16, 8));
    // After "1 2": 3 twice, 4 once (+1 pseudo-count): 0.5 and 0.25; then
    // "1 2 3" → 1 at 2/3, "1 2 3 1" → 2 at 2/3.
    assert_eq!(paths(&t), vec![vec![3, 1, 2], vec![4]]);
    let s = |p: &[u32]| {
        let n = p.iter().try_fold(0, |n, &x| t.child_with(n, x)).unwrap();
        t.score(n)
    };
    assert!((s(&[3]) - 0.5).abs() < 1e-6);
    assert!((s(&[4]) - 0.25).abs() < 1e-6);
    assert!((s(&[3, 1, 2]) - 0.5 * 4.0 / 9.0).abs() < 1e-6);
}

#[test]
fn the_budget_grows_with_the_match_length() {
    let mut d = SuffixDrafter::default();
    let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3];
    let t = d.propose(&ctx(&tokens, 0, 32, 16));
    // A 3-token match drafts 3 tokens.
    assert_eq!(paths(&t), vec![vec![4, 5, 6]]);
    let t = d.propose(&ctx(&tokens, 0, 3, 16));
    assert_eq!(t.len(), 3);
}

#[test]
fn repetitive_text_is_predicted() {
    let tokens: Vec<u32> = [10, 11, 12, 13, 14]
        .iter()
        .cycle()
        .take(33)
        .copied()
        .collect();
    let mut d = SuffixDrafter::default();
    let t = d.propose(&ctx(&tokens, 5, 8, 6));
    assert_eq!(t.root_token(), 12);
    assert_eq!(paths(&t), vec![vec![13, 14, 10, 11, 12, 13]]);
}

#[test]
fn global_index_drafts_a_finished_sessions_output() {
    let index = GlobalSuffixIndex::default();
    let acme = TenantKey::from("acme");
    let mut s = SuffixDrafter::with_global(SuffixConfig::default(), &index, acme.clone());
    let prompt = [1, 2];
    let mut tokens = prompt.to_vec();
    let out = [40, 41, 42, 43, 44, 45, 46, 47];
    s.propose(&ctx(&tokens, 2, 8, 8));
    tokens.extend_from_slice(&out[..5]);
    s.propose(&ctx(&tokens, 2, 8, 8));
    // The last committed tokens arrive through feedback only.
    let tree = TokenTree::root_only(44, TreeLimits::new(8, 8, 100)).unwrap();
    s.observe(&Feedback {
        tree: &tree,
        path: &[0],
        committed: &out[5..],
        top_k: &[],
    });
    assert_eq!(s.output(), out.to_vec());
    s.finish();
    assert_eq!(index.tenant_documents(&acme), 1);

    let mut next = SuffixDrafter::with_global(SuffixConfig::default(), &index, acme);
    let t = next.propose(&ctx(&[9, 9, 40, 41, 42, 43], 3, 8, 8));
    assert_eq!(paths(&t), vec![vec![44, 45, 46, 47]]);
}

#[test]
fn tenants_never_draft_each_others_text() {
    let index = GlobalSuffixIndex::default();
    let (a, b) = (TenantKey::from("a"), TenantKey::from("b"));
    let secret = [70, 71, 72, 73, 74, 75];
    index.insert(&a, &secret);
    let context = [70, 71, 72];
    let mut da = SuffixDrafter::with_global(SuffixConfig::default(), &index, a.clone());
    let mut db = SuffixDrafter::with_global(SuffixConfig::default(), &index, b.clone());
    assert_eq!(
        paths(&da.propose(&ctx(&context, 3, 8, 8))),
        vec![vec![73, 74, 75]]
    );
    assert_eq!(db.propose(&ctx(&context, 3, 8, 8)).len(), 1);
    // Nor after b stores text of its own, or a tenant with a similar name.
    index.insert(&b, &[70, 71, 72, 80]);
    index.insert(&TenantKey::from("a "), &[70, 71, 72, 81]);
    let t = db.propose(&ctx(&context, 3, 8, 8));
    assert_eq!(paths(&t), vec![vec![80]]);
    let t = da.propose(&ctx(&context, 3, 8, 8));
    assert_eq!(paths(&t), vec![vec![73, 74, 75]]);
    // Removing a tenant forgets exactly its text.
    index.remove_tenant(&a);
    assert_eq!(da.propose(&ctx(&context, 3, 8, 8)).len(), 1);
    assert_eq!(paths(&db.propose(&ctx(&context, 3, 8, 8))), vec![vec![80]]);
}

#[test]
fn lru_eviction_keeps_the_index_within_its_budget() {
    let cfg = GlobalConfig {
        max_bytes: 200_000,
        max_depth: 8,
        max_doc_tokens: 1000,
    };
    let index = GlobalSuffixIndex::new(cfg);
    let t = TenantKey::from("t");
    let docs: Vec<Vec<u32>> = (0..40).map(|i| stream(i, 50, 100)).collect();
    for (i, doc) in docs.iter().enumerate() {
        index.insert(&t, doc);
        assert!(
            index.bytes() <= cfg.max_bytes,
            "{} after {i}",
            index.bytes()
        );
        // Re-inserting the first document keeps it recently used.
        index.insert(&t, &docs[0]);
    }
    let kept = index.tenant_documents(&t);
    assert!(kept > 3 && kept < docs.len(), "{kept}");
    let mut d = SuffixDrafter::with_global(
        SuffixConfig {
            session_window: 0,
            ..SuffixConfig::default()
        },
        &index,
        t.clone(),
    );
    // Whether the document's own continuation is drafted.
    let drafts = |d: &mut SuffixDrafter, doc: &[u32]| {
        let t = d.propose(&ctx(&doc[..10], 0, 8, 8));
        t.child_with(0, doc[10])
            .and_then(|n| t.child_with(n, doc[11]))
            .is_some()
    };
    assert!(drafts(&mut d, &docs[0]), "the touched document was evicted");
    assert!(drafts(&mut d, &docs[39]), "the newest document was evicted");
    assert!(
        !drafts(&mut d, &docs[1]),
        "the oldest untouched document survived"
    );
    // Emptying the tenant releases everything.
    index.remove_tenant(&t);
    assert_eq!(index.bytes(), 0);
    assert_eq!(index.documents(), 0);
}

#[test]
fn a_document_over_the_budget_is_not_kept() {
    let index = GlobalSuffixIndex::new(GlobalConfig {
        max_bytes: 1000,
        ..GlobalConfig::default()
    });
    index.insert(&"t".into(), &stream(1, 500, 1000));
    assert_eq!(index.documents(), 0);
    assert_eq!(index.bytes(), 0);
}

#[test]
fn concurrent_sessions_and_inserts() {
    let index = GlobalSuffixIndex::new(GlobalConfig {
        max_bytes: 200_000,
        ..GlobalConfig::default()
    });
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let index = index.clone();
            s.spawn(move || {
                let tenant = TenantKey::from(format!("t{}", w % 2));
                for i in 0..20 {
                    let tokens = stream(w * 100 + i % 5, 120, 50);
                    let mut d =
                        SuffixDrafter::with_global(SuffixConfig::default(), &index, tenant.clone());
                    for end in (10..tokens.len()).step_by(7) {
                        let t = d.propose(&ctx(&tokens[..end], 5, 16, 8));
                        assert!(t.len() <= 16);
                    }
                    d.finish();
                }
            });
        }
    });
    assert!(index.bytes() <= 200_000);
    assert!(index.documents() > 0);
}

#[test]
fn the_index_is_a_shareable_handle() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    fn sendable<T: Send + 'static>() {}
    shareable::<GlobalSuffixIndex>();
    sendable::<SuffixDrafter>();
    let a = GlobalSuffixIndex::default();
    let b = a.clone();
    a.insert(&"t".into(), &[1, 2, 3]);
    assert_eq!(b.documents(), 1);
    // Identical documents are stored once.
    b.insert(&"t".into(), &[1, 2, 3]);
    assert_eq!(a.documents(), 1);
}
