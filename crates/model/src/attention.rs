//! Causal tree attention over a sequence's committed prefix plus the
//! attended tokens of its block. One task is one (token, KV head):  query heads
//! sharing a KV head (grouped-query attention) read the same rows.
//!
//! Keys are visited in slot order: prefix 0..len, then the token's
//! ancestors in block order. A token committed earlier and the same token
//! staged in a block are therefore visited in the same order, so greedy
//! speculative decoding reproduces plain decoding bit for bit.
//!
//! One task is one (token, query head): with one token and 9 heads that
//! still splits evenly across cores, where (token, KV head) tasks would not.

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
    let group = shape.n_heads / shape.n_kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let mut slots: Vec<usize> = Vec::new();
    let mut attended: Vec<usize> = Vec::new();
    let mut scores: Vec<f32> = Vec::new();
    let mut acc = vec![0.0f32; d];
    let mut last_row = usize::MAX;
    for task in range {
        let (row, head) = (task / shape.n_heads, task % shape.n_heads);
        let item = &items[row_item[row] as usize];
        if row != last_row {
            let len = item.seq.len();
            item.block.attended(row - item.row0, &mut attended);
            slots.clear();
            slots.extend(0..len);
            slots.extend(attended.iter().map(|a| len + a));
            last_row = row;
        }
        let (kc, vc) = item.seq.layer(layer);
        let koff = (head / group) * d;
        let q = &qkv[row * shape.qkv_stride + head * d..][..d];

        scores.clear();
        scores.extend(
            slots
                .iter()
                .map(|&s| vec::dot(q, &kc[s * shape.kv_dim + koff..][..d]) * scale),
        );
        vec::softmax(&mut scores);
        acc.fill(0.0);
        for (&s, &p) in slots.iter().zip(&scores) {
            vec::axpy(p, &vc[s * shape.kv_dim + koff..][..d], &mut acc);
        }
        // SAFETY: see `OutPtr`; head `head` of `row` belongs to this task.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out.0.add((row * shape.n_heads + head) * d), d)
        };
        dst.copy_from_slice(&acc);
    }
}
