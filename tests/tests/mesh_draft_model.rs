//! Drafting with a draft model through the three services: the request's
//! speculation mode chooses the drafters (draft model only, or merged with
//! the model-free ones), greedy output stays identical to plain decoding,
//! and a draft model that cannot serve the target is refused with
//! FAILED_PRECONDITION naming both models.

use specmesh_e2e::mesh::{FLAT_CURVE, Mesh, chat_request, with_mode, without_speculation};
use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::Code;

/// The three meshes take turns: all at once on two cores, each one's
/// measured steps would mostly be the others' load.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PROMPTS: [&str; 3] = [
    "List the planets of the solar system in order from the sun.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_model_and_combined_greedy_match_plain_decoding() {
    greedy_matches_plain_decoding(&[]).await;
}

/// The draft head scoring only the 2,048 most frequent tokens of the
/// shipped SmolLM2 ranking (FR-Spec): cheaper trees, the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frequent_token_draft_head_keeps_greedy_output() {
    greedy_matches_plain_decoding(&[("SPECMESH_DRAFTER_DRAFT_HEAD_TOKENS", "2048")]).await;
}

/// A self-draft (the target's first 8 layers, with `extra` drafter
/// settings) in modes draft-model and combined: every greedy answer equals
/// plain decoding's, and the draft model drafts.
async fn greedy_matches_plain_decoding(extra: &[(&str, &str)]) {
    let _turn = SERIAL.lock().await;
    let mesh = Mesh::start_self_draft(extra);
    let mut client = mesh.client().await;
    let mut drafted = 0;
    for text in PROMPTS {
        let off = client
            .generate(without_speculation(chat_request(text, 48)))
            .await
            .unwrap()
            .into_inner();
        for mode in [
            v1::SpeculationMode::DraftModel,
            v1::SpeculationMode::Combined,
        ] {
            let r = client
                .generate(with_mode(chat_request(text, 48), mode))
                .await
                .unwrap_or_else(|s| panic!("{mode:?}: {s:?}"))
                .into_inner();
            assert_eq!(
                r.token_ids, off.token_ids,
                "{mode:?} changed the answer to {text:?}"
            );
            let s = r.speculation.unwrap_or_default();
            if mode == v1::SpeculationMode::DraftModel {
                drafted += s.drafted_tokens;
            }
        }
    }
    assert!(drafted > 0, "the draft model never drafted");
}

/// SmolLM2 as the target and a drafter whose draft model is Qwen2.5-Coder
/// (another tokenizer), started without a target tokenizer to check at load:
/// each session is checked when it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_model_of_another_vocabulary_is_refused_naming_both() {
    let _turn = SERIAL.lock().await;
    let target = model_path();
    let target_name = target.display().to_string();
    let drafter = Service::start(
        "specmesh-drafter",
        &[
            "--draft-model",
            "qwen2.5-coder-0.5b",
            "--draft-model-threads",
            "2",
        ],
        &[],
    );
    let plain_drafter = Service::start("specmesh-drafter", &[] as &[&str], &[]);
    let drafters = format!("{},{}", drafter.url, plain_drafter.url);
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &target_name,
            "--cost-curve",
            FLAT_CURVE,
            "--threads",
            "2",
            "--drafters",
            &drafters,
        ],
        &[],
    );
    let gateway = |drafter: &Service| {
        Service::start(
            "specmesh-gateway",
            &[
                "--model",
                &target_name,
                "--verifiers",
                &verifier.url,
                "--drafters",
                &drafter.url,
            ],
            &[],
        )
    };
    let mismatched = gateway(&drafter);
    let mut client = GenerationClient::connect(mismatched.url.clone())
        .await
        .unwrap();
    for mode in [
        v1::SpeculationMode::DraftModel,
        v1::SpeculationMode::Combined,
        v1::SpeculationMode::Unspecified,
    ] {
        let status = client
            .generate(with_mode(chat_request(PROMPTS[0], 8), mode))
            .await
            .expect_err("a draft model of another vocabulary cannot draft");
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{mode:?}: {status:?}"
        );
        let msg = status.message();
        assert!(
            msg.contains("qwen2.5-coder-0.5b") && msg.contains(&target_name),
            "{mode:?}: the message names both models: {msg}"
        );
    }
    // Plain decoding and model-free drafting never use the draft model.
    for mode in [v1::SpeculationMode::Off, v1::SpeculationMode::ModelFree] {
        let r = client
            .generate(with_mode(chat_request(PROMPTS[0], 8), mode))
            .await
            .unwrap_or_else(|s| panic!("{mode:?}: {s:?}"));
        assert_eq!(r.into_inner().token_ids.len(), 8);
    }

    // A drafter without a draft model refuses the modes that need one.
    let no_model = gateway(&plain_drafter);
    let mut client = GenerationClient::connect(no_model.url.clone())
        .await
        .unwrap();
    let status = client
        .generate(with_mode(
            chat_request(PROMPTS[0], 8),
            v1::SpeculationMode::DraftModel,
        ))
        .await
        .expect_err("no draft model to draft with");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("--draft-model"), "{status:?}");
    let r = client
        .generate(chat_request(PROMPTS[0], 8))
        .await
        .expect("automatic speculation drafts model-free");
    assert_eq!(r.into_inner().token_ids.len(), 8);
}

/// Drafting ahead through the three services, with the target as its own
/// draft model: the output stays identical to plain decoding, and the
/// verifier reports its wait for the trees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafting_ahead_keeps_greedy_output_and_its_guesses_are_used() {
    let _turn = SERIAL.lock().await;
    let mesh = Mesh::start_with_draft_model(
        &model_path(),
        &[
            ("SPECMESH_DRAFTER_DRAFT_AHEAD", "true"),
            ("SPECMESH_VERIFIER_COST_CURVE", FLAT_CURVE),
            // Deep trees of the whole target take longer than the default
            // wait; a late tree would only make its guess miss.
            ("SPECMESH_VERIFIER_DRAFT_TIMEOUT_MS", "5000"),
        ],
    );
    let mut client = mesh.client().await;
    let (mut ahead, mut steps, mut waited) = (0, 0, 0.0);
    for text in PROMPTS {
        let off = client
            .generate(without_speculation(chat_request(text, 48)))
            .await
            .unwrap()
            .into_inner();
        let r = client
            .generate(with_mode(
                chat_request(text, 48),
                v1::SpeculationMode::DraftModel,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.token_ids, off.token_ids,
            "drafting ahead changed {text:?}"
        );
        let s = r.speculation.unwrap_or_default();
        ahead += s.drafted_ahead_steps;
        steps += s.verify_steps;
        waited += s.tree_wait_seconds;
        let off_stats = off.speculation.unwrap_or_default();
        assert_eq!(off_stats.drafted_ahead_steps, 0);
        assert_eq!(
            off_stats.tree_wait_seconds, 0.0,
            "plain decoding waits for no tree"
        );
    }
    // Whether the policy drafts with the model at all here depends on this
    // machine's timing (the self-draft costs a whole target forward); that
    // a guess which holds is sent is checked step by step in the drafter's
    // `a_guess_that_holds_is_sent_as_the_next_tree`.
    println!("{ahead} of {steps} steps verified a tree drafted ahead; waited {waited:.3} s");
    assert!(waited > 0.0, "the verifier reports its wait for the trees");
}
