//! Fuzzing the tree a drafter sends (nodes and draft distributions) with
//! arbitrary wire values: every input converts or is refused with an
//! error; none panics. `PROPTEST_CASES` raises the count for a longer run.

use proptest::prelude::*;
use specmesh_tree::TreeLimits;

use super::tree_from_wire;
use crate::v1;

/// Floats a peer may send: ordinary, edge and non-finite.
fn any_prob() -> impl Strategy<Value = f32> {
    prop_oneof![
        0.0f32..=1.0,
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(-1.0f32),
        Just(f32::MIN_POSITIVE),
        any::<f32>(),
    ]
}

fn any_tree() -> impl Strategy<Value = v1::TokenTree> {
    let node = (0u32..80, prop_oneof![0u32..300, any::<u32>()], any_prob()).prop_map(
        |(parent, token, score)| v1::TreeNode {
            parent,
            token,
            score,
        },
    );
    let dist = (
        0u32..80,
        prop::collection::vec(prop_oneof![0u32..300, any::<u32>()], 0..12),
        prop::collection::vec(any_prob(), 0..12),
    )
        .prop_map(|(node, tokens, probs)| v1::DraftDist {
            node,
            tokens,
            probs,
        });
    (
        any::<u64>(),
        any::<u64>(),
        prop_oneof![0u32..300, any::<u32>()],
        prop::collection::vec(node, 0..80),
        prop::collection::vec(dist, 0..20),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(
            |(epoch, step, root_token, nodes, dists, span, drafted_ahead)| v1::TokenTree {
                epoch,
                step,
                root_token,
                nodes,
                dists,
                span,
                drafted_ahead,
                ..Default::default()
            },
        )
}

proptest! {
    #[test]
    fn any_wire_tree_converts_or_is_refused(tree in any_tree(), max_nodes in 0usize..64, max_depth in 0usize..16) {
        let limits = TreeLimits::new(max_nodes, max_depth, 256);
        match tree_from_wire(&tree, limits) {
            // What converts keeps the limits it was given.
            Ok(t) => prop_assert!(t.len() <= limits.max_nodes),
            // Refusals say why.
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
