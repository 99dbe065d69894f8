//! Rotary position embeddings (Su et al. 2021, arXiv:2104.09864) with
//! explicit per-token positions: tree nodes at equal depth share a position.

use crate::config::{LlamaConfig, RopeStyle};

/// cos/sin tables for every position up to the model's context.
#[derive(Debug)]
pub(crate) struct Rope {
    style: RopeStyle,
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// `freq_factors` divides each frequency (Llama 3.1 long-context scaling,
    /// GGUF tensor `rope_freqs.weight`).
    pub(crate) fn new(cfg: &LlamaConfig, freq_factors: Option<&[f32]>) -> Rope {
        let half = cfg.head_dim / 2;
        let mut cos = Vec::with_capacity(cfg.max_context * half);
        let mut sin = Vec::with_capacity(cfg.max_context * half);
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| {
                let f = 1.0 / (cfg.rope_theta as f64).powf(2.0 * i as f64 / cfg.head_dim as f64);
                f / freq_factors.map_or(1.0, |ff| ff[i] as f64)
            })
            .collect();
        for pos in 0..cfg.max_context {
            for f in &inv_freq {
                let theta = pos as f64 * f;
                cos.push(theta.cos() as f32);
                sin.push(theta.sin() as f32);
            }
        }
        Rope {
            style: cfg.rope_style,
            half,
            cos,
            sin,
        }
    }

    /// Rotates every head of `x` (heads of `2·half` values): pair i is
    /// (2i, 2i+1) for `Interleaved`, (i, i + half) for `Neox`.
    #[inline]
    pub(crate) fn apply(&self, x: &mut [f32], pos: usize) {
        let base = pos * self.half;
        let (cos, sin) = (
            &self.cos[base..base + self.half],
            &self.sin[base..base + self.half],
        );
        for head in x.chunks_exact_mut(2 * self.half) {
            match self.style {
                RopeStyle::Interleaved => {
                    for (pair, (c, s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * c - b * s;
                        pair[1] = a * s + b * c;
                    }
                }
                RopeStyle::Neox => {
                    let (lo, hi) = head.split_at_mut(self.half);
                    for ((a, b), (c, s)) in lo.iter_mut().zip(hi).zip(cos.iter().zip(sin)) {
                        let (x, y) = (*a, *b);
                        *a = x * c - y * s;
                        *b = x * s + y * c;
                    }
                }
            }
        }
    }
}
