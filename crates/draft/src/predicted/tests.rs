use super::*;
use specmesh_tree::TreeLimits;

fn ctx(tokens: &[u32], prompt_len: usize) -> DraftContext<'_> {
    DraftContext {
        tokens,
        prompt_len,
        limits: TreeLimits::new(17, 16, 100),
    }
}

/// The single chain's tokens, without the root.
fn chain(t: &TokenTree) -> Vec<u32> {
    t.tokens()[1..].to_vec()
}

fn drafter(prediction: &[u32], prompt_len: usize) -> Predicted {
    Predicted::new(prediction.to_vec(), prompt_len, PredictedConfig::default())
}

#[test]
fn the_first_tree_is_the_prediction_and_following_it_moves_on() {
    let prompt = [1, 2, 3];
    let mut d = drafter(&[10, 11, 12, 13, 14], 3);
    let t = d.propose(&ctx(&prompt, 3));
    assert_eq!(t.root_token(), 3);
    assert_eq!(chain(&t), [10, 11, 12, 13, 14]);
    assert!((t.score(1) - 0.6).abs() < 1e-6 && t.score(2) < t.score(1));
    // Two tokens committed as predicted: the rest follows.
    assert_eq!(chain(&d.propose(&ctx(&[1, 2, 3, 10, 11], 3))), [12, 13, 14]);
    // The whole prediction used: nothing left to offer.
    assert_eq!(d.propose(&ctx(&[1, 2, 3, 10, 11, 12, 13, 14], 3)).len(), 1);
}

#[test]
fn after_an_insertion_it_comes_back_where_the_output_rejoins() {
    let mut d = drafter(&[20, 21, 22, 23, 24, 25, 26, 27], 1);
    assert_eq!(
        chain(&d.propose(&ctx(&[0, 20, 21], 1))),
        [22, 23, 24, 25, 26, 27]
    );
    // An inserted token: no run of the output's tail is in the prediction.
    assert_eq!(d.propose(&ctx(&[0, 20, 21, 99], 1)).len(), 1);
    assert_eq!(d.propose(&ctx(&[0, 20, 21, 99, 22], 1)).len(), 1);
    // Two tokens of the prediction again: re-synchronised after them.
    assert_eq!(
        chain(&d.propose(&ctx(&[0, 20, 21, 99, 22, 23], 1))),
        [24, 25, 26, 27]
    );
}

#[test]
fn after_a_deletion_it_skips_ahead() {
    let mut d = drafter(&[20, 21, 22, 23, 24, 25, 26, 27], 1);
    d.propose(&ctx(&[0, 20, 21], 1));
    // 22..24 deleted: the output goes on with 25 26.
    assert_eq!(chain(&d.propose(&ctx(&[0, 20, 21, 25, 26], 1))), [27]);
}

#[test]
fn of_repeated_text_the_occurrence_after_the_cursor_wins() {
    // "5 6" occurs three times; the output has passed the first.
    let p = [5, 6, 7, 8, 5, 6, 9, 9, 5, 6, 1];
    let mut d = drafter(&p, 1);
    assert_eq!(
        chain(&d.propose(&ctx(&[0, 5, 6, 7, 8], 1))),
        [5, 6, 9, 9, 5, 6, 1]
    );
    // Diverged (4 instead of 5), then "5 6" again: the next occurrence.
    assert_eq!(d.propose(&ctx(&[0, 5, 6, 7, 8, 4], 1)).len(), 1);
    assert_eq!(
        chain(&d.propose(&ctx(&[0, 5, 6, 7, 8, 4, 5, 6], 1))),
        [9, 9, 5, 6, 1]
    );
}

#[test]
fn the_budget_and_the_vocabulary_cut_the_chain() {
    let mut d = drafter(&[10, 11, 12, 13, 500, 14], 1);
    let limits = TreeLimits::new(3, 16, 100);
    let t = d.propose(&DraftContext {
        tokens: &[0],
        prompt_len: 1,
        limits,
    });
    assert_eq!(chain(&t), [10, 11]);
    let t = d.propose(&ctx(&[0], 1));
    assert_eq!(chain(&t), [10, 11, 12, 13], "500 is outside the vocabulary");
}

#[test]
fn rejections_lower_the_scores_and_acceptances_raise_them() {
    let prediction: Vec<u32> = (10..40).collect();
    let observe = |d: &mut Predicted, committed: &[u32]| {
        let tree = d.propose(&ctx(&[0], 1));
        d.observe(&Feedback {
            tree: &tree,
            path: &[0],
            committed,
            top_k: &[],
        });
        // Back to the start of the prediction for the next round.
        d.cursor = Some((0, 1));
    };
    let mut rejected = drafter(&prediction, 1);
    for _ in 0..5 {
        observe(&mut rejected, &[99]);
    }
    assert!(rejected.rate.mean() < 0.5, "{}", rejected.rate.mean());
    let t = rejected.propose(&ctx(&[0], 1));
    assert!(t.score(1) < 0.5);
    let mut accepted = drafter(&prediction, 1);
    for _ in 0..5 {
        observe(&mut accepted, &prediction[..17]);
    }
    assert!(accepted.rate.mean() > 0.9, "{}", accepted.rate.mean());
    assert!(drafter(&[], 1).is_empty());
}
