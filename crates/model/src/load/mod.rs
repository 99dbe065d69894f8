//! Loading a model from disk: a GGUF file, or a Hugging Face directory with
//! `config.json` and `*.safetensors`.

mod gguf;
mod safetensors;

use std::path::Path;

use crate::error::{ModelError, Result};
use crate::weights::Weights;

/// A progress callback: `(bytes_done, bytes_total)`.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// How a model is loaded.
#[derive(Clone, Copy, Default)]
pub struct LoadOptions<'a> {
    /// Compute threads (`None`: all available cores).
    pub threads: Option<usize>,
    /// Kernel instruction set of the matmuls and of attention (`None`: the
    /// fastest this CPU supports).
    pub isa: Option<specmesh_kernels::Isa>,
    /// Called as weights are read.
    pub progress: Option<Progress<'a>>,
    /// Dequantize every weight to f32 and skip activation quantization: a
    /// slow, high-precision reference for accuracy comparisons.
    pub dequantize: bool,
    /// Score only these tokens (distinct ids below the vocabulary size):
    /// the lm_head keeps just their rows and each [`crate::Logits`] row has
    /// one column per token, in this order. A draft model's cheaper head
    /// (FR-Spec: its most frequent tokens); `None` scores the whole
    /// vocabulary.
    pub head_tokens: Option<&'a [u32]>,
    /// What sequences store K and V as (default f32).
    pub kv_dtype: crate::KvDtype,
}

impl std::fmt::Debug for LoadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("threads", &self.threads)
            .field("isa", &self.isa)
            .field("dequantize", &self.dequantize)
            .field("head_tokens", &self.head_tokens.map(<[u32]>::len))
            .field("kv_dtype", &self.kv_dtype)
            .finish_non_exhaustive()
    }
}

/// On-disk formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    Safetensors,
}

impl ModelFormat {
    /// A directory is a Hugging Face checkpoint; a file must be GGUF.
    pub fn detect(path: &Path) -> Result<ModelFormat> {
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ModelError::NotFound {
                path: path.to_owned(),
            },
            _ => ModelError::Io {
                path: path.to_owned(),
                source: e,
            },
        })?;
        Ok(if meta.is_dir() {
            ModelFormat::Safetensors
        } else {
            ModelFormat::Gguf
        })
    }
}

pub(crate) fn load_weights(path: &Path, opts: &LoadOptions<'_>) -> Result<Weights> {
    let progress = opts.progress;
    let head = opts.head_tokens;
    match ModelFormat::detect(path)? {
        ModelFormat::Gguf => gguf::load(path, progress, opts.dequantize, head),
        ModelFormat::Safetensors => safetensors::load(path, progress, head),
    }
}

/// Checks `head_tokens` against the vocabulary: some, each in range, none
/// twice.
pub(crate) fn check_head_tokens(tokens: &[u32], vocab: usize) -> Result<()> {
    if tokens.is_empty() {
        return Err(ModelError::InvalidOption(
            "`head_tokens` must name at least one token".into(),
        ));
    }
    let mut seen = vec![false; vocab];
    for &t in tokens {
        let Some(s) = seen.get_mut(t as usize) else {
            return Err(ModelError::InvalidOption(format!(
                "`head_tokens` names token {t}, outside the vocabulary of {vocab}"
            )));
        };
        if std::mem::replace(s, true) {
            return Err(ModelError::InvalidOption(format!(
                "`head_tokens` names token {t} twice"
            )));
        }
    }
    Ok(())
}

/// The rows `keep` of a `rows × cols` weight, in that order (GGML blocks
/// are whole rows, so quantized rows are copied as they are).
pub(crate) fn select_rows(
    weights: specmesh_kernels::Weights,
    cols: usize,
    keep: &[u32],
) -> specmesh_kernels::Weights {
    use specmesh_kernels::Weights as W;
    match weights {
        W::Quant { format, data } => {
            let rb = format.row_bytes(cols);
            let mut out = Vec::with_capacity(keep.len() * rb);
            for &r in keep {
                out.extend_from_slice(&data[r as usize * rb..][..rb]);
            }
            W::Quant { format, data: out }
        }
        W::F32(data) => {
            let mut out = Vec::with_capacity(keep.len() * cols);
            for &r in keep {
                out.extend_from_slice(&data[r as usize * cols..][..cols]);
            }
            W::F32(out)
        }
    }
}
