//! Causal tree attention over a sequence's committed prefix plus the
//! attended tokens of its block. One task is one (token, KV head): the query
//! heads that share the KV head (grouped-query attention) read each key and
//! value row once.
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

/// Computes attention for tasks `range` (task = row · n_kv_heads + g) of
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
    let mut acc = vec![0.0f32; group * d];
    let mut last_row = usize::MAX;
    for task in range {
        let (row, g) = (task / shape.n_kv_heads, task % shape.n_kv_heads);
        let item = &items[row_item[row] as usize];
        if row != last_row {
            let len = item.seq.len();
            item.block.attended(row - item.row0, &mut attended);
            slots.clear();
            slots.extend(0..len);
            slots.extend(attended.iter().map(|a| len + a));
            last_row = row;
        }
        let n = slots.len();
        let (kc, vc) = item.seq.layer(layer);
        let q0 = row * shape.qkv_stride + g * group * d;
        let q = &qkv[q0..q0 + group * d];

        scores.clear();
        scores.resize(group * n, 0.0);
        for (i, &s) in slots.iter().enumerate() {
            let k = &kc[s * shape.kv_dim + g * d..][..d];
            for h in 0..group {
                scores[h * n + i] = vec::dot(&q[h * d..(h + 1) * d], k) * scale;
            }
        }
        for h in 0..group {
            vec::softmax(&mut scores[h * n..(h + 1) * n]);
        }
        acc.fill(0.0);
        for (i, &s) in slots.iter().enumerate() {
            let v = &vc[s * shape.kv_dim + g * d..][..d];
            for h in 0..group {
                vec::axpy(scores[h * n + i], v, &mut acc[h * d..(h + 1) * d]);
            }
        }
        // SAFETY: see `OutPtr`; heads g·group..(g+1)·group of `row` belong
        // to this task alone.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                out.0.add(row * shape.n_heads * d + g * group * d),
                group * d,
            )
        };
        dst.copy_from_slice(&acc);
    }
}
