//! The immutable weights of a Llama-family model, shared by every sequence
//! (and by layer-truncated views) through an `Arc`.

use std::sync::Arc;

use specmesh_kernels::{Isa, QMatrix, QuantizedRows, ThreadPool};

use crate::config::LlamaConfig;

/// Projections that read the same input (Q/K/V, gate/up). Runs of adjacent
/// parts with the same format are stacked into one matrix, so one call
/// quantizes the input once and splits one set of output features across
/// threads (Q4_K_M files mix formats: a Q6_K V beside Q4_K Q and K).
#[derive(Debug)]
pub(crate) struct Projection {
    segments: Vec<QMatrix>,
}

impl Projection {
    pub(crate) fn new(parts: Vec<QMatrix>) -> Projection {
        let mut segments: Vec<QMatrix> = Vec::with_capacity(parts.len());
        for part in parts {
            let fused = segments
                .last()
                .and_then(|last| QMatrix::stack(&[last, &part]));
            match fused {
                Some(m) => *segments.last_mut().unwrap() = m,
                None => segments.push(part),
            }
        }
        Projection { segments }
    }

    /// Total output features.
    pub(crate) fn out_dim(&self) -> usize {
        self.segments.iter().map(QMatrix::rows).sum()
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.segments.iter().map(QMatrix::nbytes).sum()
    }

    /// `out` (`k × out_dim`) = x · [W₀; W₁; …]ᵀ.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        q: &mut QuantizedRows,
        out: &mut [f32],
        tmp: &mut Vec<f32>,
        isa: Isa,
        pool: &ThreadPool,
    ) {
        if let [m] = &self.segments[..] {
            return m.forward(x, q, out, isa, pool);
        }
        let k = x.len() / self.segments[0].cols();
        let total = self.out_dim();
        let mut col = 0;
        for m in &self.segments {
            tmp.resize(k * m.rows(), 0.0);
            m.forward(x, q, tmp, isa, pool);
            for r in 0..k {
                out[r * total + col..r * total + col + m.rows()]
                    .copy_from_slice(&tmp[r * m.rows()..(r + 1) * m.rows()]);
            }
            col += m.rows();
        }
    }
}

#[derive(Debug)]
pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// Outputs [q (n_heads·d) | k (n_kv·d) | v (n_kv·d)].
    pub qkv: Projection,
    /// Biases of the same outputs (Qwen2), added before RoPE.
    pub qkv_bias: Option<Vec<f32>>,
    pub wo: QMatrix,
    pub ffn_norm: Vec<f32>,
    /// Outputs [gate (ffn) | up (ffn)].
    pub gate_up: Projection,
    pub down: QMatrix,
}

#[derive(Debug)]
pub(crate) struct Weights {
    pub config: LlamaConfig,
    /// Token embeddings, one row per token (possibly the same matrix as `lm_head`).
    pub embed: Arc<QMatrix>,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    pub lm_head: Arc<QMatrix>,
    /// The token of each lm_head row when it scores only some tokens
    /// (`LoadOptions::head_tokens`); `None`: row i is token i.
    pub head_tokens: Option<Arc<[u32]>>,
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl Weights {
    /// Bytes of all weights, the embedding counted once when it is tied to
    /// the lm_head.
    pub(crate) fn total_bytes(&self) -> usize {
        let f32s = |v: &[f32]| v.len() * 4;
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.nbytes()
                    + l.wo.nbytes()
                    + l.gate_up.nbytes()
                    + l.down.nbytes()
                    + f32s(&l.attn_norm)
                    + f32s(&l.ffn_norm)
                    + l.qkv_bias.as_deref().map_or(0, f32s)
            })
            .sum();
        let head = if Arc::ptr_eq(&self.embed, &self.lm_head) {
            0
        } else {
            self.lm_head.nbytes()
        };
        layers + self.embed.nbytes() + head + f32s(&self.norm)
    }

    /// Bytes one forward reads from weights (embeddings excluded: one row per
    /// token) with the first `n_layers` layers.
    pub(crate) fn streamed_bytes(&self, n_layers: usize) -> usize {
        self.layers[..n_layers]
            .iter()
            .map(|l| l.qkv.nbytes() + l.wo.nbytes() + l.gate_up.nbytes() + l.down.nbytes())
            .sum::<usize>()
            + self.lm_head.nbytes()
    }
}
