//! Causal tree attention over a sequence's committed prefix plus the
//! attended tokens of its block.
//!
//! A query (head × block token) attends to keys 0..=p: the committed prefix
//! (slots 0..len) and then the token's ancestors in the block, in block
//! order. Keys are cut into fixed ranges of [`RANGE`] key indices, and a
//! task is one range of one batch item, serving every query of every KV
//! head: each byte of K and V is read once per forward and layer, whatever
//! the number of query heads or tree tokens (splitting queries across
//! threads instead made every thread read the whole cache: at long
//! contexts a step read it twice). A task reads whole slots (every KV
//! head's K, then V), one contiguous stream the prefetchers follow; a task
//! per KV head read a stride of the slots instead, and a long-context step
//! ran at a third of the memory's speed. Only at short contexts, with
//! fewer ranges than threads to keep busy, do tasks split a range's queries
//! (and then read only their KV heads). Within a range the prefix is walked
//! in chunks of 16 KiB, half an L1, each chunk serving every query of the
//! task before the next is loaded, and asked for one chunk ahead.
//!
//! A task leaves each query's softmax over its range unnormalised — the
//! range's maximum score, its sum of exponentials, and the exponential-
//! weighted sum of values — and a second pass combines the ranges in order.
//! Both steps depend only on the key indices: a range is the same keys, in
//! the same order, for a token committed earlier and for the same token
//! staged in a tree (its ancestors sit at the indices the committed tokens
//! will), so a token's output does not depend on the other tokens of its
//! block or batch, nor on the thread count, and greedy speculative decoding
//! reproduces plain decoding bit for bit.
//!
//! The score and value loops run on the kernel of the model's ISA
//! ([`attn::AttnKernel::select`]), like its matmuls: `Isa::Scalar` gives
//! portable attention too. An f16 cache is widened to f32 a chunk at a time
//! (exactly), so the same kernels run on it: converting inside the score
//! and value loops instead made every query pay for every conversion, and
//! was slower for 8- and 16-token blocks (docs/lab/kernels.md).

use specmesh_kernels::attn::{self, AttnKernel};
use specmesh_kernels::{ThreadPool, half16, vec};

use crate::block::Block;
use crate::kv::PlaneRef;
use crate::sequence::Sequence;

/// Key indices per range. A task reads `RANGE` keys, so at 4096 tokens of
/// context a 1-token step has 8 ranges to spread over the threads; longer ranges leave threads idle, shorter ones
/// store and combine more partial results.
pub(crate) const RANGE: usize = 512;

/// Block tokens per pass: bounds the partial results a pass holds (a long
/// prompt at a long context has many ranges per query).
const PASS_TOKENS: usize = 32;

/// Queries × (window, range) pairs up to which the combining pass runs on
/// the calling thread: a 1-token step's few partial results take less time
/// than handing them to the pool and waiting for it (a barrier per layer).
const COMBINE_ALONE: usize = 256;

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

/// Buffers reused across layers and forwards.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    tasks: Vec<Task>,
    /// Per pass item: its first token, tokens, ranges and first partial.
    windows: Vec<Window>,
    /// Per (window, head, token, range): max, sum, then head_dim values.
    partials: Vec<f32>,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    item: usize,
    /// Block tokens `t0..t0 + n` are this pass's queries.
    t0: usize,
    n: usize,
    ranges: usize,
    /// Offset of its first partial in `Scratch::partials`.
    at: usize,
}

#[derive(Clone, Copy, Debug)]
struct Task {
    window: usize,
    range: usize,
    /// Which part of the window's queries (`part` of `parts`): only when
    /// there are fewer (window, range) pairs than threads to keep busy, at
    /// short contexts.
    part: usize,
    parts: usize,
}

/// Raw pointer to a buffer that tasks write in disjoint parts.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: each task writes only its own queries' slices (its partials or
// output rows), and the pool joins all tasks before the buffer's borrow
// ends.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// Attention of layer `layer` for every block token of `items`, reading
/// queries from `qkv` and writing each head's output to `out` (`rows ×
/// n_heads·d`).
pub(crate) fn run(
    items: &[Item<'_>],
    layer: usize,
    qkv: &[f32],
    shape: &Shape,
    pool: &ThreadPool,
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let longest = items.iter().map(|it| it.block.len()).max().unwrap_or(0);
    let out = Shared(out.as_mut_ptr());
    let entry = shape.head_dim + 2;
    for t0 in (0..longest).step_by(PASS_TOKENS) {
        let Scratch {
            tasks,
            windows,
            partials,
        } = scratch;
        windows.clear();
        let mut at = 0;
        for (i, it) in items.iter().enumerate() {
            let n = it.block.len().saturating_sub(t0).min(PASS_TOKENS);
            if n == 0 {
                continue;
            }
            let ranges = (0..n)
                .map(|t| keys(it, t0 + t).div_ceil(RANGE))
                .max()
                .unwrap_or(1);
            windows.push(Window {
                item: i,
                t0,
                n,
                ranges,
                at,
            });
            at += shape.n_heads * n * ranges * entry;
        }
        partials.resize(at, 0.0);
        let pairs: usize = windows.iter().map(|w| w.ranges).sum::<usize>();
        let parts = (2 * pool.threads()).div_ceil(pairs.max(1)).max(1);
        tasks.clear();
        for (w, win) in windows.iter().enumerate() {
            for range in 0..win.ranges {
                for part in 0..parts {
                    tasks.push(Task {
                        window: w,
                        range,
                        part,
                        parts,
                    });
                }
            }
        }
        let part = Shared(partials.as_mut_ptr());
        let (tasks, windows) = (&*tasks, &*windows);
        pool.for_ranges(tasks.len(), &|range| {
            let mut buffers = Buffers::default();
            for task in &tasks[range] {
                run_task(items, windows, task, layer, qkv, shape, part, &mut buffers);
            }
        });
        let queries: usize = windows.iter().map(|w| w.n * shape.n_heads).sum();
        let partials = &*partials;
        if queries * pairs <= COMBINE_ALONE {
            // A few hundred values: cheaper than waking the pool again.
            combine(items, windows, partials, shape, out, 0..queries);
        } else {
            pool.for_ranges(queries, &|range| {
                combine(items, windows, partials, shape, out, range);
            });
        }
    }
}

/// Keys block token `t` attends to: the committed prefix, its ancestors
/// and itself.
fn keys(item: &Item<'_>, t: usize) -> usize {
    item.seq.len() + item.block.depth(t) + 1
}

/// A thread's buffers, kept across its tasks.
#[derive(Default)]
struct Buffers {
    /// Each block token's ancestors (itself last) as block indices.
    ancestors: Vec<Vec<usize>>,
    /// Per query of the task: its scores, then their exponentials.
    scores: Vec<Vec<f32>>,
    /// Slots `0..n` of a chunk (indices into `wide` or a plane).
    slots: Vec<usize>,
    /// An f16 chunk widened to f32.
    wide: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
fn run_task(
    items: &[Item<'_>],
    windows: &[Window],
    task: &Task,
    layer: usize,
    qkv: &[f32],
    shape: &Shape,
    partials: Shared,
    b: &mut Buffers,
) {
    let win = windows[task.window];
    let item = &items[win.item];
    let (d, kernel, kv_dim) = (shape.head_dim, shape.kernel, shape.kv_dim);
    let scale = 1.0 / (d as f32).sqrt();
    let len = item.seq.len();
    let (k0, k1) = (task.range * RANGE, (task.range + 1) * RANGE);

    // Query q of the window is (head q / n, token t0 + q % n), of KV head
    // q / per_group; those whose keys end before this range have nothing
    // to do here.
    let n = win.n;
    let nq = shape.n_heads * n;
    let per_group = nq / shape.n_kv_heads;
    let queries = nq * task.part / task.parts..nq * (task.part + 1) / task.parts;
    let active = |q: usize| keys(item, win.t0 + q % n) > k0;
    if !queries.clone().any(active) {
        return;
    }
    if b.ancestors.len() < n {
        b.ancestors.resize_with(n, Vec::new);
    }
    for t in 0..n {
        item.block.attended(win.t0 + t, &mut b.ancestors[t]);
    }
    let (kp, vp) = item.seq.layer(layer);
    // The KV heads the task's queries read are columns `cols` of a slot
    // (head g at g · d): a whole slot's row at once when the task has every
    // query, one contiguous stream rather than a stride per head.
    let cols = queries.start / per_group * d..(queries.end - 1) / per_group * d + d;
    let at = |q: usize| q / per_group * d - cols.start;
    // Prefix slots of this range, and each token's ancestors in it (their
    // key index is len + their index in the ancestor list).
    let prefix = k0.min(len)..k1.min(len);
    let tail = |t: usize| {
        let a = &b.ancestors[t];
        let from = k0.saturating_sub(len).min(a.len());
        let to = k1.saturating_sub(len).min(a.len());
        from..to
    };
    let query = |q: usize| {
        let row = item.row0 + win.t0 + q % n;
        &qkv[row * shape.qkv_stride + q / n * d..][..d]
    };
    let entry = d + 2;
    let ranges = win.ranges;
    // SAFETY: see `Shared`; (head, token, range) belongs to this task.
    let partial = |q: usize| unsafe {
        let i = q * ranges + task.range;
        std::slice::from_raw_parts_mut(partials.0.add(win.at + i * entry), entry)
    };
    if b.scores.len() < nq {
        b.scores.resize_with(nq, Vec::new);
    }
    let scores = &mut b.scores;
    for q in queries.clone() {
        scores[q].clear();
        scores[q].resize(prefix.len() + tail(q % n).len(), 0.0);
    }

    let chunk = prefix_chunk(cols.len());
    let (slots, wide) = (&mut b.slots, &mut b.wide);
    for c0 in prefix.clone().step_by(chunk) {
        let c1 = (c0 + chunk).min(prefix.end);
        prefetch_rows(kp, kv_dim, cols.clone(), c1..(c1 + chunk).min(prefix.end));
        let (rows, stride) = head_rows(kp, kv_dim, cols.clone(), c0..c1, wide);
        slots.clear();
        slots.extend(0..c1 - c0);
        for q in queries.clone().filter(|&q| active(q)) {
            let s = &mut scores[q][c0 - prefix.start..c1 - prefix.start];
            attn::qk_scores(kernel, query(q), &rows[at(q)..], stride, slots, scale, s);
        }
    }
    // The block's rows (slots len..len + block) hold every ancestor.
    let block_rows = len..len + item.block.len();
    let (rows, stride) = head_rows(kp, kv_dim, cols.clone(), block_rows.clone(), wide);
    for q in queries.clone().filter(|&q| active(q)) {
        let t = q % n;
        let ids = &b.ancestors[t][tail(t)];
        let s = &mut scores[q][prefix.len()..];
        attn::qk_scores(kernel, query(q), &rows[at(q)..], stride, ids, scale, s);
        let (max, sum) = vec::softmax_unnormalized(&mut scores[q]);
        let p = partial(q);
        p[0] = max;
        p[1] = sum;
        p[2..].fill(0.0);
    }
    for c0 in prefix.clone().step_by(chunk) {
        let c1 = (c0 + chunk).min(prefix.end);
        prefetch_rows(vp, kv_dim, cols.clone(), c1..(c1 + chunk).min(prefix.end));
        let (rows, stride) = head_rows(vp, kv_dim, cols.clone(), c0..c1, wide);
        slots.clear();
        slots.extend(0..c1 - c0);
        for q in queries.clone().filter(|&q| active(q)) {
            let e = &scores[q][c0 - prefix.start..c1 - prefix.start];
            let out = &mut partial(q)[2..];
            attn::pv_accumulate(kernel, e, &rows[at(q)..], stride, slots, out);
        }
    }
    let (rows, stride) = head_rows(vp, kv_dim, cols.clone(), block_rows, wide);
    for q in queries.filter(|&q| active(q)) {
        let t = q % n;
        let ids = &b.ancestors[t][tail(t)];
        let e = &scores[q][prefix.len()..];
        attn::pv_accumulate(kernel, e, &rows[at(q)..], stride, ids, &mut partial(q)[2..]);
    }
}

/// Combines each query's ranges, in order, into its output row: the
/// softmax over all its keys of the value rows.
fn combine(
    items: &[Item<'_>],
    windows: &[Window],
    partials: &[f32],
    shape: &Shape,
    out: Shared,
    range: std::ops::Range<usize>,
) {
    let (d, h) = (shape.head_dim, shape.n_heads);
    let entry = d + 2;
    let mut w = 0;
    let mut first = 0;
    for i in range {
        while i >= first + windows[w].n * h {
            first += windows[w].n * h;
            w += 1;
        }
        let win = windows[w];
        let item = &items[win.item];
        let (head, t) = ((i - first) / win.n, (i - first) % win.n);
        let used = keys(item, win.t0 + t).div_ceil(RANGE);
        let at = win.at + (head * win.n + t) * win.ranges * entry;
        let parts = &partials[at..at + used * entry];
        let max = parts
            .chunks_exact(entry)
            .fold(f32::NEG_INFINITY, |m, p| m.max(p[0]));
        // SAFETY: see `Shared`; (row, head) belongs to this query alone.
        let dst = unsafe {
            let row = item.row0 + win.t0 + t;
            std::slice::from_raw_parts_mut(out.0.add((row * h + head) * d), d)
        };
        dst.fill(0.0);
        let mut sum = 0.0f32;
        for p in parts.chunks_exact(entry) {
            let w = vec::exp_neg(p[0] - max);
            sum = w.mul_add(p[1], sum);
            for (o, &x) in dst.iter_mut().zip(&p[2..]) {
                *o = w.mul_add(x, *o);
            }
        }
        let inv = 1.0 / sum;
        for o in dst.iter_mut() {
            *o *= inv;
        }
    }
}

/// Columns `cols` of slots `range` of a plane (the task's KV heads) as f32
/// rows the kernels read: `(rows, stride)` with column `cols.start + c` of
/// slot `range.start + i` at `rows[i · stride + c]`. An f32 plane is read
/// in place; an f16 one is widened (exactly) into `wide`, once per chunk
/// for every query of the task.
fn head_rows<'a>(
    plane: PlaneRef<'a>,
    kv_dim: usize,
    cols: std::ops::Range<usize>,
    range: std::ops::Range<usize>,
    wide: &'a mut Vec<f32>,
) -> (&'a [f32], usize) {
    match plane {
        PlaneRef::F32(p) => (&p[range.start * kv_dim + cols.start..], kv_dim),
        PlaneRef::F16(p) => {
            let w = cols.len();
            wide.resize(range.len() * w, 0.0);
            if w == kv_dim {
                // Whole slots: one contiguous run, converted while the
                // next chunk (as many bytes on) is asked for.
                let ahead = std::mem::size_of_val(&p[range.start * kv_dim..range.end * kv_dim]);
                half16::widen_ahead(&p[range.start * kv_dim..range.end * kv_dim], wide, ahead);
            } else {
                for (i, s) in range.enumerate() {
                    let row = s * kv_dim;
                    half16::widen(
                        &p[row + cols.start..row + cols.end],
                        &mut wide[i * w..(i + 1) * w],
                    );
                }
            }
            (&wide[..], w)
        }
    }
}

/// Asks for columns `cols` of slots `range` (see [`vec::prefetch`]).
fn prefetch_rows(
    plane: PlaneRef<'_>,
    kv_dim: usize,
    cols: std::ops::Range<usize>,
    range: std::ops::Range<usize>,
) {
    if matches!(plane, PlaneRef::F16(_)) && cols.len() == kv_dim {
        return; // `head_rows` asks for it as it widens.
    }
    for s in range {
        let row = s * kv_dim;
        match plane {
            PlaneRef::F32(p) => vec::prefetch(&p[row + cols.start..row + cols.end]),
            PlaneRef::F16(p) => vec::prefetch(&p[row + cols.start..row + cols.end]),
        }
    }
}

/// Prefix slots per chunk: 16 KiB of the task's columns of K (or V) in
/// f32, half an L1, so a chunk stays there while every query of the task
/// uses it (16 slots of a 1.5B Qwen's two 128-wide KV heads).
fn prefix_chunk(width: usize) -> usize {
    (16 * 1024 / (4 * width)).max(8)
}
