//! llama.cpp, the peer the benchmarks measure against: where
//! `tools/bench/setup.sh` builds it (natively, for this CPU) and what it
//! recorded of the build.

use std::path::{Path, PathBuf};

/// Where `tools/bench/setup.sh` puts the binaries.
pub fn default_bin_dir() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/specmesh/peer/bin")
}

/// The build's own description (version, compiler, flags), as
/// `tools/bench/setup.sh` recorded it.
pub fn build_info(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("BUILD_INFO")).ok()?;
    Some(text.lines().collect::<Vec<_>>().join("; "))
}
