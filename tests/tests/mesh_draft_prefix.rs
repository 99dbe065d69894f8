//! The draft model's KV by prefix, through real processes: a drafter
//! whose draft model (the target's first 8 layers) keeps its KV by prefix
//! publishes its blocks (`KvEvents.Subscribe` on the drafter's port), the
//! gateway indexes them and places each follow-up of an OpenAI-style
//! conversation (the whole history resent) on the drafter holding it,
//! whose draft model then starts from the cached history instead of
//! prefilling it. Every answer equals plain decoding's.

use specmesh_e2e::mesh::{FLAT_CURVE, with_mode, without_speculation};
use specmesh_e2e::metrics::metric;
use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_kvcache::BLOCK_TOKENS;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

const TURNS: usize = 3;
const MAX_NEW: u32 = 24;

const CONVERSATIONS: [(&str, [&str; TURNS]); 2] = [
    (
        "tenant-a",
        [
            "Tell me about the printing press and how it changed Europe.",
            "Who built the first one?",
            "Summarize our talk in one sentence.",
        ],
    ),
    (
        "tenant-b",
        [
            "Explain how a river shapes the valley it runs through.",
            "What happens at its mouth?",
            "Give the main idea in one line.",
        ],
    ),
];

/// Turn `t` of a conversation after `replies`: the whole history again.
fn turn(tenant: &str, questions: &[&str], replies: &[String], t: usize) -> v1::GenerateRequest {
    let mut messages = Vec::new();
    for (q, a) in questions.iter().zip(replies).take(t) {
        messages.push(v1::ChatMessage {
            role: "user".into(),
            content: (*q).into(),
            ..Default::default()
        });
        messages.push(v1::ChatMessage {
            role: "assistant".into(),
            content: a.clone(),
            ..Default::default()
        });
    }
    messages.push(v1::ChatMessage {
        role: "user".into(),
        content: questions[t].into(),
        ..Default::default()
    });
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages,
            ..Default::default()
        })),
        max_new_tokens: MAX_NEW,
        tenant: tenant.into(),
        ..Default::default()
    }
}

async fn generate(
    client: &mut GenerationClient<Channel>,
    r: v1::GenerateRequest,
) -> v1::GenerateResponse {
    client.generate(r).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_draft_from_the_draft_models_cached_history() {
    let model = model_path().display().to_string();
    let drafter = Service::start(
        "specmesh-drafter",
        &[
            "--draft-model",
            &model,
            "--self-draft-layers",
            "8",
            "--draft-model-threads",
            "1",
            "--draft-kv-budget-mib",
            "64",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let verifier = Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--cost-curve",
            FLAT_CURVE,
            "--goodput-planner=false",
            "--batch-window-us",
            "30000",
            "--threads",
            "1",
            "--drafters",
            &drafter.url,
        ],
        &[],
    );
    let gateway = Service::start(
        "specmesh-gateway",
        &[
            "--model",
            &model,
            "--verifiers",
            &verifier.url,
            "--drafters",
            &drafter.url,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let drafter_metrics = drafter.metrics.clone().expect("the drafter's /metrics");
    let gateway_metrics = gateway.metrics.clone().expect("the gateway's /metrics");
    let mut client = GenerationClient::connect(gateway.url.clone())
        .await
        .unwrap();
    let hits = || {
        metric(
            &drafter_metrics,
            "specmesh_drafter_prefix_cache_hits_total",
            "",
        )
    };

    let mut follow_ups = 0;
    for (tenant, questions) in CONVERSATIONS {
        let mut replies = Vec::new();
        let mut last_prompt = None;
        for t in 0..TURNS {
            let request = turn(tenant, &questions, &replies, t);
            let plain = generate(&mut client, without_speculation(request.clone())).await;
            let before = hits();
            let drafted = generate(
                &mut client,
                with_mode(request, v1::SpeculationMode::DraftModel),
            )
            .await;
            assert_eq!(
                drafted.token_ids,
                plain.token_ids,
                "{tenant}, turn {}: drafting from a cached prefix changed the answer",
                t + 1
            );
            // The last turn's prompt (all but its last block) came from
            // the cache: its draft KV was computed when that turn drafted.
            if let Some(last) = last_prompt {
                let reused = hits() - before;
                assert!(
                    reused + BLOCK_TOKENS as f64 >= f64::from(last),
                    "{tenant}, turn {}: {reused} draft tokens reused, the last turn's prompt had \
                     {last}",
                    t + 1
                );
                follow_ups += 1;
            }
            last_prompt = Some(drafted.usage.expect("usage").prompt_tokens);
            replies.push(plain.text);
        }
    }
    let by_prefix = metric(
        &gateway_metrics,
        "specmesh_drafter_placements_total",
        "reason=\"prefix\"",
    );
    assert!(
        by_prefix >= f64::from(follow_ups),
        "{by_prefix} drafter placements by prefix for {follow_ups} follow-ups"
    );
    assert!(
        metric(
            &gateway_metrics,
            "specmesh_kv_index_blocks",
            "role=\"drafter\""
        ) > 0.0
    );
    let queries = metric(
        &drafter_metrics,
        "specmesh_drafter_prefix_cache_queries_total",
        "",
    );
    assert!(queries >= hits(), "hits {} of {queries} queried", hits());
}
