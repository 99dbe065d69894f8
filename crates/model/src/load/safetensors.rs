//! Hugging Face checkpoint loader: `config.json` plus one or more
//! `*.safetensors` shards (any float dtype), weights kept as f32.
//!
//! Llama (`LlamaForCausalLM`) and Qwen2 (`Qwen2ForCausalLM`, with its Q/K/V
//! biases). Hugging Face rotates dimension pairs (i, i + d/2); for Llama the
//! Q and K rows are permuted at load time into the adjacent pairs GGUF's
//! Llama files use (the inverse of llama.cpp's converter, which leaves
//! attention unchanged), while Qwen2 keeps them and runs NeoX RoPE, as its
//! GGUFs do.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use specmesh_kernels::{QMatrix, Weights as KWeights};

use super::Progress;
use crate::config::{Architecture, LlamaConfig, RopeStyle};
use crate::error::{ModelError, Result, candle_reason};
use crate::weights::{LayerWeights, Projection, Weights};

#[derive(Deserialize)]
struct HfConfig {
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f32>,
    rms_norm_eps: Option<f32>,
    max_position_embeddings: usize,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
}

pub(super) fn load(
    dir: &Path,
    progress: Option<Progress<'_>>,
    head_tokens: Option<&[u32]>,
) -> Result<Weights> {
    let cfg_path = dir.join("config.json");
    let raw = std::fs::read_to_string(&cfg_path).map_err(|source| ModelError::Io {
        path: cfg_path.clone(),
        source,
    })?;
    let meta_err = |key: &str, reason: String| ModelError::Metadata {
        path: cfg_path.clone(),
        key: key.into(),
        reason,
    };
    let hf: HfConfig =
        serde_json::from_str(&raw).map_err(|e| meta_err("config.json", e.to_string()))?;
    let named = hf
        .model_type
        .clone()
        .or_else(|| hf.architectures.first().cloned())
        .unwrap_or_else(|| "llama".into());
    let architecture = match named.as_str() {
        "llama" | "LlamaForCausalLM" => Architecture::Llama,
        "qwen2" | "Qwen2ForCausalLM" => Architecture::Qwen2,
        other => {
            return Err(ModelError::UnsupportedArchitecture {
                path: cfg_path,
                arch: other.into(),
                supported: "llama (LlamaForCausalLM), qwen2 (Qwen2ForCausalLM)",
            });
        }
    };
    if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(meta_err(
            "rope_scaling",
            "rope scaling is not supported for safetensors checkpoints yet; use a GGUF".into(),
        ));
    }
    let config = LlamaConfig {
        architecture,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        n_layers: hf.num_hidden_layers,
        n_heads: hf.num_attention_heads,
        n_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim: hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1)),
        rope_theta: hf.rope_theta.unwrap_or(10_000.0),
        rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-5),
        max_context: hf.max_position_embeddings,
        rope_style: architecture.rope_style(),
    };
    config.validate().map_err(|r| meta_err("config.json", r))?;

    let mut shards: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| ModelError::Io {
            path: dir.to_owned(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(ModelError::NoWeights {
            dir: dir.to_owned(),
        });
    }
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let total = shards.len() as u64;
    for (i, shard) in shards.iter().enumerate() {
        let t = candle_core::safetensors::load(shard, &Device::Cpu).map_err(|e| {
            ModelError::BadSafetensors {
                path: shard.clone(),
                reason: candle_reason(&e),
            }
        })?;
        tensors.extend(t);
        if let Some(p) = progress {
            p(i as u64 + 1, total);
        }
    }
    Loader { dir, tensors }.build(config, head_tokens)
}

struct Loader<'a> {
    dir: &'a Path,
    tensors: HashMap<String, Tensor>,
}

impl Loader<'_> {
    fn f32(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.dir.to_owned(),
                name: name.into(),
            })?;
        if t.dims() != dims {
            return Err(ModelError::TensorShape {
                path: self.dir.to_owned(),
                name: name.into(),
                got: t.dims().to_vec(),
                expected: dims.to_vec(),
            });
        }
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
            .map_err(|e| ModelError::Tensor {
                path: self.dir.to_owned(),
                name: name.into(),
                reason: candle_reason(&e),
            })
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
        let data = self.f32(name, &[rows, cols])?;
        QMatrix::new(rows, cols, KWeights::F32(data)).map_err(|e| ModelError::Tensor {
            path: self.dir.to_owned(),
            name: name.into(),
            reason: e.to_string(),
        })
    }

    /// Q/K projection, rows reordered from half-split to interleaved RoPE
    /// pairs where the forward rotates adjacent pairs.
    fn rope_matrix(
        &self,
        name: &str,
        heads: usize,
        head_dim: usize,
        cols: usize,
        style: RopeStyle,
    ) -> Result<QMatrix> {
        if style == RopeStyle::Neox {
            return self.matrix(name, heads * head_dim, cols);
        }
        let src = self.f32(name, &[heads * head_dim, cols])?;
        let half = head_dim / 2;
        let mut dst = vec![0.0f32; src.len()];
        for h in 0..heads {
            for p in 0..half {
                for c in 0..2 {
                    let to = (h * head_dim + 2 * p + c) * cols;
                    let from = (h * head_dim + c * half + p) * cols;
                    dst[to..to + cols].copy_from_slice(&src[from..from + cols]);
                }
            }
        }
        QMatrix::new(heads * head_dim, cols, KWeights::F32(dst)).map_err(|e| ModelError::Tensor {
            path: self.dir.to_owned(),
            name: name.into(),
            reason: e.to_string(),
        })
    }

    fn build(self, config: LlamaConfig, head_tokens: Option<&[u32]>) -> Result<Weights> {
        let (h, f, v, d) = (
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
            config.head_dim,
        );
        let embed = Arc::new(self.matrix("model.embed_tokens.weight", v, h)?);
        let mut layers = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let style = config.rope_style;
            let qkv_bias = match config.architecture {
                Architecture::Qwen2 => {
                    let mut b = self.f32(&p("self_attn.q_proj.bias"), &[config.q_dim()])?;
                    b.extend(self.f32(&p("self_attn.k_proj.bias"), &[config.kv_dim()])?);
                    b.extend(self.f32(&p("self_attn.v_proj.bias"), &[config.kv_dim()])?);
                    Some(b)
                }
                Architecture::Llama => None,
            };
            layers.push(LayerWeights {
                attn_norm: self.f32(&p("input_layernorm.weight"), &[h])?,
                qkv: Projection::new(vec![
                    self.rope_matrix(&p("self_attn.q_proj.weight"), config.n_heads, d, h, style)?,
                    self.rope_matrix(
                        &p("self_attn.k_proj.weight"),
                        config.n_kv_heads,
                        d,
                        h,
                        style,
                    )?,
                    self.matrix(&p("self_attn.v_proj.weight"), config.kv_dim(), h)?,
                ]),
                qkv_bias,
                wo: self.matrix(&p("self_attn.o_proj.weight"), h, config.q_dim())?,
                ffn_norm: self.f32(&p("post_attention_layernorm.weight"), &[h])?,
                gate_up: Projection::new(vec![
                    self.matrix(&p("mlp.gate_proj.weight"), f, h)?,
                    self.matrix(&p("mlp.up_proj.weight"), f, h)?,
                ]),
                down: self.matrix(&p("mlp.down_proj.weight"), h, f)?,
            });
        }
        let norm = self.f32("model.norm.weight", &[h])?;
        let head_name = if self.tensors.contains_key("lm_head.weight") {
            "lm_head.weight"
        } else {
            "model.embed_tokens.weight"
        };
        let lm_head = match head_tokens {
            Some(keep) => {
                super::check_head_tokens(keep, v)?;
                let rows =
                    super::select_rows(KWeights::F32(self.f32(head_name, &[v, h])?), h, keep);
                Arc::new(
                    QMatrix::new(keep.len(), h, rows).map_err(|e| ModelError::Tensor {
                        path: self.dir.to_owned(),
                        name: head_name.into(),
                        reason: e.to_string(),
                    })?,
                )
            }
            None if head_name == "lm_head.weight" => Arc::new(self.matrix(head_name, v, h)?),
            None => Arc::clone(&embed),
        };
        Ok(Weights {
            config,
            embed,
            layers,
            norm,
            lm_head,
            head_tokens: None,
            rope_freq_factors: None,
        })
    }
}
