//! Tree forward, commit/rollback and batch invariance on the real models:
//! SmolLM2-135M (llama, Q4_1) and Qwen2.5-Coder-0.5B (qwen2: biases, NeoX
//! RoPE, Q5_0 / Q8_0 / Q4_K / Q6_K kernels). Every comparison is bit-exact:
//! the runtime promises identical logits, with the KV cache in f32 and in
//! f16, and at contexts whose attention spans several key ranges.

mod common;

use common::{bits, model, qwen};
use rand::{Rng, SeedableRng, rngs::StdRng};
use specmesh_model::{Block, KvDtype, Model, ModelError, Sequence};

/// A prompt-like prefix of ordinary tokens.
fn prefix(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(100..20_000)).collect()
}

fn prefilled(m: &Model, tokens: &[u32]) -> Sequence {
    let mut seq = m.new_sequence();
    m.forward(
        &mut seq,
        &Block::chain(tokens.to_vec(), 0).unwrap().last_logits_only(),
    )
    .unwrap();
    seq.commit(&(0..tokens.len()).collect::<Vec<_>>()).unwrap();
    seq
}

/// A random tree with at most `max_nodes` nodes and depth at most `max_depth`.
fn random_tree(
    rng: &mut StdRng,
    max_nodes: usize,
    max_depth: usize,
) -> (Vec<u32>, Vec<Option<usize>>) {
    let n = rng.random_range(1..=max_nodes);
    let (mut tokens, mut parents, mut depth) = (Vec::new(), Vec::new(), Vec::<usize>::new());
    for i in 0..n {
        let candidates: Vec<usize> = (0..i).filter(|&p| depth[p] + 1 < max_depth).collect();
        let parent = if i == 0 || candidates.is_empty() || rng.random_bool(0.15) {
            None
        } else {
            Some(candidates[rng.random_range(0..candidates.len())])
        };
        depth.push(parent.map_or(0, |p| depth[p] + 1));
        parents.push(parent);
        tokens.push(rng.random_range(100..20_000));
    }
    (tokens, parents)
}

fn path_to(parents: &[Option<usize>], node: usize) -> Vec<usize> {
    let mut path = vec![node];
    while let Some(p) = parents[*path.last().unwrap()] {
        path.push(p);
    }
    path.reverse();
    path
}

/// The same property test on both models, with each KV cache type.
macro_rules! on_both_models {
    ($check:ident, $smollm:ident, $qwen:ident) => {
        #[test]
        fn $smollm() {
            for_each_kv_dtype(model(), $check);
        }
        #[test]
        fn $qwen() {
            for_each_kv_dtype(qwen(), $check);
        }
    };
}

fn for_each_kv_dtype(m: &Model, check: fn(&Model)) {
    for dtype in KvDtype::ALL {
        eprintln!("{dtype} KV");
        check(&m.with_kv_dtype(dtype));
    }
}

/// Trees whose ancestors straddle the first and the second boundary of
/// attention's key ranges (512 keys), and a batch mixing contexts on both
/// sides of them, on SmolLM2.
#[test]
fn trees_and_batches_are_exact_across_attention_key_ranges() {
    for_each_kv_dtype(model(), |m| {
        tree_matches_paths_at(m, 505, 11);
        tree_matches_paths_at(m, 1020, 12);
        let mut rng = StdRng::seed_from_u64(5);
        let lens = [509usize, 30, 1030, 700];
        let bases: Vec<Sequence> = lens
            .iter()
            .map(|&n| prefilled(m, &prefix(&mut rng, n)))
            .collect();
        let blocks: Vec<Block> = lens
            .iter()
            .map(|&n| {
                let (t, par) = random_tree(&mut rng, 24, 10);
                Block::tree(t, par, n).unwrap()
            })
            .collect();
        same_alone_and_batched(m, &bases, &blocks);
    });
}

/// A prompt prefilled in one block and in chunks leaves the same cache
/// (what a prefix cache shares between sessions that prefilled it
/// differently) and the same next logits.
#[test]
fn a_prompt_prefilled_in_chunks_leaves_the_cache_of_one_block() {
    for_each_kv_dtype(model(), |m| {
        let mut rng = StdRng::seed_from_u64(8);
        let prompt = prefix(&mut rng, 1100);
        let whole = prefilled(m, &prompt);
        let mut chunked = m.new_sequence();
        for (i, c) in prompt.chunks(96).enumerate() {
            m.forward(&mut chunked, &Block::chain(c.to_vec(), i * 96).unwrap())
                .unwrap();
            chunked.commit(&(0..c.len()).collect::<Vec<_>>()).unwrap();
        }
        assert_eq!(
            whole.export(0, prompt.len()).unwrap(),
            chunked.export(0, prompt.len()).unwrap()
        );
        let next = Block::chain(vec![42, 4242], prompt.len()).unwrap();
        let a = m.forward(&mut whole.clone(), &next).unwrap();
        let b = m.forward(&mut chunked, &next).unwrap();
        assert_eq!(bits(a.as_slice()), bits(b.as_slice()));
    });
}

on_both_models!(
    tree_matches_paths,
    tree_logits_equal_those_of_each_root_to_node_path_run_as_a_chain,
    qwen_tree_logits_equal_those_of_each_root_to_node_path_run_as_a_chain
);
on_both_models!(
    commit_matches_path,
    after_commit_the_cache_equals_one_built_from_the_path_alone,
    qwen_after_commit_the_cache_equals_one_built_from_the_path_alone
);
on_both_models!(
    batch_matches_alone,
    a_sequence_gets_identical_logits_alone_and_in_a_batch_of_four,
    qwen_a_sequence_gets_identical_logits_alone_and_in_a_batch_of_four
);
on_both_models!(
    truncate_rolls_back,
    truncate_rolls_back_to_an_earlier_state,
    qwen_truncate_rolls_back_to_an_earlier_state
);

fn tree_matches_paths(m: &Model) {
    tree_matches_paths_at(m, 37, 42);
}

fn tree_matches_paths_at(m: &Model, prefix_len: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let pre = prefix(&mut rng, prefix_len);
    let base = prefilled(m, &pre);
    for _ in 0..4 {
        let (tokens, parents) = random_tree(&mut rng, 64, 8);
        let mut seq = base.clone();
        let tree = Block::tree(tokens.clone(), parents.clone(), pre.len()).unwrap();
        let tree_logits = m.forward(&mut seq, &tree).unwrap();
        let leaves: Vec<usize> = (0..tokens.len())
            .filter(|&i| !parents.contains(&Some(i)))
            .collect();
        for leaf in leaves {
            let path = path_to(&parents, leaf);
            let mut chain_seq = base.clone();
            let chain = Block::chain(path.iter().map(|&i| tokens[i]).collect(), pre.len()).unwrap();
            let chain_logits = m.forward(&mut chain_seq, &chain).unwrap();
            for (j, &node) in path.iter().enumerate() {
                assert_eq!(
                    bits(tree_logits.row(node)),
                    bits(chain_logits.row(j)),
                    "node {node} (depth {j}) of a {}-node tree",
                    tokens.len()
                );
            }
        }
    }
}

fn commit_matches_path(m: &Model) {
    let mut rng = StdRng::seed_from_u64(7);
    let pre = prefix(&mut rng, 21);
    let base = prefilled(m, &pre);
    for _ in 0..3 {
        let (tokens, parents) = random_tree(&mut rng, 40, 8);
        let node = rng.random_range(0..tokens.len());
        let path = path_to(&parents, node);
        let next = Block::chain(
            vec![rng.random_range(100..20_000), 17],
            pre.len() + path.len(),
        )
        .unwrap();

        let mut spec = base.clone();
        m.forward(
            &mut spec,
            &Block::tree(tokens.clone(), parents.clone(), pre.len()).unwrap(),
        )
        .unwrap();
        spec.commit(&path).unwrap();
        assert_eq!(spec.len(), pre.len() + path.len());
        let after_tree = m.forward(&mut spec, &next).unwrap();

        let mut plain = base.clone();
        let path_tokens: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
        m.forward(&mut plain, &Block::chain(path_tokens, pre.len()).unwrap())
            .unwrap();
        plain.commit(&(0..path.len()).collect::<Vec<_>>()).unwrap();
        let after_plain = m.forward(&mut plain, &next).unwrap();

        assert_eq!(bits(after_tree.as_slice()), bits(after_plain.as_slice()));
    }
}

fn batch_matches_alone(m: &Model) {
    let mut rng = StdRng::seed_from_u64(3);
    let prefixes: Vec<Vec<u32>> = [5usize, 48, 17, 90]
        .iter()
        .map(|&n| prefix(&mut rng, n))
        .collect();
    let bases: Vec<Sequence> = prefixes.iter().map(|p| prefilled(m, p)).collect();
    let blocks: Vec<Block> = prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if i % 2 == 0 {
                let (t, par) = random_tree(&mut rng, 24, 6);
                Block::tree(t, par, p.len()).unwrap()
            } else {
                Block::chain(prefix(&mut rng, 1 + 3 * i), p.len()).unwrap()
            }
        })
        .collect();
    same_alone_and_batched(m, &bases, &blocks);
}

/// Each of `blocks` on a copy of its base gives the bits it gives when
/// all run in one batch.
fn same_alone_and_batched(m: &Model, bases: &[Sequence], blocks: &[Block]) {
    let alone: Vec<_> = bases
        .iter()
        .zip(blocks)
        .map(|(b, blk)| m.forward(&mut b.clone(), blk).unwrap())
        .collect();
    let mut seqs: Vec<Sequence> = bases.to_vec();
    let mut batch: Vec<(&mut Sequence, &Block)> = seqs.iter_mut().zip(blocks).collect();
    let together = m.forward_batch(&mut batch).unwrap();
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(bits(a.as_slice()), bits(t.as_slice()), "sequence {i}");
    }
}

fn truncate_rolls_back(m: &Model) {
    let mut rng = StdRng::seed_from_u64(9);
    let pre = prefix(&mut rng, 30);
    let mut seq = prefilled(m, &pre[..20]);
    let probe = Block::chain(vec![pre[20]], 20).unwrap();
    let before = m.forward(&mut seq.clone(), &probe).unwrap();
    m.forward(&mut seq, &Block::chain(pre[20..].to_vec(), 20).unwrap())
        .unwrap();
    seq.commit(&(0..10).collect::<Vec<_>>()).unwrap();
    seq.truncate(20);
    assert_eq!(seq.len(), 20);
    let after = m.forward(&mut seq, &probe).unwrap();
    assert_eq!(bits(before.as_slice()), bits(after.as_slice()));
}

#[test]
fn misuse_is_reported_not_panicked() {
    let m = model();
    let mut seq = m.new_sequence();
    let vocab = m.config().vocab_size as u32;
    assert!(matches!(
        m.forward(&mut seq, &Block::chain(vec![vocab], 0).unwrap()),
        Err(ModelError::TokenOutOfRange { .. })
    ));
    m.forward(
        &mut seq,
        &Block::tree(vec![1, 2, 3], vec![None, Some(0), Some(0)], 0).unwrap(),
    )
    .unwrap();
    assert!(matches!(
        m.forward(&mut seq, &Block::chain(vec![1], 0).unwrap()),
        Err(ModelError::Uncommitted { staged: 3 })
    ));
    // 0 → 2 is a path, 1 → 2 is not (2's parent is 0).
    assert!(matches!(
        seq.commit(&[1, 2]),
        Err(ModelError::InvalidCommit(_))
    ));
    assert!(matches!(
        seq.commit(&[0, 7]),
        Err(ModelError::InvalidCommit(_))
    ));
    seq.commit(&[0, 2]).unwrap();
    assert_eq!(seq.len(), 2);
    let max = m.config().max_context;
    assert!(matches!(
        m.forward(&mut seq, &Block::chain(vec![1; max], 2).unwrap()),
        Err(ModelError::ContextOverflow { .. })
    ));
    let view = m.truncated(4).unwrap();
    assert!(matches!(
        view.forward(&mut seq, &Block::chain(vec![1], 2).unwrap()),
        Err(ModelError::LayerMismatch { seq: 30, model: 4 })
    ));
    assert!(m.truncated(0).is_err() && m.truncated(31).is_err());
    // Importing KV: nothing is a no-op, a partial token is refused.
    seq.import(&[]).unwrap();
    assert_eq!(seq.len(), 2);
    assert!(matches!(
        seq.import(&[0u8; 3]),
        Err(ModelError::InvalidCommit(_))
    ));
}

#[test]
fn a_layer_truncated_view_shares_weights_and_runs_fewer_layers() {
    let m = model();
    let view = m.truncated(6).unwrap();
    assert_eq!(view.n_layers(), 6);
    assert!(view.streamed_weight_bytes() < m.streamed_weight_bytes() / 2);
    let block = Block::chain(vec![504, 3458, 282], 0).unwrap();
    let full = m.forward(&mut m.new_sequence(), &block).unwrap();
    let draft = view.forward(&mut view.new_sequence(), &block).unwrap();
    assert_eq!(draft.rows(), 3);
    assert_ne!(bits(full.as_slice()), bits(draft.as_slice()));
}
