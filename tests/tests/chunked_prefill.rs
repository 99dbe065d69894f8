//! Chunked prefill on the real verifier: a long prompt that arrives while
//! other sessions decode is prefilled a chunk at a time, each chunk in the
//! forward of their next steps (`--prefill-chunk-tokens`), so they keep
//! getting tokens, and its own output is what a prefill in one piece
//! gives.
//!
//! The inter-token latency of the running streams with and without
//! chunking is measured by the ignored test here (docs/performance.md,
//! "Chunked prefill"):
//! `cargo test --release -p specmesh-e2e --test chunked_prefill -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use specmesh_e2e::service::Service;
use specmesh_e2e::{model_path, tokenize as tokens};
use specmesh_proto::v1;
use specmesh_proto::v1::session_event::Event;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// Raw text (no chat template) the model goes on counting from for
/// hundreds of tokens without an end of sequence.
fn counting(from: usize) -> String {
    (from..from + 40).map(|i| format!("{i}, ")).collect()
}

/// A prompt of about `tokens` tokens: an essay-like paragraph repeated.
fn long_text(tokens: usize) -> String {
    let paragraph = "The history of the bicycle spans more than two centuries of \
                     invention, from the wooden draisine pushed along by the rider's feet \
                     to the chain-driven safety bicycle with pneumatic tyres. ";
    // The paragraph is about 40 tokens.
    paragraph.repeat(tokens / 40 + 1)
}

fn verifier(chunk: usize) -> Service {
    let model = model_path().display().to_string();
    Service::start(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--cost-curve",
            "1:1,2:1.26,4:1.85,8:2.99,16:5.02,32:9.5,64:18",
            "--threads",
            "2",
            "--prefill-chunk-tokens",
            &chunk.to_string(),
        ],
        &[],
    )
}

fn plain(session: &str, tokens: Vec<u32>, max_new_tokens: u32) -> v1::RunRequest {
    v1::RunRequest {
        session_id: session.into(),
        epoch: 1,
        prompt_len: tokens.len() as u32,
        tokens,
        max_new_tokens,
        ..Default::default()
    }
}

/// What happened on a session's stream, as it arrived.
#[derive(Debug)]
enum Seen {
    Started(usize, Instant),
    Step(usize, Instant, Vec<u32>),
}

/// Runs `request` as session `index`, reporting its events on `tx`.
fn spawn(
    client: &VerifierClient<Channel>,
    index: usize,
    request: v1::RunRequest,
    tx: mpsc::UnboundedSender<Seen>,
) {
    let mut client = client.clone();
    tokio::spawn(async move {
        let mut events = client.run(request).await.unwrap().into_inner();
        while let Ok(Some(e)) = events.message().await {
            let seen = match e.event {
                Some(Event::Started(_)) => Seen::Started(index, Instant::now()),
                Some(Event::Committed(c)) => Seen::Step(index, Instant::now(), c.tokens),
                None => continue,
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
}

/// Steps the running sessions took while the long prompt was prefilled
/// (between sending it and its `Started`), and the long session's output.
async fn steps_during_prefill(chunk: usize, running: usize, long: &[u32]) -> (usize, Vec<u32>) {
    let v = verifier(chunk);
    let client = VerifierClient::connect(v.url.clone()).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    for i in 0..running {
        spawn(
            &client,
            i,
            plain(&format!("run-{i}"), tokens(&counting(i * 7)), 2000),
            tx.clone(),
        );
    }
    // Let every running session decode a few steps first.
    let mut steps = vec![0usize; running];
    while steps.iter().any(|&s| s < 3) {
        if let Some(Seen::Step(i, _, _)) = rx.recv().await {
            steps[i] += 1;
        }
    }
    spawn(
        &client,
        running,
        plain("long", long.to_vec(), 16),
        tx.clone(),
    );
    let (mut during, mut prefilled, mut out) = (0, false, Vec::new());
    while let Some(seen) = rx.recv().await {
        match seen {
            Seen::Started(i, _) if i == running => prefilled = true,
            Seen::Step(i, _, _) if i < running && !prefilled => during += 1,
            Seen::Step(i, _, t) if i == running => {
                out.extend(t);
                if out.len() >= 16 {
                    break;
                }
            }
            _ => {}
        }
    }
    (during, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_is_prefilled_in_the_running_sessions_step_forwards() {
    let long = tokens(&long_text(1200));
    let (chunked, out) = steps_during_prefill(32, 1, &long).await;
    let (whole, expected) = steps_during_prefill(0, 1, &long).await;
    println!(
        "{} prompt tokens: the running session took {chunked} steps during a chunked prefill, \
         {whole} during one in a piece",
        long.len()
    );
    assert_eq!(out, expected, "a chunked prefill changed the output");
    // One step per chunk (the session's next step is queued while a chunk
    // runs): about 37 for 1,200 tokens in chunks of 32.
    assert!(chunked >= 20, "{chunked} steps during a chunked prefill");
    // In one piece the prefill holds every step back until it is done:
    // the steps counted ran while the request was on its way (2–3 here, a
    // few more on a loaded machine, so compared with the chunked count
    // rather than a fixed number).
    assert!(
        whole * 3 <= chunked,
        "{whole} steps during a prefill in one piece, {chunked} during a chunked one"
    );
}

/// p50, p99 and the largest of `gaps`, in milliseconds.
fn percentiles(gaps: &mut [Duration]) -> (f64, f64, f64) {
    gaps.sort_unstable();
    let at = |q: f64| {
        let i = ((gaps.len() as f64 - 1.0) * q).round() as usize;
        gaps[i].as_secs_f64() * 1e3
    };
    (at(0.5), at(0.99), at(1.0))
}

/// 8 sessions decode; a 3,000-token prompt arrives; the gaps between
/// their tokens from its arrival until it is prefilled, with each chunk
/// size (0: in one piece).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (docs/performance.md, Chunked prefill): run with --ignored --nocapture"]
async fn inter_token_latency_of_running_streams_during_a_long_prefill() {
    let long = tokens(&long_text(3000));
    const RUNNING: usize = 8;
    println!(
        "prompt of {} tokens arriving during {RUNNING} running streams",
        long.len()
    );
    println!("chunk | prefill s | steps during | gap p50 ms | p99 ms | max ms");
    for chunk in [0usize, 256, 64, 32] {
        let v = verifier(chunk);
        let client = VerifierClient::connect(v.url.clone()).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 0..RUNNING {
            spawn(
                &client,
                i,
                plain(&format!("run-{i}"), tokens(&counting(i * 7)), 4000),
                tx.clone(),
            );
        }
        let mut last = [None; RUNNING];
        let mut steps = [0usize; RUNNING];
        while steps.iter().any(|&s| s < 5) {
            if let Some(Seen::Step(i, at, _)) = rx.recv().await {
                steps[i] += 1;
                last[i] = Some(at);
            }
        }
        let sent = Instant::now();
        spawn(&client, RUNNING, plain("long", long.clone(), 1), tx.clone());
        let mut gaps = Vec::new();
        let mut prefilled = None;
        while let Some(seen) = rx.recv().await {
            match seen {
                Seen::Started(i, at) if i == RUNNING => prefilled = Some(at),
                Seen::Step(i, at, _) if i < RUNNING => {
                    if let Some(prev) = last[i].replace(at) {
                        gaps.push(at - prev);
                    }
                    // Up to the first token of each stream after the
                    // prefill ended: the gaps it caused, all of them.
                    if prefilled.is_some_and(|p| at > p) && gaps.len() >= RUNNING {
                        let all_after = last
                            .iter()
                            .all(|l| l.is_some_and(|l| l > prefilled.unwrap()));
                        if all_after {
                            break;
                        }
                    }
                }
                _ => {}
            }
        }
        let during = gaps.len();
        let (p50, p99, max) = percentiles(&mut gaps);
        let secs = (prefilled.unwrap() - sent).as_secs_f64();
        println!("{chunk:>5} | {secs:>9.2} | {during:>12} | {p50:>10.1} | {p99:>6.1} | {max:>6.1}");
        drop(rx);
        drop(v);
    }
}
