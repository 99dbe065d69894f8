use super::*;
use specmesh_tree::TreeLimits;

fn ctx(tokens: &[u32], nodes: usize, depth: usize) -> DraftContext<'_> {
    DraftContext {
        tokens,
        prompt_len: tokens.len(),
        limits: TreeLimits::new(nodes, depth, 100),
    }
}

/// Root-to-leaf token paths (without the root), sorted.
fn paths(t: &TokenTree) -> Vec<Vec<u32>> {
    let mut p: Vec<Vec<u32>> = t.leaves().map(|l| t.path_tokens(l)[1..].to_vec()).collect();
    p.sort();
    p
}

#[test]
fn proposes_the_continuation_of_the_longest_match() {
    let mut d = PromptLookup::default();
    let t = d.propose(&ctx(&[1, 2, 3, 4, 9, 1, 2, 3], 16, 3));
    assert_eq!(t.root_token(), 3);
    assert_eq!(paths(&t), vec![vec![4, 9, 1]]);
    // A single 3-gram match: share 1, so the score is the prior rate^depth.
    let r = 3.0f32 / 4.5;
    assert!((t.score(1) - r).abs() < 1e-6);
    assert!((t.score(3) - r * r * r).abs() < 1e-6);
}

#[test]
fn several_matches_become_branches_scored_by_share() {
    let cfg = LookupConfig {
        max_ngram: 2,
        ..LookupConfig::default()
    };
    let mut d = PromptLookup::new(cfg);
    // "5 1" is followed once by 7 and once by 8 (most recent).
    let t = d.propose(&ctx(&[5, 1, 7, 5, 1, 8, 5, 1], 16, 2));
    assert_eq!(paths(&t), vec![vec![7, 5], vec![8, 5]]);
    let s7 = t.score(t.child_with(0, 7).unwrap());
    let s8 = t.score(t.child_with(0, 8).unwrap());
    assert!((s7 - s8).abs() < 1e-6 && s7 < 0.5);
}

#[test]
fn agreeing_matches_share_a_prefix_with_a_higher_score() {
    let cfg = LookupConfig {
        max_ngram: 1,
        max_matches: 3,
        ..LookupConfig::default()
    };
    let mut d = PromptLookup::new(cfg);
    // After 1: 2 twice, 3 once.
    let t = d.propose(&ctx(&[1, 2, 1, 3, 1, 2, 1], 16, 1));
    let s2 = t.score(t.child_with(0, 2).unwrap());
    let s3 = t.score(t.child_with(0, 3).unwrap());
    assert!((s2 / s3 - 2.0).abs() < 1e-5, "{s2} vs {s3}");
}

#[test]
fn a_tight_budget_keeps_the_longest_match() {
    let mut d = PromptLookup::default();
    // The 3-gram "1 2 3" says 4; the unigram "3" alone says 5.
    let tokens = [1, 2, 3, 4, 7, 3, 5, 1, 2, 3];
    let t = d.propose(&ctx(&tokens, 2, 4));
    assert_eq!(t.tokens(), &[3, 4]);
    let t = d.propose(&ctx(&tokens, 16, 1));
    assert_eq!(paths(&t), vec![vec![4], vec![5]]);
}

#[test]
fn nothing_to_match_gives_the_root_alone() {
    let mut d = PromptLookup::default();
    assert_eq!(d.propose(&ctx(&[1, 2, 3, 4], 16, 4)).len(), 1);
    assert_eq!(d.propose(&ctx(&[7], 16, 4)).len(), 1);
    // No room for drafts.
    assert_eq!(d.propose(&ctx(&[1, 2, 1, 2], 1, 4)).len(), 1);
    assert_eq!(d.propose(&ctx(&[1, 2, 1, 2], 8, 0)).len(), 1);
}

#[test]
fn repetitive_text_is_predicted() {
    let cycle = [10, 11, 12, 13, 14];
    let tokens: Vec<u32> = cycle.iter().cycle().take(23).copied().collect();
    let mut d = PromptLookup::default();
    let t = d.propose(&ctx(&tokens, 8, 6));
    // Last token 12: next are 13 14 10 11 12 13.
    assert_eq!(t.root_token(), 12);
    let leaf = (0..t.len()).max_by_key(|&i| t.depth(i)).unwrap();
    assert_eq!(t.path_tokens(leaf), vec![12, 13, 14, 10, 11, 12, 13]);
}

#[test]
fn incremental_index_equals_a_rebuilt_one() {
    let mut state = 12345u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % 6) as u32
    };
    let tokens: Vec<u32> = (0..300).map(|_| next()).collect();
    let mut inc = PromptLookup::default();
    let mut end = 1;
    while end <= tokens.len() {
        let a = inc.propose(&ctx(&tokens[..end], 12, 4));
        let mut fresh = PromptLookup::default();
        let b = fresh.propose(&ctx(&tokens[..end], 12, 4));
        assert_eq!(a, b, "at {end}");
        assert_eq!(inc.heads, fresh.heads);
        assert_eq!(inc.prev, fresh.prev);
        end += 1 + (next() as usize);
    }
}

/// The matches a full scan finds: per length, longest first, the most
/// recent earlier occurrences not already used, `max` in all.
fn brute_force(t: &[u32], cfg: LookupConfig) -> Vec<usize> {
    let mut used = Vec::new();
    let len = t.len();
    for n in (cfg.min_ngram..=cfg.max_ngram).rev() {
        if n >= len {
            continue;
        }
        for e in (n..len).rev() {
            if used.len() < cfg.max_matches && t[e - n..e] == t[len - n..] && !used.contains(&e) {
                used.push(e);
            }
        }
    }
    used
}

#[test]
fn matches_equal_a_full_scan() {
    let cfg = LookupConfig {
        min_ngram: 1,
        max_ngram: 5,
        max_matches: 6,
        max_chain: 10_000,
    };
    for (seed, vocab) in [(1u64, 2u64), (2, 3), (3, 5), (4, 1)] {
        let mut state = seed;
        let tokens: Vec<u32> = (0..120)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % vocab) as u32
            })
            .collect();
        let mut d = PromptLookup::new(cfg);
        for end in 1..=tokens.len() {
            d.propose(&ctx(&tokens[..end], 4, 3));
            assert_eq!(
                d.used,
                brute_force(&tokens[..end], cfg),
                "vocab {vocab} at {end}"
            );
        }
    }
}

#[test]
fn a_context_that_does_not_extend_the_index_rebuilds_it() {
    let mut d = PromptLookup::default();
    d.propose(&ctx(&[1, 2, 3, 1, 2], 8, 4));
    let t = d.propose(&ctx(&[5, 6, 7, 5, 6], 8, 4));
    assert_eq!(t.path_tokens(t.len() - 1)[..2], [6, 7]);
    assert_eq!(d.seen, vec![5, 6, 7, 5, 6]);
}

#[test]
fn broken_contexts_do_not_panic() {
    let mut d = PromptLookup::default();
    assert_eq!(d.propose(&ctx(&[], 8, 4)).len(), 1);
    let t = d.propose(&ctx(&[1, 500, 1, 500], 8, 4));
    assert_eq!(t.len(), 1);
    // Context tokens outside the vocabulary never reach the tree.
    let t = d.propose(&ctx(&[1, 500, 2, 1], 8, 4));
    assert_eq!(t.len(), 1);
}

fn feedback_for<'a>(tree: &'a TokenTree, committed: &'a [u32], path: &'a [usize]) -> Feedback<'a> {
    Feedback {
        tree,
        path,
        committed,
        top_k: &[],
    }
}

#[test]
fn observed_acceptance_moves_the_rate() {
    let tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3];
    let mut d = PromptLookup::default();
    let before = d.rates[2].mean();
    for _ in 0..10 {
        let t = d.propose(&ctx(&tokens, 8, 3));
        // The target accepts all three drafts, then adds a bonus token.
        d.observe(&feedback_for(&t, &[4, 5, 6, 9], &[0, 1, 2, 3]));
    }
    let up = d.rates[2].mean();
    assert!(up > before, "{up} <= {before}");
    for _ in 0..30 {
        let t = d.propose(&ctx(&tokens, 8, 3));
        d.observe(&feedback_for(&t, &[9], &[0]));
    }
    assert!(d.rates[2].mean() < before);
    // Unrelated feedback (another root) is ignored.
    let t = d.propose(&ctx(&tokens, 8, 3));
    let other = TokenTree::root_only(7, TreeLimits::new(4, 4, 100)).unwrap();
    let r = d.rates[2].mean();
    d.observe(&feedback_for(&other, &[9], &[0]));
    assert_eq!(d.rates[2].mean(), r);
    drop(t);
}
