//! A head that scores only some tokens (`LoadOptions::head_tokens`, the
//! FR-Spec draft head): each column is bit-for-bit the full head's logit
//! of its token, argmax and top-k answer in token ids, and bad subsets are
//! refused at load with a message that says what to fix.

mod common;

use common::{bits, catalog_path, model, model_path, qwen};
use specmesh_model::{Block, LoadOptions, Model, ModelError};

/// Every third token, then a few high ids in descending order: columns
/// neither contiguous nor sorted.
fn subset(vocab: u32) -> Vec<u32> {
    let mut t: Vec<u32> = (0..vocab - 100).step_by(3).collect();
    t.extend([vocab - 1, vocab - 50, vocab - 98]);
    t
}

fn check(full: &Model, path: &std::path::Path) {
    let vocab = full.config().vocab_size as u32;
    let keep = subset(vocab);
    let opts = LoadOptions {
        head_tokens: Some(&keep),
        ..LoadOptions::default()
    };
    let small = Model::load(path, &opts).unwrap();
    assert_eq!(small.head_tokens(), Some(&keep[..]));
    let block = Block::chain(vec![1, 504, 3458, 28, 314, 2177], 0).unwrap();
    let a = full.forward(&mut full.new_sequence(), &block).unwrap();
    let b = small.forward(&mut small.new_sequence(), &block).unwrap();
    assert_eq!(b.vocab(), keep.len());
    assert_eq!(a.rows(), b.rows());
    for r in 0..a.rows() {
        let want: Vec<f32> = keep.iter().map(|&t| a.row(r)[t as usize]).collect();
        assert_eq!(bits(b.row(r)), bits(&want), "row {r}");
        let best = keep
            .iter()
            .copied()
            .max_by(|&x, &y| a.row(r)[x as usize].total_cmp(&a.row(r)[y as usize]))
            .unwrap();
        assert_eq!(b.argmax(r), best);
        assert!(keep.contains(&b.top_k(r, 5)[0].token));
    }
    assert!(
        small.streamed_weight_bytes() < full.streamed_weight_bytes(),
        "the smaller head streams fewer bytes"
    );
}

#[test]
fn a_subset_head_scores_its_tokens_exactly_as_the_full_head() {
    check(model(), &model_path());
}

#[test]
fn a_qwen2_subset_head_scores_its_tokens_exactly_as_the_full_head() {
    check(qwen(), &catalog_path("qwen2.5-coder-0.5b"));
}

#[test]
fn bad_subsets_are_refused_at_load() {
    let vocab = model().config().vocab_size as u32;
    for (keep, says) in [
        (vec![], "at least one token"),
        (vec![1, 2, 1], "token 1 twice"),
        (vec![5, vocab], "outside the vocabulary"),
    ] {
        let opts = LoadOptions {
            head_tokens: Some(&keep),
            ..LoadOptions::default()
        };
        match Model::load(&model_path(), &opts) {
            Err(ModelError::InvalidOption(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("{keep:?}: {other:?}"),
        }
    }
}
