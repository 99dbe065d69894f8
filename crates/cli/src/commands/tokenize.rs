//! `specmesh tokenize`: token ids and pieces of a text, for debugging prompts.

use anyhow::Result;
use serde::Serialize;
use specmesh_harness::model::ModelArgs;
use specmesh_harness::prompt::encode_prompt;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Apply the chat template to TEXT as one user message first.
    #[arg(long)]
    chat: bool,
    /// Print JSON: {"ids": [...], "pieces": [...]}.
    #[arg(long)]
    json: bool,
    /// The text.
    text: String,
}

#[derive(Serialize)]
struct Output {
    ids: Vec<u32>,
    pieces: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let tokenizer = args.model.load_tokenizer()?;
    let ids = if args.chat || !args.text.is_empty() {
        encode_prompt(&tokenizer, &args.text, args.chat)?
    } else {
        Vec::new()
    };
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| tokenizer.token_piece(id).unwrap_or_default())
        .collect();
    if args.json {
        println!("{}", serde_json::to_string(&Output { ids, pieces })?);
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            println!("{id:>7}  {piece:?}");
        }
        eprintln!("{} tokens", ids.len());
    }
    Ok(())
}
