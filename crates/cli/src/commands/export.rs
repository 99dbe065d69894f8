//! `specmesh model export-tokenizer DIR`: the model's tokenizer as Hugging
//! Face's `tokenizer.json` and `tokenizer_config.json`, so a client that
//! wants a `transformers` tokenizer of the served model (NVIDIA AIPerf,
//! `vllm bench serve`: `--tokenizer DIR`) gets the very tokenizer the
//! gateway runs, from the GGUF, with no hub download.

use std::path::PathBuf;

use anyhow::{Context, Result};
use specmesh_harness::model::ModelArgs;

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The context length to record (`model_max_length`); unset: none.
    #[arg(long)]
    max_model_len: Option<u32>,
    /// The directory to write the files into (created if missing).
    dir: PathBuf,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let tokenizer = args.model.load_tokenizer()?;
    let files = tokenizer.hugging_face_files(args.max_model_len)?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let write = |name: &str, text: &str| {
        let path = args.dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    write("tokenizer.json", &files.tokenizer_json)?;
    write(
        "tokenizer_config.json",
        &serde_json::to_string_pretty(&files.tokenizer_config)?,
    )?;
    println!("{}", args.dir.display());
    Ok(())
}
