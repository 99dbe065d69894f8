//! A real benchmark client against specmesh, with no network: the
//! tokenizer `specmesh model export-tokenizer` writes from the GGUF loads in
//! `transformers` and tokenizes as the gateway does, and NVIDIA AIPerf
//! (from PyPI; `scripts/python-env.sh aiperf`) profiles the OpenAI front
//! with it and reports speculative decoding from the responses'
//! `metrics.speculative_decoding`.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use specmesh_e2e::front::Front;
use specmesh_e2e::{model_path, run, stdout_ok};

/// The AIPerf environment's interpreter (`scripts/test.sh` sets it).
fn aiperf_python() -> String {
    std::env::var("SPECMESH_AIPERF_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/specmesh/venv-aiperf/bin/python")
    })
}

/// `specmesh model export-tokenizer` of `model` into a temporary directory.
fn export_tokenizer(model: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![OsStr::new("model"), OsStr::new("export-tokenizer")];
    args.extend([OsStr::new("--max-model-len"), OsStr::new("8192")]);
    args.extend([
        OsStr::new("--model"),
        model.as_os_str(),
        dir.path().as_os_str(),
    ]);
    stdout_ok(&run(args));
    dir
}

fn our_ids(model: &Path, text: &str) -> Vec<u32> {
    let args = [
        OsStr::new("tokenize"),
        OsStr::new("--json"),
        OsStr::new("--model"),
    ];
    let out = run(args
        .into_iter()
        .chain([model.as_os_str(), OsStr::new(text)]));
    let v: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    serde_json::from_value(v["ids"].clone()).unwrap()
}

#[test]
fn the_exported_tokenizer_is_the_gateways() {
    // SmolLM2's (GPT-2 splits with single digits) and Qwen2.5's.
    for model in [model_path(), PathBuf::from("qwen2.5-coder-0.5b")] {
        check_export(&model);
    }
}

fn check_export(model: &Path) {
    let dir = export_tokenizer(model);
    let texts = [
        "Hello world!",
        "def f(x):\n    return x**2  # 12345",
        "  spaces, émojis 🙂 and ünïcödé",
        "<|im_start|>user\nhi<|im_end|>",
        "I'm 2024's best...",
    ];
    let mut child = Command::new(aiperf_python())
        .arg(format!(
            "{}/python/hf_tokenizer_check.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the AIPerf environment (scripts/python-env.sh aiperf)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&texts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    // (`PreTrainedTokenizerFast`; transformers 5 calls it `TokenizersBackend`.)
    println!("loaded as {}", seen["class"]);
    for (text, got) in texts.iter().zip(seen["encoded"].as_array().unwrap()) {
        let ids: Vec<u32> = serde_json::from_value(got["ids"].clone()).unwrap();
        assert_eq!(ids, our_ids(model, text), "{}: {text:?}", model.display());
        assert_eq!(got["decoded"], *text);
    }
    // The chat template travels too.
    let chat = seen["chat"].as_str().unwrap();
    assert!(
        chat.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        "{chat:?}"
    );
}

#[test]
fn aiperf_profiles_the_openai_front_and_reports_speculation() {
    let tokenizer = export_tokenizer(&model_path());
    let front = Front::start(&[]);
    let artifacts = tempfile::tempdir().unwrap();
    let aiperf = std::path::Path::new(&aiperf_python()).with_file_name("aiperf");
    let out = Command::new(&aiperf)
        .args(["profile", "--model", &front.model_id, "--url"])
        .arg(format!("http://{}", front.http))
        .args(["--endpoint-type", "chat", "--streaming", "--tokenizer"])
        .arg(tokenizer.path())
        .args([
            "--request-count",
            "6",
            "--concurrency",
            "2",
            "--isl",
            "48",
            "--osl",
            "24",
            "--extra-inputs",
            "ignore_eos:true",
            "--random-seed",
            "7",
            "--no-server-metrics",
            "--no-gpu-telemetry",
            "--ui-type",
            "none",
            "--artifact-dir",
        ])
        .arg(artifacts.path())
        // Its own state, not the user's.
        .env("HOME", artifacts.path())
        .output()
        .expect("aiperf (scripts/python-env.sh aiperf installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "aiperf failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Its speculative-decoding section, from our responses.
    let console =
        std::fs::read_to_string(artifacts.path().join("profile_export_console.txt")).unwrap();
    assert!(console.contains("Spec Decode"), "{console}");
    let report: Value = serde_json::from_slice(
        &std::fs::read(artifacts.path().join("profile_export_aiperf.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        report["request_count"]["avg"], 6.0,
        "{}",
        report["request_count"]
    );
    let steps = report["total_spec_decode_steps"]["avg"].as_f64().unwrap();
    assert!(steps >= 6.0, "{}", report["total_spec_decode_steps"]);
    let length = report["spec_decode_acceptance_length"]["avg"]
        .as_f64()
        .unwrap();
    assert!(length >= 1.0, "{}", report["spec_decode_acceptance_length"]);
    // With ignore_eos every request generated its 24 tokens.
    assert_eq!(report["usage_completion_tokens"]["avg"], 24.0);
}
