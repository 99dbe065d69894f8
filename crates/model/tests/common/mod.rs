//! Shared fixture: the real model, loaded once per test binary.

#![allow(dead_code)]

use std::sync::OnceLock;

use specmesh_model::{LoadOptions, Model};

pub use specmesh_testing::{catalog_path, model_path};

/// Qwen2.5-Coder-0.5B (qwen2: Q/K/V biases, NeoX RoPE; Q5_0, Q8_0, Q4_K
/// and Q6_K weights), loaded once per test binary.
pub fn qwen() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        Model::load(&catalog_path("qwen2.5-coder-0.5b"), &LoadOptions::default())
            .expect("loading qwen2.5-coder-0.5b")
    })
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
