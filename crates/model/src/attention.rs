//! Causal tree attention over a sequence's committed prefix plus the
//! attended tokens of its block, one (token, head) pair per task.
//!
//! Keys are visited in slot order: prefix 0..len, then the token's
//! ancestors in block order. A token committed earlier and the same token
//! staged in a block are therefore visited in the same order, so greedy
//! speculative decoding reproduces plain decoding bit for bit.

use specmesh_kernels::vec;

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
    pub group: usize,
    pub head_dim: usize,
    pub kv_dim: usize,
    /// Row stride of the fused QKV buffer.
    pub qkv_stride: usize,
}

/// Output buffer shared across tasks that each write their own head.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: each (row, head) task writes only its own `head_dim` slice, and the
// pool joins all tasks before the buffer's borrow ends.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Computes attention for tasks `range` (task = row · n_heads + head) of
/// layer `layer`, writing each head's output to `out` (`rows × n_heads·d`).
pub(crate) fn run_tasks(
    items: &[Item<'_>],
    row_item: &[u32],
    layer: usize,
    qkv: &[f32],
    shape: &Shape,
    out: OutPtr,
    range: std::ops::Range<usize>,
) {
    let d = shape.head_dim;
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores: Vec<f32> = Vec::new();
    let mut attended: Vec<usize> = Vec::new();
    let mut acc = vec![0.0f32; d];
    let mut last_row = usize::MAX;
    for task in range {
        let (row, head) = (task / shape.n_heads, task % shape.n_heads);
        let item = &items[row_item[row] as usize];
        let i = row - item.row0;
        if row != last_row {
            item.block.attended(i, &mut attended);
            last_row = row;
        }
        let (kc, vc) = item.seq.layer(layer);
        let len = item.seq.len();
        let g = head / shape.group;
        let q = &qkv[row * shape.qkv_stride + head * d..][..d];
        let slots = (0..len).chain(attended.iter().map(|a| len + a));
        scores.clear();
        for s in slots.clone() {
            let k = &kc[s * shape.kv_dim + g * d..][..d];
            scores.push(vec::dot(q, k) * scale);
        }
        vec::softmax(&mut scores);
        acc.fill(0.0);
        for (s, p) in slots.zip(&scores) {
            vec::axpy(*p, &vc[s * shape.kv_dim + g * d..][..d], &mut acc);
        }
        // SAFETY: see `OutPtr`; (row, head) is unique to this task.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out.0.add(row * shape.n_heads * d + head * d), d)
        };
        dst.copy_from_slice(&acc);
    }
}
