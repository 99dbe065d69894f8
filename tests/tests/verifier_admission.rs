//! The verifier admits at most `--max-sessions` sessions however many
//! `Run`s arrive at once, and frees a slot when its session ends: the real
//! binary, the real model, real gRPC.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use specmesh_e2e::{binary, model_path};
use specmesh_proto::v1;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tonic::Code;
use tonic::transport::Channel;

const LIMIT: usize = 2;
const CALLS: usize = 8;

struct Verifier(Child);

impl Drop for Verifier {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `specmesh-verifier --max-sessions LIMIT` on a free port.
fn start() -> (Verifier, String) {
    let mut child = Command::new(binary("specmesh-verifier"))
        .args([
            "--plaintext",
            "--listen",
            "127.0.0.1:0",
            "--cost-curve",
            "1:1",
        ])
        .args(["--max-sessions", &LIMIT.to_string()])
        .arg("--model")
        .arg(model_path())
        .env("SPECMESH_VERIFIER_THREADS", "2")
        .env("SPECMESH_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting specmesh-verifier");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the verifier exited before listening")
            .unwrap();
        if let Some(a) = line.strip_prefix("specmesh-verifier listening on ") {
            break a.trim().to_string();
        }
    };
    // Keep draining stdout so the verifier never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (Verifier(child), format!("http://{addr}"))
}

fn run_request(i: usize) -> v1::RunRequest {
    v1::RunRequest {
        session_id: format!("s{i}"),
        tokens: vec![1, 2, 3, 4],
        prompt_len: 4,
        // Long enough to still run while every other call arrives: an
        // unread stream also holds its session at its event buffer.
        max_new_tokens: 1000,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_over_the_limit_are_refused_and_slots_come_back() {
    let (_verifier, url) = start();
    let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
    let calls = (0..CALLS).map(|i| {
        let mut client = VerifierClient::new(channel.clone());
        tokio::spawn(async move { client.run(run_request(i)).await })
    });
    let mut admitted = Vec::new();
    let mut refused = 0;
    for call in futures_join(calls).await {
        match call {
            Ok(stream) => admitted.push(stream.into_inner()),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("limit of 2 sessions"),
                    "{}",
                    status.message()
                );
                refused += 1;
            }
        }
    }
    assert_eq!(admitted.len(), LIMIT, "exactly the limit is admitted");
    assert_eq!(refused, CALLS - LIMIT);

    let mut client = VerifierClient::new(channel.clone());
    let stats = client
        .stats(v1::StatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.active_sessions as usize, LIMIT);

    // Ending the sessions (the caller goes away) frees their slots and KV.
    drop(admitted);
    let mut freed = false;
    for _ in 0..100 {
        let stats = client
            .stats(v1::StatsRequest {})
            .await
            .unwrap()
            .into_inner();
        if stats.active_sessions == 0 && stats.reserved_bytes == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        freed,
        "the slots and KV reservations of ended sessions come back"
    );
    let mut stream = client
        .run(v1::RunRequest {
            max_new_tokens: 3,
            ..run_request(99)
        })
        .await
        .expect("a freed slot admits a new run")
        .into_inner();
    let mut tokens = 0;
    while let Some(event) = stream.message().await.unwrap() {
        if let Some(v1::session_event::Event::Committed(c)) = event.event {
            tokens += c.tokens.len();
        }
    }
    assert!((1..=3).contains(&tokens), "{tokens} tokens");
}

/// Awaits every spawned call, in order.
async fn futures_join<T>(calls: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}
