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
}

impl std::fmt::Debug for LoadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("threads", &self.threads)
            .field("isa", &self.isa)
            .field("dequantize", &self.dequantize)
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
    match ModelFormat::detect(path)? {
        ModelFormat::Gguf => gguf::load(path, progress, opts.dequantize),
        ModelFormat::Safetensors => safetensors::load(path, progress),
    }
}
