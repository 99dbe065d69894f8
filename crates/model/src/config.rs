//! Hyper-parameters of a Llama-family model, from GGUF metadata or a Hugging
//! Face `config.json`.

use serde::{Deserialize, Serialize};

/// How rotary embeddings pair the dimensions of a head.
///
/// llama.cpp's converter permutes a Llama checkpoint's Q/K rows so that
/// RoPE rotates adjacent pairs (2i, 2i+1) (`Interleaved`; the safetensors
/// loader applies the same permutation). Qwen2 GGUFs keep Hugging Face's
/// order, which rotates (i, i + d/2) (`Neox`, llama.cpp's name for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RopeStyle {
    Interleaved,
    Neox,
}

/// The model families the runtime implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, TinyLlama, Mistral-style GGUFs (`llama`).
    Llama,
    /// Qwen2 / Qwen2.5: Llama's blocks plus biases on Q, K and V, NeoX RoPE.
    Qwen2,
}

impl Architecture {
    /// Names as GGUF's `general.architecture` spells them.
    pub const SUPPORTED: &'static str = "llama, qwen2";

    pub fn from_gguf(name: &str) -> Option<Architecture> {
        match name {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            _ => None,
        }
    }

    pub fn rope_style(self) -> RopeStyle {
        match self {
            Architecture::Llama => RopeStyle::Interleaved,
            Architecture::Qwen2 => RopeStyle::Neox,
        }
    }
}

/// Shape and constants of a Llama-family transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub max_context: usize,
    pub rope_style: RopeStyle,
}

/// The longest context specmesh serves (tokens): 2^20.
pub const MAX_CONTEXT: usize = 1 << 20;

impl LlamaConfig {
    /// Width of the concatenated K (or V) projections.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Checks the internal consistency that the forward relies on.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("max_context", self.max_context),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be > 0"));
        }
        // Sizes no real checkpoint comes near, so a corrupt header is an
        // error here rather than a table of its size (the RoPE table holds
        // max_context × head_dim floats) or an abort on allocation.
        let bounded = [
            ("max_context", self.max_context, MAX_CONTEXT),
            ("n_layers", self.n_layers, 1024),
            ("n_heads", self.n_heads, 1024),
            ("n_kv_heads", self.n_kv_heads, 1024),
            ("head_dim", self.head_dim, 1024),
        ];
        if let Some((name, v, max)) = bounded.iter().find(|(_, v, max)| v > max) {
            return Err(format!("`{name}` ({v}) is over specmesh's limit of {max}"));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "`n_heads` ({}) must be a multiple of `n_kv_heads` ({})",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("`head_dim` ({}) must be even", self.head_dim));
        }
        // NaN must fail too, hence not `<= 0.0`.
        let positive = |v: f32| v.partial_cmp(&0.0) == Some(std::cmp::Ordering::Greater);
        if !positive(self.rope_theta) || !positive(self.rms_norm_eps) {
            return Err("`rope_theta` and `rms_norm_eps` must be > 0".into());
        }
        Ok(())
    }
}
