//! Loading the model and tokenizer in-process: the `--model`, `--threads`
//! and `--isa` flags, shared by the benchmarks and `specmesh`'s local
//! commands.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use specmesh_model::{Isa, KvDtype, LoadOptions, Model, ModelFormat};
use specmesh_tokenizer::Tokenizer;

/// Model selection flags shared by the local commands.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A catalog name (`specmesh model list`), a GGUF file or a Hugging
    /// Face model directory. Default: smollm2-135m, fetched by `specmesh model fetch`.
    #[arg(long, env = "SPECMESH_MODEL")]
    pub model: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(long, env = "SPECMESH_THREADS")]
    pub threads: Option<usize>,
    /// Kernel instruction set: scalar, avx2, avx-vnni, avx512-vnni, amx-int8 (default: the fastest this CPU has).
    #[arg(long, env = "SPECMESH_ISA")]
    pub isa: Option<Isa>,
    /// What the KV cache stores K and V as: f16 (half the memory and
    /// attention reads) or f32.
    #[arg(long, env = "SPECMESH_KV_DTYPE", default_value_t = KvDtype::default())]
    pub kv_dtype: KvDtype,
}

impl ModelArgs {
    /// `--threads`, else every core.
    pub fn threads_or_all(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn path(&self) -> Result<PathBuf> {
        Ok(specmesh_catalog::resolve(self.model.as_deref())?)
    }

    pub fn load_tokenizer(&self) -> Result<Tokenizer> {
        let path = self.path()?;
        // A missing path is the model's "not found", not a tokenizer error.
        ModelFormat::detect(&path)?;
        let tok = Tokenizer::from_model_path(&path);
        tok.with_context(|| format!("loading the tokenizer of {}", path.display()))
    }

    pub fn load_model(&self) -> Result<Model> {
        let path = self.path()?;
        let bar = progress_bar(&path);
        let tick = |done: u64, total: u64| {
            if let Some(b) = &bar {
                b.set_length(total);
                b.set_position(done);
            }
        };
        let opts = LoadOptions {
            threads: self.threads,
            isa: self.isa,
            kv_dtype: self.kv_dtype,
            progress: Some(&tick),
            ..LoadOptions::default()
        };
        let model = Model::load(&path, &opts);
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        Ok(model?)
    }
}

/// A bar on a terminal, nothing when stderr is piped (logs, tests, CI).
fn progress_bar(path: &Path) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(format!(
        "loading {}",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned()
        )
    ));
    Some(bar)
}
