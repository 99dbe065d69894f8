//! The Hugging Face loader against the GGUF loader on the same weights.
//!
//! The real GGUF is converted into a Hugging Face checkpoint the way
//! `convert_hf_to_gguf.py` would have read it: every tensor dequantized to
//! f32, renamed to HF names, and the Q/K rows put back in HF's half-split
//! RoPE order. Loading that directory must give the same model as loading
//! the GGUF with `dequantize: true` (identical f32 weights, identical
//! kernels), so the logits must be bit-identical. A mistake in the row
//! permutation, a swapped projection or a config key read wrongly would all
//! show up as different logits.

mod common;

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::{Device, Tensor};
use common::{bits, catalog_path, model_path};
use specmesh_model::{Block, LoadOptions, Model};

/// The hyper-parameters written into `config.json`, read from GGUF metadata.
struct Hyper {
    vocab: usize,
    hidden: usize,
    ffn: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_theta: f32,
    rms_eps: f32,
    context: usize,
}

fn uint(content: &Content, key: &str) -> usize {
    let v = content
        .metadata
        .get(key)
        .unwrap_or_else(|| panic!("the test GGUF has no `{key}`"));
    v.to_u32()
        .map(|x| x as usize)
        .or_else(|_| v.to_u64().map(|x| x as usize))
        .unwrap()
}

fn float(content: &Content, key: &str) -> f32 {
    content.metadata[key].to_f32().unwrap()
}

fn arch(content: &Content) -> String {
    content.metadata["general.architecture"]
        .to_string()
        .unwrap()
        .clone()
}

fn hyper(content: &Content) -> Hyper {
    let a = arch(content);
    let k = |s: &str| format!("{a}.{s}");
    let hidden = uint(content, &k("embedding_length"));
    let heads = uint(content, &k("attention.head_count"));
    Hyper {
        vocab: content.tensor_infos["token_embd.weight"].shape.dims()[0],
        hidden,
        ffn: uint(content, &k("feed_forward_length")),
        layers: uint(content, &k("block_count")),
        heads,
        kv_heads: uint(content, &k("attention.head_count_kv")),
        head_dim: hidden / heads,
        rope_theta: float(content, &k("rope.freq_base")),
        rms_eps: float(content, &k("attention.layer_norm_rms_epsilon")),
        context: uint(content, &k("context_length")),
    }
}

/// Undoes llama.cpp's Q/K permutation: GGUF row `h*D + 2p + c` holds HF row
/// `h*D + c*(D/2) + p` (the loader applies the opposite direction).
fn unpermute_rope_rows(gguf: &Tensor, heads: usize, head_dim: usize) -> Tensor {
    let (rows, cols) = gguf.dims2().unwrap();
    assert_eq!(rows, heads * head_dim);
    let src = gguf.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let half = head_dim / 2;
    let mut dst = vec![0f32; src.len()];
    for h in 0..heads {
        for p in 0..half {
            for c in 0..2 {
                let from = (h * head_dim + 2 * p + c) * cols;
                let to = (h * head_dim + c * half + p) * cols;
                dst[to..to + cols].copy_from_slice(&src[from..from + cols]);
            }
        }
    }
    Tensor::from_vec(dst, (rows, cols), &Device::Cpu).unwrap()
}

/// Writes `config.json` and `model.safetensors` for the first `layers`
/// layers (all: `None`) of the GGUF at `gguf`: a Llama GGUF becomes a
/// `LlamaForCausalLM` (Q/K rows back in half-split order), a Qwen2 GGUF a
/// `Qwen2ForCausalLM` (rows as they are, with its Q/K/V biases).
fn convert_to_hf(gguf: &Path, out: &Path, layers: Option<usize>) {
    let mut file = BufReader::new(File::open(gguf).unwrap());
    let content = Content::read(&mut file).unwrap();
    let mut hp = hyper(&content);
    let qwen = arch(&content) == "qwen2";
    let all_layers = hp.layers;
    hp.layers = layers.unwrap_or(hp.layers);
    // Per-dimension RoPE factors (Llama 3.1 style) have no plain HF equivalent.
    assert!(!content.tensor_infos.contains_key("rope_freqs.weight"));
    // SmolLM2 ties the lm_head to the embedding; the Qwen GGUFs have an output.weight.
    let tied = !content.tensor_infos.contains_key("output.weight");
    assert_eq!(tied, !qwen);

    let mut load = |name: &str| -> Tensor {
        content
            .tensor(&mut file, name, &Device::Cpu)
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap()
    };
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    tensors.insert(
        "model.embed_tokens.weight".into(),
        load("token_embd.weight"),
    );
    tensors.insert("model.norm.weight".into(), load("output_norm.weight"));
    for i in 0..hp.layers {
        let gguf_name = |s: &str| format!("blk.{i}.{s}.weight");
        let hf_name = |s: &str| format!("model.layers.{i}.{s}.weight");
        let q = load(&gguf_name("attn_q"));
        let k = load(&gguf_name("attn_k"));
        if qwen {
            tensors.insert(hf_name("self_attn.q_proj"), q);
            tensors.insert(hf_name("self_attn.k_proj"), k);
            for (g, h) in [
                ("attn_q", "q_proj"),
                ("attn_k", "k_proj"),
                ("attn_v", "v_proj"),
            ] {
                tensors.insert(
                    format!("model.layers.{i}.self_attn.{h}.bias"),
                    load(&format!("blk.{i}.{g}.bias")),
                );
            }
        } else {
            tensors.insert(
                hf_name("self_attn.q_proj"),
                unpermute_rope_rows(&q, hp.heads, hp.head_dim),
            );
            tensors.insert(
                hf_name("self_attn.k_proj"),
                unpermute_rope_rows(&k, hp.kv_heads, hp.head_dim),
            );
        }
        for (g, h) in [
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
            ("attn_norm", "input_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
        ] {
            tensors.insert(hf_name(h), load(&gguf_name(g)));
        }
    }
    if !tied {
        tensors.insert("lm_head.weight".into(), load("output.weight"));
    }
    // Everything in the GGUF was converted: nothing is silently left out.
    if hp.layers == all_layers {
        assert_eq!(tensors.len(), content.tensor_infos.len());
    }
    candle_core::safetensors::save(&tensors, out.join("model.safetensors")).unwrap();

    let (class, model_type) = if qwen {
        ("Qwen2ForCausalLM", "qwen2")
    } else {
        ("LlamaForCausalLM", "llama")
    };
    let config = serde_json::json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": hp.vocab,
        "hidden_size": hp.hidden,
        "intermediate_size": hp.ffn,
        "num_hidden_layers": hp.layers,
        "num_attention_heads": hp.heads,
        "num_key_value_heads": hp.kv_heads,
        "head_dim": hp.head_dim,
        // f32 -> JSON (f64) -> f32 round-trips exactly.
        "rope_theta": hp.rope_theta,
        "rms_norm_eps": hp.rms_eps,
        "max_position_embeddings": hp.context,
        "tie_word_embeddings": tied,
        "rope_scaling": null,
        "torch_dtype": "float32",
    });
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
}

/// Logits of every position of `tokens` (one chain from position 0) with
/// the first `layers` layers (all: `None`), and the model's config; the
/// model is dropped before returning to bound memory.
fn chain_logits(
    path: &Path,
    dequantize: bool,
    tokens: &[u32],
    layers: Option<usize>,
) -> (specmesh_model::LlamaConfig, Vec<f32>) {
    let opts = LoadOptions {
        dequantize,
        ..LoadOptions::default()
    };
    let model =
        Model::load(path, &opts).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    let model = match layers {
        Some(n) => model.truncated(n).unwrap(),
        None => model,
    };
    let mut seq = model.new_sequence();
    let logits = model
        .forward(&mut seq, &Block::chain(tokens.to_vec(), 0).unwrap())
        .unwrap();
    assert_eq!(logits.rows(), tokens.len());
    (model.config().clone(), logits.into_vec())
}

/// Converts `gguf` (its first `layers` layers) and compares the logits of
/// both loaders, bit for bit.
fn check_conversion(gguf: &Path, layers: Option<usize>, vocab: u32) {
    let dir = tempfile::tempdir().unwrap();
    convert_to_hf(gguf, dir.path(), layers);

    // 40 tokens spread over the vocabulary, so every position of the RoPE
    // table and many embedding rows are exercised.
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 17) % vocab).collect();
    let (hf_config, hf) = chain_logits(dir.path(), false, &tokens, None);
    let (mut gguf_config, reference) = chain_logits(gguf, true, &tokens, layers);
    if let Some(n) = layers {
        gguf_config.n_layers = n;
    }

    assert_eq!(
        hf_config, gguf_config,
        "config.json reproduces the GGUF hyper-parameters"
    );
    assert_eq!(hf.len(), reference.len());
    if bits(&hf) != bits(&reference) {
        let (worst, delta) = hf
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .fold((0, 0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
        let vocab = gguf_config.vocab_size;
        panic!(
            "logits differ: max |Δ| = {delta} at position {}, token {}",
            worst / vocab,
            worst % vocab
        );
    }
}

#[test]
fn hf_checkpoint_converted_from_gguf_gives_bit_identical_logits() {
    check_conversion(&model_path(), None, 49_152);
}

/// Qwen2ForCausalLM: no row permutation (NeoX RoPE on both sides), Q/K/V
/// biases, a separate lm_head. Two layers keep the f32 copies small.
#[test]
fn qwen2_hf_checkpoint_gives_the_logits_of_its_gguf() {
    check_conversion(&catalog_path("qwen2.5-coder-0.5b"), Some(2), 151_936);
}

/// The row mapping itself, on one head of dim 4: GGUF rotates adjacent pairs
/// (rows 0,1 and 2,3), HF rotates halves (rows 0,2 and 1,3).
#[test]
fn rope_row_unpermutation_turns_adjacent_pairs_into_halves() {
    let gguf = Tensor::from_vec(vec![0f32, 1., 2., 3.], (4, 1), &Device::Cpu).unwrap();
    let hf = unpermute_rope_rows(&gguf, 1, 4);
    assert_eq!(
        hf.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        [0., 2., 1., 3.]
    );
}
