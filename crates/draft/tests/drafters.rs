//! Properties every drafter must keep on any input: no panic, a valid tree
//! rooted at the last token and inside the step's budget, over whole
//! sessions (propose, verify, observe, repeat) so the incremental state is
//! exercised too.

use proptest::prelude::*;
use specmesh_draft::{
    DraftContext, Drafter, Feedback, GlobalConfig, GlobalSuffixIndex, LookupConfig, Merged,
    PromptLookup, RecycleConfig, SuffixConfig, SuffixDrafter, TenantKey, TokenRecycler, TokenTree,
    TreeLimits,
};

fn drafters(index: &GlobalSuffixIndex) -> Vec<Box<dyn Drafter>> {
    let small_suffix = SuffixConfig {
        max_depth: 4,
        session_window: 9,
        min_token_prob: 0.0,
        spec_offset: 3.0,
        ..SuffixConfig::default()
    };
    vec![
        Box::new(PromptLookup::default()),
        Box::new(PromptLookup::new(LookupConfig {
            min_ngram: 2,
            max_ngram: 2,
            max_matches: 64,
            max_chain: 3,
        })),
        Box::new(SuffixDrafter::with_global(
            SuffixConfig::default(),
            index,
            TenantKey::from("t"),
        )),
        Box::new(SuffixDrafter::new(small_suffix)),
        Box::new(TokenRecycler::default()),
        Box::new(TokenRecycler::new(RecycleConfig {
            k: 2,
            shape: vec![5, 0, 3],
        })),
        Box::new(Merged::new(vec![
            Box::new(PromptLookup::default()),
            Box::new(SuffixDrafter::with_global(
                SuffixConfig::default(),
                index,
                TenantKey::from("t"),
            )),
            Box::new(TokenRecycler::default()),
        ])),
    ]
}

fn check(tree: &TokenTree, tokens: &[u32], limits: TreeLimits) -> Result<(), TestCaseError> {
    let root = *tokens.last().unwrap();
    if root < limits.vocab {
        prop_assert_eq!(tree.root_token(), root);
    }
    prop_assert!(tree.len() <= limits.max_nodes.max(1));
    prop_assert!(tree.max_depth() <= limits.max_depth);
    for i in 0..tree.len() {
        prop_assert!(tree.token(i) < limits.vocab || i == 0);
        let s = tree.score(i);
        prop_assert!((0.0..=1.0).contains(&s));
        if let Some(p) = tree.parent(i) {
            prop_assert!(s <= tree.score(p));
        }
    }
    Ok(())
}

/// A session: the target "accepts" the path that follows `truth` as far as
/// it goes, then emits the next token of `truth` as the bonus.
fn run_session(
    d: &mut dyn Drafter,
    truth: &[u32],
    prompt_len: usize,
    limits: TreeLimits,
) -> Result<(), TestCaseError> {
    let mut len = prompt_len.clamp(1, truth.len());
    while len < truth.len() {
        let tokens = &truth[..len];
        let ctx = DraftContext {
            tokens,
            prompt_len,
            limits,
        };
        let tree = d.propose(&ctx);
        check(&tree, tokens, limits)?;
        let mut path = vec![0];
        let mut node = 0;
        while let Some(c) = truth
            .get(len + path.len() - 1)
            .and_then(|&t| tree.child_with(node, t))
        {
            path.push(c);
            node = c;
        }
        let end = (len + path.len()).min(truth.len());
        let committed = &truth[len..end];
        let top_k: Vec<Vec<(u32, f32)>> = (0..path.len())
            .map(|j| {
                let next = truth.get(len + j).copied().unwrap_or(0);
                vec![(next, -0.1), (next.wrapping_add(1), -2.5), (next, -3.0)]
            })
            .collect();
        d.observe(&Feedback {
            tree: &tree,
            path: &path,
            committed,
            top_k: &top_k,
        });
        len = end;
    }
    Ok(())
}

fn limits() -> impl Strategy<Value = TreeLimits> {
    (0usize..40, 0usize..10, 1u32..12).prop_map(|(n, d, v)| TreeLimits::new(n, d, v))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_drafter_keeps_the_tree_valid_and_in_budget(
        truth in prop::collection::vec(0u32..10, 1..120),
        prompt in 0usize..60,
        limits in limits(),
    ) {
        let index = GlobalSuffixIndex::new(GlobalConfig {
            max_bytes: 20_000,
            max_depth: 6,
            max_doc_tokens: 50,
        });
        for d in &mut drafters(&index) {
            run_session(d.as_mut(), &truth, prompt, limits)?;
        }
    }

    #[test]
    fn arbitrary_contexts_and_feedback_never_panic(
        steps in prop::collection::vec(
            (
                prop::collection::vec(any::<u32>(), 0..20),
                prop::collection::vec(any::<u32>(), 0..4),
                limits(),
            ),
            1..6,
        ),
    ) {
        let index = GlobalSuffixIndex::default();
        for d in &mut drafters(&index) {
            for (tokens, committed, limits) in &steps {
                let ctx = DraftContext { tokens, prompt_len: tokens.len() / 2, limits: *limits };
                let tree = d.propose(&ctx);
                if !tokens.is_empty() {
                    check(&tree, tokens, *limits)?;
                }
                let top_k = vec![committed.iter().map(|&t| (t, f32::NAN)).collect::<Vec<_>>(); 3];
                d.observe(&Feedback { tree: &tree, path: &[0, 7, 1], committed, top_k: &top_k });
            }
        }
    }
}

#[test]
fn finished_sessions_feed_later_ones_within_the_memory_bound() {
    let cfg = GlobalConfig {
        max_bytes: 50_000,
        max_depth: 8,
        max_doc_tokens: 64,
    };
    let index = GlobalSuffixIndex::new(cfg);
    let tenant = TenantKey::from("t");
    let answer: Vec<u32> = (100..140).collect();
    for i in 0..30u32 {
        let mut d = SuffixDrafter::with_global(SuffixConfig::default(), &index, tenant.clone());
        let mut tokens = vec![i, i + 1];
        tokens.extend_from_slice(&answer);
        let limits = TreeLimits::new(16, 8, 1000);
        run_session(&mut d, &tokens, 2, limits).unwrap();
        d.finish();
        assert!(index.bytes() <= cfg.max_bytes);
    }
    let mut d = SuffixDrafter::with_global(SuffixConfig::default(), &index, tenant);
    let ctx = [7, 7, 100, 101, 102];
    let tree = d.propose(&DraftContext {
        tokens: &ctx,
        prompt_len: 2,
        limits: TreeLimits::new(16, 8, 1000),
    });
    assert_eq!(tree.path_tokens(tree.len() - 1)[..3], [102, 103, 104]);
}
