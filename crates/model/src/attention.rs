//! Causal tree attention over a sequence's committed prefix plus the
//! attended tokens of its block.
//!
//! A task is a part of the queries (query head × block token) that read one
//! KV head of one batch item. They all attend to the same committed prefix,
//! so the prefix is walked in chunks that fit L1 (64 slots of K, then of
//! V), each chunk serving every query of the task before the next is
//! loaded: the query heads of a group and the tokens of a tree read the
//! prefix once, not once each.
//!
//! Keys are visited in slot order for every (token, head): prefix 0..len,
//! then the token's ancestors in block order. A token committed earlier and
//! the same token staged in a block are visited in the same order with the
//! same operations, so a token's output does not depend on the other tokens
//! of its block or batch, and greedy speculative decoding reproduces plain
//! decoding bit for bit.
//!
//! The score and value loops run on the kernel of the model's ISA
//! ([`attn::AttnKernel::select`]), like its matmuls: `Isa::Scalar` gives
//! portable attention too.

use specmesh_kernels::attn::{self, AttnKernel};
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
    /// The attention kernel, picked once from the model's kernel ISA.
    pub kernel: AttnKernel,
}

/// Output buffer shared across tasks that each write their own heads.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: each (row, KV head) task writes only its own heads' slices, and
// the pool joins all tasks before the buffer's borrow ends.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Attention tasks for a batch: each is a part of the queries (query head
/// × block token) that read one KV head of one item. Queries of one KV head
/// share every prefix chunk they load; the parts keep both cores busy when
/// there are few KV heads (3 for SmolLM2).
pub(crate) fn task_count(items: &[Item<'_>], shape: &Shape, threads: usize) -> usize {
    items.len() * shape.n_kv_heads * parts(items, shape, threads)
}

fn parts(items: &[Item<'_>], shape: &Shape, threads: usize) -> usize {
    let groups = items.len() * shape.n_kv_heads;
    (2 * threads).div_ceil(groups.max(1)).max(1)
}

/// Computes attention for tasks `range` (see [`task_count`]) of layer
/// `layer`, writing each head's output to `out` (`rows × n_heads·d`).
// Queries index several parallel buffers (scores, tails, rows).
#[allow(clippy::needless_range_loop)]
pub(crate) fn run_tasks(
    items: &[Item<'_>],
    layer: usize,
    qkv: &[f32],
    shape: &Shape,
    threads: usize,
    out: OutPtr,
    range: std::ops::Range<usize>,
) {
    let (d, kernel) = (shape.head_dim, shape.kernel);
    let scale = 1.0 / (d as f32).sqrt();
    let per_group = shape.n_heads / shape.n_kv_heads;
    let parts = parts(items, shape, threads);
    let mut attended: Vec<usize> = Vec::new();
    // Slots 0..len of the longest prefix; each task uses its first len.
    let longest = items.iter().map(|it| it.seq.len()).max().unwrap_or(0);
    let prefix: Vec<usize> = (0..longest).collect();
    let mut tails: Vec<Vec<usize>> = Vec::new();
    let mut scores: Vec<Vec<f32>> = Vec::new();
    for task in range {
        let (it, g, part) = (
            task / (shape.n_kv_heads * parts),
            task / parts % shape.n_kv_heads,
            task % parts,
        );
        let item = &items[it];
        let (len, n) = (item.seq.len(), item.block.len());
        // Query q is (head g · per_group + q / n, token q % n).
        let nq = per_group * n;
        let queries = nq * part / parts..nq * (part + 1) / parts;
        if queries.is_empty() {
            continue;
        }
        let (kc, vc) = item.seq.layer(layer);
        // Slot s of KV head g starts at s · kv_dim + g · d.
        let (kc, vc) = (&kc[g * d..], &vc[g * d..]);
        if tails.len() < n {
            tails.resize_with(n, Vec::new);
        }
        if scores.len() < nq {
            scores.resize_with(nq, Vec::new);
        }
        for r in 0..n {
            item.block.attended(r, &mut attended);
            tails[r].clear();
            tails[r].extend(attended.iter().map(|a| len + a));
        }
        let head = |q: usize| g * per_group + q / n;
        let query = |q: usize| &qkv[(item.row0 + q % n) * shape.qkv_stride + head(q) * d..][..d];
        // SAFETY: see `OutPtr`; (row, head) belongs to this task alone.
        let dst = |q: usize| unsafe {
            std::slice::from_raw_parts_mut(
                out.0
                    .add(((item.row0 + q % n) * shape.n_heads + head(q)) * d),
                d,
            )
        };
        for q in queries.clone() {
            scores[q].resize(len + tails[q % n].len(), 0.0);
        }

        let chunk = prefix_chunk(d);
        for c0 in (0..len).step_by(chunk) {
            let c1 = (c0 + chunk).min(len);
            for q in queries.clone() {
                let s = &mut scores[q][c0..c1];
                attn::qk_scores(
                    kernel,
                    query(q),
                    kc,
                    shape.kv_dim,
                    &prefix[c0..c1],
                    scale,
                    s,
                );
            }
        }
        for q in queries.clone() {
            let s = &mut scores[q][len..];
            attn::qk_scores(kernel, query(q), kc, shape.kv_dim, &tails[q % n], scale, s);
            vec::softmax(&mut scores[q]);
            dst(q).fill(0.0);
        }
        for c0 in (0..len).step_by(chunk) {
            let c1 = (c0 + chunk).min(len);
            for q in queries.clone() {
                let p = &scores[q][c0..c1];
                attn::pv_accumulate(kernel, p, vc, shape.kv_dim, &prefix[c0..c1], dst(q));
            }
        }
        for q in queries {
            attn::pv_accumulate(
                kernel,
                &scores[q][len..],
                vc,
                shape.kv_dim,
                &tails[q % n],
                dst(q),
            );
        }
    }
}

/// Prefix slots per chunk: 16 KiB of one head's K (or V), half an L1, so a
/// chunk stays there while every query of the task uses it (64 slots at
/// head_dim 64, 32 at 128).
fn prefix_chunk(head_dim: usize) -> usize {
    (16 * 1024 / (4 * head_dim)).max(8)
}
