//! `--model-sha256`: each service checks the model file it loads, here on
//! a read-only path as a model volume or image is mounted in a pod (the
//! model's directory bind-mounted read-only in a mount namespace of the
//! service's own). The right digest serves; a wrong one is refused at
//! start, naming the file and both digests; a digest that is not one is
//! refused as a flag.

use std::path::Path;
use std::process::Output;

use sha2::{Digest, Sha256};
use specmesh_e2e::model_path;
use specmesh_e2e::service::{Service, run_to_exit};

/// A wrapper that runs its arguments with `dir` mounted read-only.
fn read_only(dir: &Path) -> Vec<String> {
    let d = dir.display();
    vec![
        "unshare".into(),
        "-m".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount --bind '{d}' '{d}' && mount -o remount,bind,ro '{d}' && touch '{d}/.w' 2>/dev/null \
             && {{ echo 'the model directory is writable' >&2; exit 9; }}; exec \"$@\""
        ),
        "sh".into(),
    ]
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn refused_naming(out: &Output, file: &Path, expected: &str, actual: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for needle in [
        &file.display().to_string(),
        expected,
        actual,
        "model-sha256",
    ] {
        assert!(stderr.contains(needle), "no {needle:?} in: {stderr}");
    }
}

#[test]
fn each_service_loads_only_the_model_file_it_was_given_the_digest_of() {
    let model = model_path();
    let dir = model.parent().unwrap();
    let right = sha256_hex(&model);
    let wrong = format!(
        "{}{}",
        &right[..63],
        if right.ends_with('0') { '1' } else { '0' }
    );
    let model_arg = model.display().to_string();
    let ro = read_only(dir);
    let ro: Vec<&str> = ro.iter().map(String::as_str).collect();

    // The right digest, read-only: the verifier serves.
    let verifier = Service::start_wrapped(
        &ro,
        "specmesh-verifier",
        "127.0.0.1:0",
        &[
            "--model",
            &model_arg,
            "--model-sha256",
            &right,
            "--threads",
            "1",
        ],
        &[],
    );
    // So does a gateway, with the digest upper-cased and prefixed as some
    // registries print it.
    let gateway = Service::start_wrapped(
        &ro,
        "specmesh-gateway",
        "127.0.0.1:0",
        &[
            "--model",
            &model_arg,
            "--model-sha256",
            &format!("sha256:{}", right.to_uppercase()),
            "--verifiers",
            &verifier.url,
        ],
        &[],
    );
    drop(gateway);
    drop(verifier);

    // A wrong digest: each service refuses to start, naming the file and
    // both digests.
    let owned: Vec<String> = read_only(dir);
    let out = run_to_exit(
        &owned,
        "specmesh-verifier",
        &["--model", &model_arg, "--model-sha256", &wrong],
    );
    refused_naming(&out, &model, &wrong, &right);
    let out = run_to_exit(
        &owned,
        "specmesh-gateway",
        &[
            "--model",
            &model_arg,
            "--model-sha256",
            &wrong,
            "--verifiers",
            "http://127.0.0.1:1",
        ],
    );
    refused_naming(&out, &model, &wrong, &right);
    let out = run_to_exit(
        &owned,
        "specmesh-drafter",
        &["--draft-model", &model_arg, "--model-sha256", &wrong],
    );
    refused_naming(&out, &model, &wrong, &right);

    // Not a digest: refused as a flag (exit 2), saying what one looks like.
    let out = run_to_exit(
        &[],
        "specmesh-verifier",
        &["--model", &model_arg, "--model-sha256", "abc123"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("64 hex digits"), "{stderr}");
}
