//! The transformer forward over a batch of (sequence, block) items, in the
//! order of the Llama paper: per layer, RMSNorm → QKV → RoPE → tree
//! attention → output projection → residual → RMSNorm → SwiGLU MLP →
//! residual; then the final norm and the lm_head on the rows that want
//! logits.
//!
//! All rows of all items go through each matmul together; only attention is
//! per item.

use specmesh_kernels::attn::AttnKernel;
use specmesh_kernels::{Isa, QuantizedRows, ThreadPool, vec};

use crate::attention::{self, Item, Shape};
use crate::block::Block;
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::rope::Rope;
use crate::sequence::Sequence;
use crate::weights::Weights;

/// Buffers reused across forwards so the decode loop does not allocate.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    ffn: Vec<f32>,
    act: Vec<f32>,
    tmp: Vec<f32>,
    q8: QuantizedRows,
    attention: attention::Scratch,
}

/// What one forward reads of a model: borrowed from a `Model` (or a
/// truncated view of one) for the call, so this module needs nothing else
/// of it.
pub(crate) struct Parts<'a> {
    pub weights: &'a Weights,
    pub rope: &'a Rope,
    /// Layers run (fewer than the weights hold in a truncated view).
    pub n_layers: usize,
    pub pool: &'a ThreadPool,
    pub isa: Isa,
    pub attention: AttnKernel,
}

pub(crate) fn run(
    m: &Parts<'_>,
    s: &mut Scratch,
    items: &mut [(&mut Sequence, &Block)],
) -> Result<Vec<Logits>> {
    let cfg = &m.weights.config;
    for (seq, block) in items.iter() {
        if seq.n_layers() != m.n_layers {
            return Err(ModelError::LayerMismatch {
                seq: seq.n_layers(),
                model: m.n_layers,
            });
        }
        if let Some(&t) = block
            .tokens()
            .iter()
            .find(|&&t| t as usize >= cfg.vocab_size)
        {
            return Err(ModelError::TokenOutOfRange {
                token: t,
                vocab: cfg.vocab_size,
            });
        }
        if let Some(&p) = block
            .positions()
            .iter()
            .find(|&&p| p as usize >= cfg.max_context)
        {
            return Err(ModelError::ContextOverflow {
                len: p as usize,
                new: 1,
                max: cfg.max_context,
            });
        }
    }
    for (seq, block) in items.iter_mut() {
        seq.reserve(block.len())?;
    }

    let (h, f, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
    let qkv_stride = qd + 2 * kvd;
    let total: usize = items.iter().map(|(_, b)| b.len()).sum();
    let (isa, pool) = (m.isa, m.pool);

    s.x.resize(total * h, 0.0);
    {
        let mut row = 0;
        for (_, b) in items.iter() {
            for &t in b.tokens() {
                m.weights
                    .embed
                    .dequantize_row(t as usize, &mut s.x[row * h..(row + 1) * h]);
                row += 1;
            }
        }
    }
    s.xn.resize(total * h, 0.0);
    s.qkv.resize(total * qkv_stride, 0.0);
    s.attn.resize(total * qd, 0.0);
    s.proj.resize(total * h, 0.0);
    s.ffn.resize(total * 2 * f, 0.0);
    s.act.resize(total * f, 0.0);
    let shape = Shape {
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: d,
        kv_dim: kvd,
        qkv_stride,
        kernel: m.attention,
    };

    for (l, w) in m.weights.layers[..m.n_layers].iter().enumerate() {
        for (x, xn) in s.x.chunks_exact(h).zip(s.xn.chunks_exact_mut(h)) {
            vec::rms_norm(x, &w.attn_norm, cfg.rms_norm_eps, xn);
        }
        w.qkv
            .forward(&s.xn, &mut s.q8, &mut s.qkv, &mut s.tmp, isa, pool);
        if let Some(bias) = &w.qkv_bias {
            for row in s.qkv.chunks_exact_mut(qkv_stride) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }

        // RoPE on q and k, then K/V into each sequence's staging slots.
        let mut row = 0;
        for (seq, block) in items.iter_mut() {
            for (i, &pos) in block.positions().iter().enumerate() {
                let r = &mut s.qkv[row * qkv_stride..(row + 1) * qkv_stride];
                let (q, kv) = r.split_at_mut(qd);
                m.rope.apply(q, pos as usize);
                m.rope.apply(&mut kv[..kvd], pos as usize);
                let (k, v) = kv.split_at(kvd);
                seq.write_staged(l, i, k, &v[..kvd]);
                row += 1;
            }
        }

        let views: Vec<Item<'_>> = {
            let mut row0 = 0;
            items
                .iter()
                .map(|(seq, block)| {
                    let it = Item { seq, block, row0 };
                    row0 += block.len();
                    it
                })
                .collect()
        };
        attention::run(
            &views,
            l,
            &s.qkv,
            &shape,
            pool,
            &mut s.attn,
            &mut s.attention,
        );

        w.wo.forward(&s.attn, &mut s.q8, &mut s.proj, isa, pool);
        for (x, p) in s.x.iter_mut().zip(&s.proj) {
            *x += p;
        }

        for (x, xn) in s.x.chunks_exact(h).zip(s.xn.chunks_exact_mut(h)) {
            vec::rms_norm(x, &w.ffn_norm, cfg.rms_norm_eps, xn);
        }
        w.gate_up
            .forward(&s.xn, &mut s.q8, &mut s.ffn, &mut s.tmp, isa, pool);
        for (gu, a) in s.ffn.chunks_exact_mut(2 * f).zip(s.act.chunks_exact_mut(f)) {
            let (gate, up) = gu.split_at_mut(f);
            vec::swiglu(gate, up);
            a.copy_from_slice(gate);
        }
        w.down.forward(&s.act, &mut s.q8, &mut s.proj, isa, pool);
        for (x, p) in s.x.iter_mut().zip(&s.proj) {
            *x += p;
        }
    }

    // Final norm on the rows that want logits, then one lm_head call.
    let mut rows = Vec::new();
    let mut row0 = 0;
    for (_, b) in items.iter() {
        rows.extend(b.logit_rows().map(|i| row0 + i));
        row0 += b.len();
    }
    s.xn.resize(rows.len() * h, 0.0);
    for (dst, &r) in s.xn.chunks_exact_mut(h).zip(&rows) {
        vec::rms_norm(
            &s.x[r * h..(r + 1) * h],
            &m.weights.norm,
            cfg.rms_norm_eps,
            dst,
        );
    }
    // One column per token the head scores: the vocabulary, or the subset
    // a cheaper draft head keeps.
    let vocab = m.weights.lm_head.rows();
    let tokens = &m.weights.head_tokens;
    let mut logits = vec![0.0f32; rows.len() * vocab];
    m.weights
        .lm_head
        .forward(&s.xn, &mut s.q8, &mut logits, isa, pool);

    for (seq, block) in items.iter_mut() {
        let parents = (0..block.len())
            .map(|i| block.parent(i).map(|p| p as u32))
            .collect();
        seq.stage(block.positions(), parents);
    }
    if items.len() == 1 {
        return Ok(vec![Logits::new(vocab, logits, tokens.clone())]);
    }
    let mut out = Vec::with_capacity(items.len());
    let mut at = 0;
    for (_, b) in items.iter() {
        let n = b.logit_rows().len();
        out.push(Logits::new(
            vocab,
            logits[at * vocab..(at + n) * vocab].to_vec(),
            tokens.clone(),
        ));
        at += n;
    }
    Ok(out)
}
