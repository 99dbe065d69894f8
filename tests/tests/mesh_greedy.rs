//! Through the real services: greedy output with speculation is identical
//! to plain decoding in-process (`specmesh generate --local`) and to the
//! gateway with speculation off; streaming equals unary; concurrent
//! clients each get their own correct output.

use specmesh_e2e::mesh::{Mesh, bench_prompts, chat_request, spec_and_off};

const MAX_NEW: u32 = 40;

/// The two tests take turns: each starts its own mesh on the same two
/// cores, and with both running the verifier's measured step overhead is
/// doubled, so its planner rightly declines to speculate, and the first
/// test could not tell a drafter that is not wired in from one that does
/// not pay.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn local_plain(text: &str) -> Vec<u32> {
    specmesh_e2e::local_greedy(specmesh_e2e::model_path().as_os_str(), text, MAX_NEW)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_through_the_mesh_equals_plain_decoding() {
    let _turn = SERIAL.lock().await;
    let prompts = bench_prompts(2);
    assert!(
        prompts.len() >= 20,
        "need at least 20 prompts, have {}",
        prompts.len()
    );
    let mesh = Mesh::start();
    let mut client = mesh.client().await;
    let (mut steps, mut tokens, mut accepted) = (0u64, 0u64, 0u64);
    for (category, text) in &prompts {
        let expected = local_plain(text);
        let (spec, off) = spec_and_off(&mut client, text, MAX_NEW).await;
        assert_eq!(
            spec.token_ids, expected,
            "{category}: speculation changed the output of {text:?}"
        );
        assert_eq!(
            off.token_ids, expected,
            "{category}: the gateway without speculation differs from --local"
        );
        assert_eq!(spec.text, off.text);
        let s = spec.speculation.unwrap();
        let o = off.speculation.unwrap();
        assert_eq!(o.drafted_tokens, 0);
        assert!((o.mean_accepted_per_step - 1.0).abs() < 1e-9);
        steps += s.verify_steps as u64;
        tokens += spec.token_ids.len() as u64;
        accepted += s.accepted_tokens as u64;
    }
    eprintln!(
        "{} prompts: {tokens} tokens in {steps} verify steps ({accepted} drafted tokens accepted)",
        prompts.len()
    );
    assert!(
        accepted > 0 && steps < tokens,
        "speculation never accepted anything: the drafter is not wired in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_equals_unary_and_sixteen_concurrent_clients_get_their_own_output() {
    let _turn = SERIAL.lock().await;
    let mesh = Mesh::start();
    let prompts: Vec<String> = bench_prompts(2).into_iter().map(|p| p.1).take(16).collect();
    let mut client = mesh.client().await;
    let mut expected = Vec::new();
    for p in &prompts {
        expected.push(
            client
                .generate(chat_request(p, 24))
                .await
                .unwrap()
                .into_inner(),
        );
    }
    // Streaming: the chunks add up to the unary response.
    let mut stream = client
        .generate_stream(chat_request(&prompts[0], 24))
        .await
        .unwrap()
        .into_inner();
    let (mut text, mut ids, mut last) = (String::new(), Vec::new(), None);
    while let Some(chunk) = stream.message().await.unwrap() {
        text.push_str(&chunk.text);
        ids.extend_from_slice(&chunk.token_ids);
        last = Some(chunk);
    }
    assert_eq!(text, expected[0].text);
    assert_eq!(ids, expected[0].token_ids);
    let last = last.expect("at least one chunk");
    assert_eq!(last.finish_reason, expected[0].finish_reason);
    // The same usage, but for the prompt's KV: the repeat finds the unary
    // call's blocks in the prefix cache.
    let (got, want) = (last.usage.unwrap(), expected[0].usage.unwrap());
    assert_eq!(
        (got.prompt_tokens, got.completion_tokens),
        (want.prompt_tokens, want.completion_tokens)
    );
    assert!(
        got.cached_tokens > want.cached_tokens,
        "{got:?} after {want:?}"
    );

    // Sixteen clients at once, each on its own connection.
    let mut tasks = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let gateway = mesh.gateway.clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = specmesh_proto::v1::generation_client::GenerationClient::connect(gateway)
                .await
                .unwrap();
            let r = if i % 2 == 0 {
                c.generate(chat_request(&p, 24))
                    .await
                    .unwrap()
                    .into_inner()
                    .token_ids
            } else {
                let mut s = c
                    .generate_stream(chat_request(&p, 24))
                    .await
                    .unwrap()
                    .into_inner();
                let mut ids = Vec::new();
                while let Some(chunk) = s.message().await.unwrap() {
                    ids.extend(chunk.token_ids);
                }
                ids
            };
            (i, r)
        }));
    }
    for t in tasks {
        let (i, ids) = t.await.unwrap();
        assert_eq!(ids, expected[i].token_ids, "client {i} got another output");
    }
}
