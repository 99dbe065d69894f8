//! The real test model and its tokenizer, loaded once per test binary.

use std::sync::OnceLock;

use specmesh_model::{LoadOptions, Model};
use specmesh_testing::model_path;
use specmesh_tokenizer::{ChatMessage, Tokenizer};

pub fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| Model::load(&model_path(), &LoadOptions::default()).unwrap())
}

pub fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_gguf_path(&model_path()).unwrap())
}

/// `text` as a user's turn, rendered and tokenized as a prompt.
pub fn chat(text: &str) -> Vec<u32> {
    let t = tokenizer();
    let rendered = t
        .apply_chat_template(&[ChatMessage::new("user", text)], true)
        .unwrap();
    t.encode_for_model(&rendered).unwrap()
}
