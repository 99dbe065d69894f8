//! `--kv-dtype f16` stores the KV cache in half precision: `specmesh up`
//! passes it to every verifier (which says so when its model loads) and as
//! `--draft-model-kv-dtype` to drafters with a model; greedy output is the
//! same with speculation on and off, and the same as `specmesh generate
//! --local --kv-dtype f16`; a type the services do not know is refused at
//! start, naming the flag.

use specmesh_e2e::mesh::{Mesh, spec_and_off};
use specmesh_e2e::model_path;
use specmesh_e2e::service::run_to_exit;

const MAX_NEW: u32 = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_f16_cache_keeps_speculation_exact_and_answers_as_in_process() {
    let model = model_path();
    let mesh = Mesh::start_with_args(
        &[
            "--kv-dtype",
            "f16",
            "--draft-model",
            model.to_str().unwrap(),
        ],
        &[],
    );
    let loaded: Vec<&String> = mesh
        .startup
        .iter()
        .filter(|l| l.starts_with("specmesh-verifier: model "))
        .collect();
    assert!(!loaded.is_empty(), "{:?}", mesh.startup);
    for line in loaded {
        assert!(line.contains(", f16 KV)"), "{line}");
    }
    for d in &mesh.of("specmesh-drafter") {
        let args = std::fs::read(format!("/proc/{}/cmdline", d.pid)).unwrap_or_default();
        let args: Vec<String> = args
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--draft-model-kv-dtype" && w[1] == "f16"),
            "a drafter drafts without `--draft-model-kv-dtype f16`: {args:?}"
        );
    }
    let mut client = mesh.client().await;
    for text in [
        "Write a Python function that reverses a string.",
        "List three colors of the rainbow, one per line.",
    ] {
        let (spec, off) = spec_and_off(&mut client, text, MAX_NEW).await;
        assert_eq!(
            spec.token_ids, off.token_ids,
            "speculation changed the output of {text:?} with an f16 cache"
        );
        let local = specmesh_e2e::local_greedy_with(
            model.as_os_str(),
            text,
            MAX_NEW,
            &["--kv-dtype", "f16"],
        );
        assert_eq!(
            spec.token_ids, local,
            "the mesh differs from --local for {text:?}"
        );
    }
}

#[test]
fn an_unknown_cache_type_is_refused_at_start() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let out = run_to_exit(
        &[],
        "specmesh-verifier",
        &["--model", model, "--kv-dtype", "f8"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--kv-dtype"), "{stderr}");
    assert!(
        stderr.contains("unknown KV cache type `f8`: expected f16 or f32"),
        "{stderr}"
    );
    // The drafter's flag means nothing without a draft model.
    let out = run_to_exit(&[], "specmesh-drafter", &["--draft-model-kv-dtype", "f16"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`--draft-model-kv-dtype` needs `--draft-model`"),
        "{stderr}"
    );
}
