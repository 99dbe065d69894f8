//! The verifier's end of a session's draft stream: it opens
//! `Drafter.Draft` on the drafter the gateway placed, sends the context and
//! every step's outcome, and reads the trees. Trees flow drafter → verifier
//! directly; the gateway never sees them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use specmesh_proto::v1;
use specmesh_proto::v1::drafter_client::DrafterClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

/// One lazily connected channel per drafter endpoint, shared by sessions
/// (HTTP/2 multiplexes their streams).
#[derive(Debug, Clone, Default)]
pub struct DrafterChannels {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl DrafterChannels {
    fn get(&self, endpoint: &str, connect_timeout: Duration) -> Result<Channel, String> {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(endpoint) {
            return Ok(c.clone());
        }
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| format!("drafter endpoint `{endpoint}`: {e}"))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .connect_lazy();
        map.insert(endpoint.to_string(), channel.clone());
        Ok(channel)
    }
}

/// The drafter stream failed; the session goes on without it.
#[derive(Debug, thiserror::Error)]
#[error("draft stream lost: {0}")]
pub struct LinkLost(pub String);

#[derive(Debug)]
pub struct DraftLink {
    tx: mpsc::Sender<v1::DraftRequest>,
    rx: tonic::Streaming<v1::TokenTree>,
    /// A tree that arrived for a later step than the one asked for.
    early: Option<v1::TokenTree>,
}

impl DraftLink {
    /// Opens the stream and sends the session's start.
    pub async fn open(
        channels: &DrafterChannels,
        endpoint: &str,
        start: v1::DraftStart,
        connect_timeout: Duration,
    ) -> Result<DraftLink, LinkLost> {
        let channel = channels.get(endpoint, connect_timeout).map_err(LinkLost)?;
        let (tx, rx) = mpsc::channel(4);
        tx.send(v1::DraftRequest {
            kind: Some(v1::draft_request::Kind::Start(start)),
        })
        .await
        .map_err(|_| LinkLost("closed before start".into()))?;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        specmesh_server::telemetry::inject(&mut request);
        let mut client = DrafterClient::new(channel);
        let open = client.draft(request);
        let response = tokio::time::timeout(connect_timeout, open)
            .await
            .map_err(|_| {
                LinkLost(format!(
                    "no answer from {endpoint} within {connect_timeout:?}"
                ))
            })?
            .map_err(|s| LinkLost(format!("{}: {}", s.code(), s.message())))?;
        Ok(DraftLink {
            tx,
            rx: response.into_inner(),
            early: None,
        })
    }

    /// The tree for (`epoch`, `step`), waiting at most `wait`: one for that
    /// step, or a span that started earlier and covers it. Trees of other
    /// epochs or for earlier steps only are late or duplicated: dropped.
    /// `Ok(None)`: no tree in time (verify the root alone).
    pub async fn tree_for(
        &mut self,
        epoch: u64,
        step: u64,
        wait: Duration,
    ) -> Result<Option<v1::TokenTree>, LinkLost> {
        if let Some(t) = self.early.take() {
            if t.step > step {
                self.early = Some(t);
                return Ok(None);
            }
            if last_step(&t) >= step {
                return Ok(Some(t));
            }
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let next = tokio::time::timeout_at(deadline, self.rx.message()).await;
            let tree = match next {
                Err(_) => return Ok(None),
                Ok(Err(s)) => return Err(LinkLost(format!("{}: {}", s.code(), s.message()))),
                Ok(Ok(None)) => return Err(LinkLost("the drafter closed the stream".into())),
                Ok(Ok(Some(t))) => t,
            };
            if tree.epoch != epoch || last_step(&tree) < step {
                tracing::debug!(
                    tree_epoch = tree.epoch,
                    tree_step = tree.step,
                    step,
                    "dropping a stale tree"
                );
                continue;
            }
            if tree.step > step {
                self.early = Some(tree);
                return Ok(None);
            }
            return Ok(Some(tree));
        }
    }

    /// Tells the drafter what the target did with a step, or a span's.
    pub async fn outcome(&mut self, outcome: v1::StepOutcome) -> Result<(), LinkLost> {
        self.tx
            .send(v1::DraftRequest {
                kind: Some(v1::draft_request::Kind::Outcome(outcome)),
            })
            .await
            .map_err(|_| LinkLost("the drafter stream is closed".into()))
    }
}

/// The last step `tree` stands for: the end of its span for a tree with no
/// nodes, else its own step (a span on such a tree is refused later, when
/// the tree is validated).
fn last_step(tree: &v1::TokenTree) -> u64 {
    if tree.nodes.is_empty() {
        tree.step.saturating_add(u64::from(tree.span.max(1)) - 1)
    } else {
        tree.step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_covers_its_steps_and_a_drafted_tree_its_own() {
        let mut tree = v1::TokenTree {
            step: 5,
            ..Default::default()
        };
        assert_eq!(last_step(&tree), 5);
        tree.span = 1;
        assert_eq!(last_step(&tree), 5);
        tree.span = 4;
        assert_eq!(last_step(&tree), 8);
        tree.nodes.push(v1::TreeNode::default());
        assert_eq!(last_step(&tree), 5);
        let far = v1::TokenTree {
            step: u64::MAX - 1,
            span: 9,
            ..Default::default()
        };
        assert_eq!(last_step(&far), u64::MAX);
    }
}
