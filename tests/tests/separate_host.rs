//! The drafter as a separate host: `specmesh up` runs on the verifier side
//! of two network namespaces joined by a veth pair (`tools/bench/netns.sh`)
//! and starts the drafter on the other side, behind a delay proxy adding a
//! 5 ms round trip. The draft model (the target itself) drafts across that
//! link with drafting ahead on; greedy output stays plain decoding's, and
//! the verifier's wait for the first tree shows the round trip is on the
//! path. (How many trees pay, or are drafted ahead, depends on how the two
//! services share this machine's cores: the sizing rules are unit-tested
//! in the drafter, `session::deadline`, and measured by the separate-host
//! benchmark, docs/performance.md.)
//!
//! Needs root for the namespaces (CI runs as root); elsewhere it says why
//! and returns.

use std::process::Output;

use specmesh_e2e::mesh::Mesh;
use specmesh_e2e::netns::Netns;
use specmesh_e2e::{model_path, specmesh_bin};

/// A verify cost that barely grows with the tree, so the policy drafts with
/// the draft model however its forward compares to the target's: this test
/// is about the trees crossing the link, not whether they pay.
const FLAT_CURVE: &str = "1:1,2:1.01,4:1.02,8:1.04,16:1.08,32:1.16,64:1.32";

const RTT_MS: f64 = 5.0;

const PROMPTS: [&str; 2] = [
    "List the planets of the solar system in order from the sun.",
    "Write a Python function that returns the n-th Fibonacci number.",
];

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "specmesh generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("generate --json prints one JSON object")
}

#[test]
fn a_drafter_across_a_delayed_link_changes_nothing_and_its_round_trip_is_on_the_path() {
    let net = match Netns::up() {
        Ok(n) => n,
        Err(why) => {
            eprintln!("skipped: no network namespaces here: {why}");
            return;
        }
    };
    let args: Vec<String> = [
        "--draft-model",
        &model_path().display().to_string(),
        "--draft-ahead",
        "--drafter-netns",
        &net.d,
        "--drafter-host",
        &net.d_addr,
        "--drafter-rtt-ms",
        &RTT_MS.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mesh = Mesh::start_up_in(
        Some(&net.v),
        &model_path(),
        FLAT_CURVE,
        &args,
        &[("SPECMESH_VERIFIER_GOODPUT_PLANNER", "false")],
    );
    let proxied = mesh
        .startup
        .iter()
        .find(|l| l.contains("reached through"))
        .unwrap_or_else(|| panic!("no delay proxy line in {:#?}", mesh.startup));
    assert!(
        proxied.contains(&format!("specmesh-drafter {}:", net.d_addr))
            && proxied.contains("+5.0 ms"),
        "the drafter is not on the other side of the link: {proxied}"
    );
    let generate = |prompt: &str, mode: &str| {
        let out = net
            .exec_v(specmesh_bin())
            .args(["generate", "--gateway", &mesh.gateway, "--chat", "--json"])
            .args(["--max-new-tokens", "40", "--speculation", mode, prompt])
            .output()
            .expect("running specmesh generate");
        json(&out)
    };
    for prompt in PROMPTS {
        let off = generate(prompt, "off");
        let on = generate(prompt, "draft-model");
        assert_eq!(
            on["token_ids"], off["token_ids"],
            "drafting across the link changed the answer to {prompt:?}"
        );
        // The first tree crosses the link after the start message: the
        // verifier waits at least one round trip for it.
        let waited = on["tree_wait_seconds"].as_f64().unwrap_or(0.0);
        assert!(
            waited >= RTT_MS * 1e-3,
            "the verifier waited {waited} s for trees: the {RTT_MS} ms round trip is not on the path"
        );
        eprintln!(
            "{prompt:?}: {} steps, {} drafted, {} accepted, {} drafted ahead, tree wait {:.1} ms",
            on["verify_steps"],
            on["drafted_tokens"],
            on["accepted_tokens"],
            on["drafted_ahead_steps"],
            waited * 1e3
        );
    }
}
