//! What every test suite of the workspace shares: where the real models
//! are, and the strategies that fuzz the services' wire edges ([`fuzz`]). A missing model fails the test that needs it, with the command
//! that fetches it: CI always has the models, and a skipped test proves
//! nothing.

#![forbid(unsafe_code)]

pub mod fuzz;

use std::path::{Path, PathBuf};

/// The test model: `$SPECMESH_MODEL`, else the catalog's default
/// (SmolLM2-135M) where `specmesh model fetch` caches it.
pub fn model_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SPECMESH_MODEL").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.exists(),
            "$SPECMESH_MODEL names {}, which does not exist",
            path.display()
        );
        return path;
    }
    catalog(None)
}

/// A catalog model (`qwen2.5-coder-0.5b`, …) from the cache.
pub fn catalog_path(name: &str) -> PathBuf {
    catalog(Some(Path::new(name)))
}

fn catalog(name: Option<&Path>) -> PathBuf {
    specmesh_catalog::resolve(name).unwrap_or_else(|e| {
        panic!("{e}: run `cargo run --release -p specmesh-cli -- model fetch` (or scripts/test.sh)")
    })
}
