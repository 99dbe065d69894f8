//! `LoadOptions::isa` (the CLI's `--isa`) reaches attention as well as the
//! matmuls: a model loaded with `Isa::Scalar` runs the portable attention
//! kernel, and its logits still match those of the default ISA.

mod common;

use std::sync::OnceLock;

use common::{bits, model_path};
use specmesh_model::{AttnKernel, Block, Isa, KvDtype, LoadOptions, Model};

/// SmolLM2 with dequantized (f32) weights and f32 activations on `isa`. The
/// f32 matmuls are the same dot products on every ISA, so two such models
/// differ only in their attention kernel. The KV cache is f32 too: f16
/// rounding would turn the kernels' last-bit differences into whole f16
/// steps of a key here and there, which says nothing about the kernels.
fn dequantized(isa: Option<Isa>) -> Model {
    let opts = LoadOptions {
        isa,
        dequantize: true,
        kv_dtype: KvDtype::F32,
        ..LoadOptions::default()
    };
    Model::load(&model_path(), &opts).expect("loading the test model")
}

fn scalar() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| dequantized(Some(Isa::Scalar)))
}

fn detected() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| dequantized(None))
}

/// 40 tokens spread over the vocabulary.
fn tokens() -> Vec<u32> {
    (0..40u32).map(|i| (i * 7919 + 17) % 49_152).collect()
}

#[test]
fn the_scalar_isa_runs_portable_attention_and_matches_the_default_isa() {
    let (s, d) = (scalar(), detected());
    assert_eq!(s.isa(), Isa::Scalar);
    assert_eq!(s.attention_kernel(), AttnKernel::Portable);
    let head_dim = d.config().head_dim;
    assert_eq!(
        d.attention_kernel(),
        AttnKernel::select(Isa::detect(), head_dim)
    );
    // A truncated view keeps its model's ISA, attention included.
    assert_eq!(
        s.truncated(3).unwrap().attention_kernel(),
        AttnKernel::Portable
    );
    if d.attention_kernel() == AttnKernel::Portable {
        eprintln!(
            "skipped: the detected ISA {} runs portable attention too; nothing to compare",
            d.isa()
        );
    }

    let block = Block::chain(tokens(), 0).unwrap();
    let a = s.forward(&mut s.new_sequence(), &block).unwrap();
    let b = d.forward(&mut d.new_sequence(), &block).unwrap();
    let (mut worst, mut scale) = (0.0f32, 0.0f32);
    for (x, y) in a.as_slice().iter().zip(b.as_slice()) {
        worst = worst.max((x - y).abs());
        scale = scale.max(y.abs());
    }
    eprintln!(
        "portable vs {} attention over 30 layers: max |Δlogit| = {worst:e} (logits up to {scale})",
        d.attention_kernel()
    );
    // The kernels differ only in the summation order of the scores' dot
    // products (value sums are bit-identical), so the logits stay within
    // the 1e-3 the kernel tests allow a single score (measured here:
    // ~3e-5 over 30 layers, on logits up to ~35).
    assert!(worst < 1e-3, "max |Δlogit| {worst}");
    for pos in 0..a.rows() {
        let (ra, rb) = (a.row(pos), b.row(pos));
        let top = b.argmax(pos) as usize;
        let runner_up = rb
            .iter()
            .enumerate()
            .filter(|&(t, _)| t != top)
            .map(|(_, v)| *v)
            .fold(f32::NEG_INFINITY, f32::max);
        if rb[top] - runner_up > 2.0 * worst {
            assert_eq!(a.argmax(pos) as usize, top, "position {pos}");
        }
        assert!(ra.iter().all(|v| v.is_finite()));
    }
    if d.attention_kernel() != AttnKernel::Portable {
        // Proof that the kernel really changed with the ISA: the score sums
        // round differently somewhere in 30 layers × 40 tokens.
        assert_ne!(bits(a.as_slice()), bits(b.as_slice()));
    }
}

#[test]
fn portable_attention_keeps_tree_logits_equal_to_their_paths() {
    // Batch invariance holds on the portable kernel too: each node of a
    // tree gets the bits of its root-to-node path run as a chain.
    let m = scalar();
    let pre = tokens();
    let mut base = m.new_sequence();
    m.forward(
        &mut base,
        &Block::chain(pre.clone(), 0).unwrap().last_logits_only(),
    )
    .unwrap();
    base.commit(&(0..pre.len()).collect::<Vec<_>>()).unwrap();
    let tokens = vec![504, 3458, 282, 1030, 77, 9001, 12];
    let parents = vec![None, Some(0), Some(0), Some(1), Some(2), Some(4), Some(3)];
    let tree = Block::tree(tokens.clone(), parents.clone(), pre.len()).unwrap();
    let tree_logits = m.forward(&mut base.clone(), &tree).unwrap();
    for leaf in [5usize, 6] {
        let mut path = vec![leaf];
        while let Some(p) = parents[*path.last().unwrap()] {
            path.push(p);
        }
        path.reverse();
        let chain = Block::chain(path.iter().map(|&i| tokens[i]).collect(), pre.len()).unwrap();
        let chain_logits = m.forward(&mut base.clone(), &chain).unwrap();
        for (j, &node) in path.iter().enumerate() {
            assert_eq!(
                bits(tree_logits.row(node)),
                bits(chain_logits.row(j)),
                "node {node} (depth {j})"
            );
        }
    }
}
