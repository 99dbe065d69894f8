//! Causal tree attention over a sequence's committed prefix plus the
//! attended tokens of its block.
//!
//! One task is one (batch item, query head); its tokens run one after the
//! other, so the prefix K/V rows they share are hot in L2 for all but the
//! first. The query and its accumulator stay in registers
//! (`specmesh_kernels::attn`). (Tasks per KV head would share rows across a
//! query group too, but 3 KV heads split badly over 2 cores at 1 token.)
//!
//! Keys are visited in slot order for every (token, head): prefix 0..len,
//! then the token's ancestors in block order. A token committed earlier and
//! the same token staged in a block are visited in the same order with the
//! same operations, so a token's output does not depend on the other tokens
//! of its block or batch, and greedy speculative decoding reproduces plain
//! decoding bit for bit.

use specmesh_kernels::{attn, vec};

use crate::block::Block;
use crate::sequence::Sequence;

/// What one layer's attention needs to know about one batch item.
pub(crate) struct Item<'a> {
    pub seq: &'a Sequence,
    pub block: &'a Block,
    /// First row of this item in the batch.
    pub row0: usize,
}

pub(crate) struct Shape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub kv_dim: usize,
    /// Row stride of the fused QKV buffer.
    pub qkv_stride: usize,
}

/// Output buffer shared across tasks that each write their own heads.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: each (row, KV head) task writes only its own heads' slices, and
// the pool joins all tasks before the buffer's borrow ends.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Computes attention for tasks `range` (task = item · n_heads + head) of
/// layer `layer`, writing each head's output to `out` (`rows × n_heads·d`).
pub(crate) fn run_tasks(
    items: &[Item<'_>],
    layer: usize,
    qkv: &[f32],
    shape: &Shape,
    out: OutPtr,
    range: std::ops::Range<usize>,
) {
    let d = shape.head_dim;
    let scale = 1.0 / (d as f32).sqrt();
    let mut attended: Vec<usize> = Vec::new();
    let mut slots: Vec<usize> = Vec::new();
    let mut scores: Vec<f32> = Vec::new();
    for task in range {
        let (it, head) = (task / shape.n_heads, task % shape.n_heads);
        let item = &items[it];
        let len = item.seq.len();
        let (kc, vc) = item.seq.layer(layer);
        // Slot s of KV head g starts at s · kv_dim + g · d.
        let g = head * shape.n_kv_heads / shape.n_heads;
        let (kc, vc) = (&kc[g * d..], &vc[g * d..]);
        for r in 0..item.block.len() {
            item.block.attended(r, &mut attended);
            slots.clear();
            slots.extend(0..len);
            slots.extend(attended.iter().map(|a| len + a));
            let row = item.row0 + r;
            let q = &qkv[row * shape.qkv_stride + head * d..][..d];
            attn::qk_scores(q, kc, shape.kv_dim, &slots, scale, &mut scores);
            vec::softmax(&mut scores);
            // SAFETY: see `OutPtr`; (row, head) belongs to this task alone.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.0.add((row * shape.n_heads + head) * d), d)
            };
            attn::pv_sum(&scores, vc, shape.kv_dim, &slots, dst);
        }
    }
}
