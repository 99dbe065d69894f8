//! GGUF loader (llama.cpp's format): hyper-parameters from metadata, weights
//! kept in their GGML format when a native kernel exists (Q4_0, Q4_1, Q5_0,
//! Q8_0, Q4_K, Q6_K; repacked losslessly by the kernels) and dequantized to
//! f32 otherwise (every other type candle can read).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use specmesh_kernels::{QFormat, QMatrix, Weights as KWeights};

use super::Progress;
use crate::config::{Architecture, LlamaConfig};
use crate::error::{ModelError, Result, candle_reason};
use crate::weights::{LayerWeights, Projection, Weights};

struct Reader<'a> {
    path: PathBuf,
    file: BufReader<File>,
    content: Content,
    progress: Option<Progress<'a>>,
    dequantize: bool,
    head_tokens: Option<&'a [u32]>,
    done: u64,
    total: u64,
}

pub(super) fn load(
    path: &Path,
    progress: Option<Progress<'_>>,
    dequantize: bool,
    head_tokens: Option<&[u32]>,
) -> Result<Weights> {
    let io = |source| ModelError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut file = BufReader::new(file);
    let mut magic = [0u8; 4];
    let has_magic = file.read_exact(&mut magic).is_ok() && &magic == b"GGUF";
    if !has_magic {
        return Err(ModelError::NotGguf {
            path: path.to_owned(),
            reason: "it does not start with the GGUF magic".into(),
        });
    }
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let content = Content::read(&mut file).map_err(|e| header_error(path, e))?;
    let mut r = Reader {
        path: path.to_owned(),
        file,
        total: 0,
        done: 0,
        progress,
        dequantize,
        head_tokens,
        content,
    };
    r.check_extent(file_len)?;
    let config = r.config()?;
    r.build(config)
}

/// The file starts with the GGUF magic, so a header that does not parse was
/// cut short (candle reports EOF or "… remaining") or is corrupt.
fn header_error(path: &Path, e: candle_core::Error) -> ModelError {
    let reason = candle_reason(&e);
    let short = ["fill whole buffer", "end of file", "remaining", "exceeds"];
    if short.iter().any(|s| reason.contains(s)) {
        ModelError::Truncated {
            path: path.to_owned(),
            what: format!("its GGUF header ends early ({reason})"),
        }
    } else {
        ModelError::NotGguf {
            path: path.to_owned(),
            reason: format!("corrupt GGUF header: {reason}"),
        }
    }
}

/// The tensor's bytes in the file; `u64::MAX` when its shape overflows
/// (a corrupt header: the extent check then refuses it).
fn tensor_bytes(info: &TensorInfo) -> u64 {
    let n = info
        .shape
        .dims()
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64));
    n.and_then(|n| {
        let dtype = info.ggml_dtype;
        (n / dtype.block_size() as u64).checked_mul(dtype.type_size() as u64)
    })
    .unwrap_or(u64::MAX)
}

impl Reader<'_> {
    /// Fails fast, before reading gigabytes, if any tensor lies past the end.
    fn check_extent(&mut self, file_len: u64) -> Result<()> {
        for (name, info) in &self.content.tensor_infos {
            let end = self
                .content
                .tensor_data_offset
                .saturating_add(info.offset)
                .saturating_add(tensor_bytes(info));
            if end > file_len {
                return Err(ModelError::Truncated {
                    path: self.path.clone(),
                    what: format!(
                        "tensor `{name}` needs bytes up to {end}, the file has {file_len}"
                    ),
                });
            }
            self.total += tensor_bytes(info);
        }
        Ok(())
    }

    fn md(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    fn meta_err(&self, key: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Metadata {
            path: self.path.clone(),
            key: key.to_owned(),
            reason: reason.into(),
        }
    }

    fn get_uint(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.md().get(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::U8(x) => *x as i128,
            Value::I8(x) => *x as i128,
            Value::U16(x) => *x as i128,
            Value::I16(x) => *x as i128,
            Value::U32(x) => *x as i128,
            Value::I32(x) => *x as i128,
            Value::U64(x) => *x as i128,
            Value::I64(x) => *x as i128,
            other => {
                return Err(self.meta_err(
                    key,
                    format!("expected an integer, got {:?}", other.value_type()),
                ));
            }
        };
        usize::try_from(n)
            .map(Some)
            .map_err(|_| self.meta_err(key, format!("expected a non-negative integer, got {n}")))
    }

    fn require_uint(&self, key: &str) -> Result<usize> {
        self.get_uint(key)?
            .ok_or_else(|| self.meta_err(key, "required by the model's architecture"))
    }

    fn get_float(&self, key: &str) -> Result<Option<f32>> {
        match self.md().get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(other) => Err(self.meta_err(
                key,
                format!("expected a float, got {:?}", other.value_type()),
            )),
        }
    }

    fn config(&self) -> Result<LlamaConfig> {
        let arch = match self.md().get("general.architecture") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(self.meta_err("general.architecture", "missing")),
        };
        let Some(architecture) = Architecture::from_gguf(&arch) else {
            return Err(ModelError::UnsupportedArchitecture {
                path: self.path.clone(),
                arch,
                supported: Architecture::SUPPORTED,
            });
        };
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = self.require_uint(&k("embedding_length"))?;
        let n_heads = self.require_uint(&k("attention.head_count"))?;
        let embd = self.info("token_embd.weight")?;
        let vocab = match self.get_uint(&k("vocab_size"))? {
            Some(v) => v,
            None => embd.shape.dims().first().copied().unwrap_or(0),
        };
        let head_dim = match self.get_uint(&k("attention.key_length"))? {
            Some(d) => d,
            None if n_heads > 0 => hidden / n_heads,
            None => 0,
        };
        let cfg = LlamaConfig {
            architecture,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: self.require_uint(&k("feed_forward_length"))?,
            n_layers: self.require_uint(&k("block_count"))?,
            n_heads,
            n_kv_heads: self
                .get_uint(&k("attention.head_count_kv"))?
                .unwrap_or(n_heads),
            head_dim,
            rope_theta: self.get_float(&k("rope.freq_base"))?.unwrap_or(10_000.0),
            rms_norm_eps: self
                .get_float(&k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            max_context: self.require_uint(&k("context_length"))?,
            rope_style: architecture.rope_style(),
        };
        cfg.validate()
            .map_err(|reason| self.meta_err(&arch, reason))?;
        Ok(cfg)
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.content
            .tensor_infos
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.clone(),
                name: name.to_owned(),
            })
    }

    fn owned_info(&self, name: &str) -> Result<TensorInfo> {
        let i = self.info(name)?;
        Ok(TensorInfo {
            ggml_dtype: i.ggml_dtype,
            shape: i.shape.clone(),
            offset: i.offset,
        })
    }

    fn tensor_err(&self, name: &str, reason: impl ToString) -> ModelError {
        ModelError::Tensor {
            path: self.path.clone(),
            name: name.to_owned(),
            reason: reason
                .to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
        }
    }

    fn tick(&mut self, bytes: u64) {
        self.done += bytes;
        if let Some(p) = self.progress {
            p(self.done, self.total);
        }
    }

    /// A 2-D weight of `rows` output features over `cols` inputs.
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
        let weights = self.weights(name, rows, cols)?;
        let info = self.owned_info(name)?;
        self.tick(tensor_bytes(&info));
        QMatrix::new(rows, cols, weights).map_err(|e| self.tensor_err(name, e))
    }

    /// The rows `keep` of the 2-D weight `name` (`rows × cols`), in that
    /// order: a head that scores only some tokens.
    fn rows_of(&mut self, name: &str, rows: usize, cols: usize, keep: &[u32]) -> Result<QMatrix> {
        let weights = super::select_rows(self.weights(name, rows, cols)?, cols, keep);
        QMatrix::new(keep.len(), cols, weights).map_err(|e| self.tensor_err(name, e))
    }

    /// A 2-D weight's data as stored (natively quantized formats) or
    /// dequantized, before any repacking.
    fn weights(&mut self, name: &str, rows: usize, cols: usize) -> Result<KWeights> {
        let info = self.owned_info(name)?;
        let dims = info.shape.dims().to_vec();
        if dims != [rows, cols] {
            return Err(ModelError::TensorShape {
                path: self.path.clone(),
                name: name.to_owned(),
                got: dims,
                expected: vec![rows, cols],
            });
        }
        let native = match info.ggml_dtype {
            GgmlDType::Q4_0 => Some(QFormat::Q4_0),
            GgmlDType::Q4_1 => Some(QFormat::Q4_1),
            GgmlDType::Q5_0 => Some(QFormat::Q5_0),
            GgmlDType::Q8_0 => Some(QFormat::Q8_0),
            GgmlDType::Q4K => Some(QFormat::Q4_K),
            GgmlDType::Q6K => Some(QFormat::Q6_K),
            _ => None,
        };
        Ok(match native {
            Some(format) if cols.is_multiple_of(format.block_len()) && !self.dequantize => {
                let mut data = vec![0u8; tensor_bytes(&info) as usize];
                let start = self.content.tensor_data_offset + info.offset;
                self.file
                    .seek(SeekFrom::Start(start))
                    .and_then(|_| self.file.read_exact(&mut data))
                    .map_err(|e| self.tensor_err(name, e))?;
                KWeights::Quant { format, data }
            }
            _ => KWeights::F32(self.dequantized(name, &info)?),
        })
    }

    fn dequantized(&mut self, name: &str, info: &TensorInfo) -> Result<Vec<f32>> {
        let offset = self.content.tensor_data_offset;
        info.read(&mut self.file, offset, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
            .map_err(|e| self.tensor_err(name, e))
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = self.owned_info(name)?;
        if info.shape.elem_count() != len {
            return Err(ModelError::TensorShape {
                path: self.path.clone(),
                name: name.to_owned(),
                got: info.shape.dims().to_vec(),
                expected: vec![len],
            });
        }
        let v = self.dequantized(name, &info)?;
        self.tick(tensor_bytes(&info));
        Ok(v)
    }

    fn build(mut self, config: LlamaConfig) -> Result<Weights> {
        let (h, f, v) = (
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
        );
        let (qd, kvd) = (config.q_dim(), config.kv_dim());
        let embed = Arc::new(self.matrix("token_embd.weight", v, h)?);
        let mut layers = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let qkv_bias = match config.architecture {
                Architecture::Qwen2 => {
                    let mut b = self.vector(&p("attn_q.bias"), qd)?;
                    b.extend(self.vector(&p("attn_k.bias"), kvd)?);
                    b.extend(self.vector(&p("attn_v.bias"), kvd)?);
                    Some(b)
                }
                Architecture::Llama => None,
            };
            layers.push(LayerWeights {
                attn_norm: self.vector(&p("attn_norm.weight"), h)?,
                qkv: Projection::new(vec![
                    self.matrix(&p("attn_q.weight"), qd, h)?,
                    self.matrix(&p("attn_k.weight"), kvd, h)?,
                    self.matrix(&p("attn_v.weight"), kvd, h)?,
                ]),
                qkv_bias,
                wo: self.matrix(&p("attn_output.weight"), h, qd)?,
                ffn_norm: self.vector(&p("ffn_norm.weight"), h)?,
                gate_up: Projection::new(vec![
                    self.matrix(&p("ffn_gate.weight"), f, h)?,
                    self.matrix(&p("ffn_up.weight"), f, h)?,
                ]),
                down: self.matrix(&p("ffn_down.weight"), h, f)?,
            });
        }
        let norm = self.vector("output_norm.weight", h)?;
        // Models with tied embeddings (SmolLM2, Llama 3.2 1B) have no output.weight.
        let head_name = if self.content.tensor_infos.contains_key("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let lm_head = match self.head_tokens {
            Some(keep) => {
                super::check_head_tokens(keep, v)?;
                let head = self.rows_of(head_name, v, h, keep)?;
                if head_name == "output.weight" {
                    // Read once, like every tensor; a tied head was read as
                    // the embedding.
                    let info = self.owned_info(head_name)?;
                    self.tick(tensor_bytes(&info));
                }
                Arc::new(head)
            }
            None if head_name == "output.weight" => Arc::new(self.matrix(head_name, v, h)?),
            None => Arc::clone(&embed),
        };
        let rope_freq_factors = if self.content.tensor_infos.contains_key("rope_freqs.weight") {
            Some(self.vector("rope_freqs.weight", config.head_dim / 2)?)
        } else {
            None
        };
        Ok(Weights {
            config,
            embed,
            layers,
            norm,
            lm_head,
            head_tokens: None,
            rope_freq_factors,
        })
    }
}
