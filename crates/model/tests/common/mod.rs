//! Shared fixture: the real model, loaded once per test binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use specmesh_model::{LoadOptions, Model};

/// The test model: `$SPECMESH_MODEL`, else the `specmesh model fetch` cache.
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("SPECMESH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/specmesh/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.exists(),
        "model not found at {}: run `cargo run --release -p specmesh-cli -- model fetch`",
        path.display()
    );
    path
}

pub fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let opts = LoadOptions {
            dequantize: std::env::var_os("SPECMESH_TEST_DEQUANTIZE").is_some(),
            ..LoadOptions::default()
        };
        Model::load(&model_path(), &opts).expect("loading the test model")
    })
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
