//! Helpers for the end-to-end tests: they run the real `specmesh` binary on
//! the real model, the way a user does.
//!
//! Cargo builds the binaries of a package only for that package's own
//! integration tests, so the `specmesh` binary (package `specmesh-cli`) must
//! be built beforehand: `cargo build --release -p specmesh-cli`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::SystemTime;

/// The `specmesh` binary next to the running test: a test binary lives in
/// `target/<profile>/deps/`, the binaries of the same profile in
/// `target/<profile>/`, so a release test runs the release binary.
pub fn specmesh_bin() -> PathBuf {
    binary("specmesh")
}

/// A binary of the workspace (`specmesh-verifier`, ...) next to the running
/// test, as [`specmesh_bin`] finds `specmesh`.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("unexpected test binary location {}", exe.display()));
    let bin = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "the {name} binary is not at {}: run `cargo build --release --bins` before \
         `cargo test --release -p specmesh-e2e` (cargo does not build other packages' binaries for tests)",
        bin.display()
    );
    warn_if_stale(&bin);
    bin
}

/// A binary older than the sources tests old behaviour; say so rather than
/// let a confusing assertion fail later.
fn warn_if_stale(bin: &Path) {
    let Ok(built) = bin.metadata().and_then(|m| m.modified()) else {
        return;
    };
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    if let Some(newer) = newest_rs_file(&crates).filter(|(t, _)| *t > built) {
        eprintln!(
            "warning: {} is newer than {}: rebuild with `cargo build --release -p specmesh-cli`",
            newer.1.display(),
            bin.display()
        );
    }
}

fn newest_rs_file(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let candidate = if path.is_dir() {
            newest_rs_file(&path)
        } else if path.extension() == Some(OsStr::new("rs")) {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .map(|t| (t, path))
        } else {
            None
        };
        if let Some(c) = candidate
            && newest.as_ref().is_none_or(|n| c.0 > n.0)
        {
            newest = Some(c);
        }
    }
    newest
}

/// The test model: `$SPECMESH_MODEL`, else where `specmesh model fetch`
/// puts the default one.
pub use specmesh_testing::model_path;

/// The token ids `specmesh generate --local --chat` decodes greedily for
/// `text` on `model` (a path or a catalog name): plain decoding, the
/// reference a speculative output must equal.
pub fn local_greedy(model: &OsStr, text: &str, max_new_tokens: u32) -> Vec<u32> {
    local_greedy_with(model, text, max_new_tokens, &[])
}

/// [`local_greedy`] with more `specmesh generate` flags (`--isa avx2`).
pub fn local_greedy_with(
    model: &OsStr,
    text: &str,
    max_new_tokens: u32,
    flags: &[&str],
) -> Vec<u32> {
    let max = max_new_tokens.to_string();
    let mut args: Vec<&OsStr> = vec![
        "generate".as_ref(),
        "--local".as_ref(),
        "--chat".as_ref(),
        "--json".as_ref(),
        "--threads".as_ref(),
        "2".as_ref(),
        "--max-new-tokens".as_ref(),
        OsStr::new(&max),
        "--model".as_ref(),
        model,
    ];
    args.extend(flags.iter().map(OsStr::new));
    args.push(text.as_ref());
    let out = run(args);
    let v: serde_json::Value = serde_json::from_str(stdout_ok(&out).trim()).expect("JSON output");
    v["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|t| t.as_u64().expect("a token id") as u32)
        .collect()
}

/// Runs `specmesh ARGS` to completion with a clean environment for the
/// variables the CLI reads, so the caller's shell cannot change the result.
pub fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_with_env(args, &[])
}

/// [`run`] with extra environment variables.
pub fn run_with_env<I, S>(args: I, env: &[(&str, &OsStr)]) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    // Every model run uses all cores; running several at once (the test
    // harness runs tests on parallel threads) would only make each slower
    // and the timings in the output meaningless.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(specmesh_bin());
    cmd.args(args);
    for var in [
        "SPECMESH_MODEL",
        "SPECMESH_MODEL_CACHE",
        "SPECMESH_PYTHON",
        "SPECMESH_ISA",
    ] {
        cmd.env_remove(var);
    }
    // candle appends a captured backtrace to its error messages when these
    // are set, which turns the CLI's one-line errors into pages.
    for var in ["RUST_BACKTRACE", "RUST_LIB_BACKTRACE"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running the specmesh binary")
}

/// Stdout of a run that must succeed; panics with stderr otherwise.
pub fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "specmesh failed ({}):\nstderr: {}\nstdout: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// The error line of a run that must fail: exits non-zero and prints exactly
/// one line, `error: ...`, on stderr.
pub fn error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected a failure, the run succeeded:\nstdout: {}\nstderr: {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit code 1 (an error, not a crash): {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got:\n{stderr}");
    assert!(
        lines[0].starts_with("error: "),
        "expected `error: ...`, got: {}",
        lines[0]
    );
    lines[0].to_owned()
}

pub mod chaos;
pub mod cluster;
pub mod deploy;
pub mod front;
pub mod load;
pub mod mesh;
pub mod metrics;
pub mod netns;
pub mod otlp;
pub mod pki;
pub mod service;
pub mod stats;
pub mod tenants;

/// The ids `specmesh tokenize` gives `text` (raw: no chat template) on the
/// test model.
pub fn tokenize(text: &str) -> Vec<u32> {
    let model = model_path();
    let out = run([
        "tokenize",
        "--json",
        "--model",
        model.to_str().unwrap(),
        text,
    ]);
    let v: serde_json::Value = serde_json::from_str(stdout_ok(&out).trim()).expect("JSON output");
    v["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|t| t.as_u64().expect("a token id") as u32)
        .collect()
}
