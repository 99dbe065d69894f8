//! `--isa` pins the kernels' instruction set: `specmesh up --isa avx2`
//! passes it to every verifier, which loads its model on those kernels (it
//! says which when it starts), and as `--draft-model-isa` to drafters with a
//! model; the pinned mesh answers exactly as `specmesh generate --local
//! --isa avx2` does; and a name the services do not know, or an instruction
//! set this CPU lacks, is refused at start with a message that says so.

use std::process::Output;

use specmesh_e2e::mesh::{Mesh, chat_request};
use specmesh_e2e::model_path;
use specmesh_e2e::service::run_to_exit;

const MAX_NEW: u32 = 32;

/// Whether this CPU has the flag `name` in /proc/cpuinfo.
fn cpu_has(name: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == name))
}

/// The process's command line, NUL-separated arguments as a list.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn local_greedy_on(isa: &str, text: &str) -> Vec<u32> {
    specmesh_e2e::local_greedy_with(model_path().as_os_str(), text, MAX_NEW, &["--isa", isa])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_pinned_to_avx2_answers_as_the_avx2_kernels_do_in_process() {
    if !(cpu_has("avx2") && cpu_has("fma")) {
        eprintln!("skipped: this CPU has no AVX2 and FMA, the instruction set pinned here");
        return;
    }
    let model = model_path();
    let mesh = Mesh::start_with_args(
        &["--isa", "avx2", "--draft-model", model.to_str().unwrap()],
        &[],
    );
    let verifiers = mesh.of("specmesh-verifier");
    assert!(!verifiers.is_empty(), "{:?}", mesh.startup);
    // Each verifier says which kernels its model loaded on, and they are
    // the pinned ones, not this CPU's best.
    let loaded: Vec<&String> = mesh
        .startup
        .iter()
        .filter(|l| l.starts_with("specmesh-verifier: model "))
        .collect();
    assert_eq!(loaded.len(), verifiers.len(), "{:?}", mesh.startup);
    for line in loaded {
        assert!(line.contains("(avx2 kernels, "), "{line}");
    }
    let drafters = mesh.of("specmesh-drafter");
    assert!(!drafters.is_empty(), "{:?}", mesh.startup);
    for d in &drafters {
        let args = cmdline(d.pid);
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--draft-model-isa" && w[1] == "avx2"),
            "a drafter drafts without `--draft-model-isa avx2`: {args:?}"
        );
    }
    let mut client = mesh.client().await;
    for text in [
        "Write a Python function that reverses a string.",
        "What is the capital of France? Answer in one sentence.",
    ] {
        let got = client
            .generate(chat_request(text, MAX_NEW))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            got.token_ids,
            local_greedy_on("avx2", text),
            "the mesh on avx2 differs from the avx2 kernels in-process for {text:?}"
        );
    }
}

fn refused(out: &Output, code: i32, says: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    for needle in says {
        assert!(stderr.contains(needle), "no {needle:?} in: {stderr}");
    }
}

#[test]
fn an_instruction_set_unknown_or_missing_here_is_refused_at_start() {
    let model = model_path();
    let model = model.to_str().unwrap();

    // A name no service knows: a flag error (2) listing the names.
    let out = run_to_exit(
        &[],
        "specmesh-verifier",
        &["--model", model, "--isa", "avx9"],
    );
    refused(
        &out,
        2,
        &["--isa", "unknown instruction set `avx9`", "avx512-vnni"],
    );
    let out = run_to_exit(
        &[],
        "specmesh-drafter",
        &["--draft-model", model, "--draft-model-isa", "avx9"],
    );
    refused(&out, 2, &["--draft-model-isa", "unknown instruction set"]);
    // The drafter's flag means nothing without a draft model: a config
    // error (1), as for its other draft-model flags.
    let out = run_to_exit(&[], "specmesh-drafter", &["--draft-model-isa", "avx2"]);
    refused(&out, 1, &["`--draft-model-isa` needs `--draft-model`"]);

    // A known one this CPU lacks: refused when the model loads (1), naming
    // it. AMX shows in /proc/cpuinfo only where the OS enables it.
    let missing = [
        ("amx-int8", "amx_int8"),
        ("avx512-vnni", "avx512_vnni"),
        ("avx-vnni", "avx_vnni"),
        ("avx2", "avx2"),
    ]
    .into_iter()
    .find(|(_, flag)| !cpu_has(flag));
    let Some((isa, _)) = missing else {
        eprintln!(
            "skipped the missing-ISA half: this CPU has every instruction set specmesh knows"
        );
        return;
    };
    let out = run_to_exit(&[], "specmesh-verifier", &["--model", model, "--isa", isa]);
    refused(&out, 1, &[isa, "not supported by this CPU"]);
    let out = run_to_exit(
        &[],
        "specmesh-drafter",
        &["--draft-model", model, "--draft-model-isa", isa],
    );
    refused(&out, 1, &[isa, "not supported by this CPU"]);
}
