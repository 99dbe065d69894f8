//! Qwen2.5-Coder-1.5B (the real large target) through the real services:
//! `specmesh up --model qwen2.5-coder-1.5b` with the model-free drafters.
//! Greedy output with speculation equals plain decoding, through the
//! gateway and in-process; the verifier holds the model in under 1.4 GB.

use specmesh_e2e::mesh::{Mesh, spec_and_off};

const MAX_NEW: u32 = 48;

/// The cost curve `specmesh bench-model --model qwen2.5-coder-1.5b`
/// measured on the 2-core development machine (docs/performance.md).
const COST_CURVE: &str = "1:1,2:1.21,4:1.5,8:2.41,16:4.37,32:8.5,64:17";

/// An edit of code in the prompt: output that copies its input, where the
/// model-free drafters have something to propose.
const EDIT: &str = "Rename the variable `total` to `acc` in this function and return only the code:\n\n```python\ndef add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n```";

fn local_plain(text: &str) -> Vec<u32> {
    specmesh_e2e::local_greedy(std::ffi::OsStr::new("qwen2.5-coder-1.5b"), text, MAX_NEW)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_1_5b_serves_greedy_output_identical_with_and_without_speculation() {
    let model = std::path::Path::new("qwen2.5-coder-1.5b");
    let mesh = Mesh::start_model(model, COST_CURVE, 1, 1, &[]);

    // "specmesh-verifier: model … loaded (avx512-vnni; 512-bit Q4_K 1-8 rows, … kernels, f32 KV): weights 1132 MB, resident 1308 MB"
    let line = mesh
        .startup
        .iter()
        .find(|l| l.starts_with("specmesh-verifier: model"))
        .unwrap_or_else(|| panic!("no memory line in {:?}", mesh.startup));
    let resident: f64 = line
        .split("resident ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|mb| mb.parse().ok())
        .unwrap_or_else(|| panic!("no resident size in {line:?}"));
    assert!(
        resident < 1400.0,
        "the verifier holds {resident} MB before any KV"
    );

    let mut client = mesh.client().await;
    let expected = local_plain(EDIT);
    let (spec, off) = spec_and_off(&mut client, EDIT, MAX_NEW).await;
    assert_eq!(spec.token_ids, expected, "speculation changed the output");
    assert_eq!(off.token_ids, expected, "the gateway differs from --local");
    assert!(spec.text.contains("acc"), "{}", spec.text);
    let s = spec.speculation.unwrap();
    eprintln!(
        "1.5B edit: {} tokens in {} steps, {} drafted, {} accepted",
        spec.token_ids.len(),
        s.verify_steps,
        s.drafted_tokens,
        s.accepted_tokens
    );
}
