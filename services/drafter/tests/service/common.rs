//! A real drafter on 127.0.0.1:0, started in-process, and a verifier's end
//! of its draft stream over real gRPC.

use std::sync::Arc;
use std::time::Duration;

use specmesh_drafter::{Config, DraftModelConfig, Stats};
use specmesh_proto::v1;
use specmesh_proto::v1::draft_request::Kind;
use specmesh_proto::v1::drafter_client::DrafterClient;
use specmesh_testing::model_path;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// How long a test waits for any one answer before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A drafter serving in the test's runtime.
pub struct Drafter {
    pub addr: std::net::SocketAddr,
    pub stats: Arc<Stats>,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<anyhow::Result<()>>,
}

/// The config tests start from: any free port.
pub fn config() -> Config {
    let mut config = Config::default();
    config.endpoints.listen = "127.0.0.1:0".parse().unwrap();
    config
}

impl Drafter {
    pub async fn start(config: Config) -> Drafter {
        let listening = specmesh_server::start::<specmesh_drafter::Drafter>(config)
            .await
            .expect("binding the drafter");
        let (stop, stopped) = oneshot::channel::<()>();
        let addr = listening.local_addr();
        let stats = Arc::clone(listening.handle());
        let served = tokio::spawn(listening.serve(async {
            let _ = stopped.await;
        }));
        Drafter {
            addr,
            stats,
            stop: Some(stop),
            served,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.endpoint())
            .unwrap()
            .connect()
            .await
            .expect("connecting to the drafter")
    }

    pub async fn client(&self) -> DrafterClient<Channel> {
        DrafterClient::new(self.channel().await)
    }

    /// Asks the drafter to shut down and waits for `serve` to return.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), &mut self.served)
            .await
            .expect("the drafter shut down in time")
            .expect("the serve task did not panic")
    }

    /// Polls the stats until `done` holds.
    pub async fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&specmesh_drafter::StatsSnapshot) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(&self.stats.snapshot()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The verifier's end of one draft stream.
pub struct Stream {
    tx: Option<mpsc::Sender<v1::DraftRequest>>,
    rx: Streaming<v1::TokenTree>,
}

pub fn start_message(start: v1::DraftStart) -> v1::DraftRequest {
    v1::DraftRequest {
        kind: Some(Kind::Start(start)),
    }
}

pub fn outcome_message(outcome: v1::StepOutcome) -> v1::DraftRequest {
    v1::DraftRequest {
        kind: Some(Kind::Outcome(outcome)),
    }
}

impl Stream {
    /// Opens a stream whose first message is `first`.
    pub async fn open(
        client: &mut DrafterClient<Channel>,
        first: v1::DraftRequest,
    ) -> Result<Stream, Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.unwrap();
        let response = client.draft(ReceiverStream::new(rx)).await?;
        Ok(Stream {
            tx: Some(tx),
            rx: response.into_inner(),
        })
    }

    pub async fn start(client: &mut DrafterClient<Channel>, start: v1::DraftStart) -> Stream {
        Stream::open(client, start_message(start))
            .await
            .expect("opening the stream")
    }

    pub async fn send(&self, message: v1::DraftRequest) {
        self.tx
            .as_ref()
            .expect("the stream is open")
            .send(message)
            .await
            .expect("the request stream is open");
    }

    pub async fn outcome(&self, outcome: v1::StepOutcome) {
        self.send(outcome_message(outcome)).await;
    }

    /// Reports that `step` (in a batch of `batch_size`) accepted `path`
    /// and committed `committed`; returns the next tree.
    pub async fn verified(
        &mut self,
        step: u64,
        path: Vec<u32>,
        committed: Vec<u32>,
        batch_size: u32,
    ) -> v1::TokenTree {
        self.outcome(v1::StepOutcome {
            step,
            path,
            committed,
            batch_size,
            ..Default::default()
        })
        .await;
        self.tree().await
    }

    /// The next message: a tree, the end (`Ok(None)`) or the error status.
    pub async fn next(&mut self) -> Result<Option<v1::TokenTree>, Status> {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("the drafter answered in time")
    }

    pub async fn tree(&mut self) -> v1::TokenTree {
        self.tree_within(WAIT).await
    }

    /// The next tree, waiting up to `wait` (a draft model's long prefill).
    pub async fn tree_within(&mut self, wait: Duration) -> v1::TokenTree {
        tokio::time::timeout(wait, self.rx.message())
            .await
            .expect("the drafter answered in time")
            .expect("a tree, not an error")
            .expect("a tree, not the end of the stream")
    }

    /// The error the stream ends with.
    pub async fn error(&mut self) -> Status {
        loop {
            match self.next().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without an error"),
                Err(s) => return s,
            }
        }
    }

    /// Whether nothing arrives within `wait`.
    pub async fn quiet_for(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.rx.message()).await.is_err()
    }

    /// Closes the verifier's side; the drafter ends the stream with OK.
    pub async fn close(mut self) {
        drop(self.tx.take());
        loop {
            match self.next().await {
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(s) => panic!("the stream ended with {s:?}, not OK"),
            }
        }
    }
}

/// Asserts `status` is INVALID_ARGUMENT naming `field`.
pub fn assert_invalid(status: &Status, field: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(&format!("`{field}")),
        "`{field}` not named in: {}",
        status.message()
    );
}

/// A start over `tokens` (all of them prompt) with the given bounds.
pub fn draft_start(
    tenant: &str,
    tokens: Vec<u32>,
    max_draft_tokens: u32,
    max_depth: u32,
) -> v1::DraftStart {
    v1::DraftStart {
        session_id: format!("test-{tenant}-{}", tokens.len()),
        epoch: 3,
        tenant: tenant.into(),
        prompt_len: tokens.len() as u32,
        tokens,
        vocab_size: 1000,
        max_draft_tokens,
        max_depth,
        ..Default::default()
    }
}

/// Node `i`'s depth (0 = root) in a wire tree.
pub fn depth(tree: &v1::TokenTree, i: usize) -> usize {
    let mut d = 0;
    let mut n = i;
    while n > 0 {
        n = tree.nodes[n - 1].parent as usize;
        d += 1;
    }
    d
}

pub fn tree_depth(tree: &v1::TokenTree) -> usize {
    (1..=tree.nodes.len())
        .map(|i| depth(tree, i))
        .max()
        .unwrap_or(0)
}

/// Whether the root has a child with `token`.
pub fn root_child(tree: &v1::TokenTree, token: u32) -> bool {
    tree.nodes.iter().any(|n| n.parent == 0 && n.token == token)
}

/// A greedy verifier whose target always continues with `truth`: accepts
/// the longest path of the tree that agrees with it and commits the
/// accepted tokens plus the next true token. Returns (path, committed).
pub fn verify_greedy(tree: &v1::TokenTree, truth: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let mut path = vec![0u32];
    let mut committed = Vec::new();
    for &want in truth {
        let here = *path.last().unwrap();
        let child = tree
            .nodes
            .iter()
            .position(|n| n.parent == here && n.token == want);
        committed.push(want);
        match child {
            Some(j) => path.push(j as u32 + 1),
            None => break,
        }
    }
    (path, committed)
}

/// A draft model config of the test model (its first `layers` layers, or
/// all), its own tokenizer named as the target's, on 2 threads.
pub fn model_config(layers: Option<usize>) -> DraftModelConfig {
    DraftModelConfig {
        path: model_path(),
        sha256: None,
        self_draft_layers: layers,
        target_tokenizer: Some(model_path()),
        threads: Some(2),
        isa: None,
        kv_dtype: Default::default(),
        max_sessions: 4,
        kv_budget_bytes: 64 << 20,
        draft_ahead: false,
        head_tokens: None,
        token_ranking: None,
    }
}
