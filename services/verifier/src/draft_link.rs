//! The verifier's end of a session's draft stream: it opens
//! `Drafter.Draft` on the drafter the gateway placed, sends the context and
//! every step's outcome, and reads the trees. Trees flow drafter → verifier
//! directly; the gateway never sees them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use specmesh_proto::v1::drafter_client::DrafterClient;
use specmesh_proto::{last_step, v1};
use specmesh_server::{Dialer, Security};
use specmesh_tree::TreeLimits;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::drafting::DraftingLog;
use crate::step::Answer;
use crate::validate;

/// Largest tree a drafter may send: the proto bounds a tree to a few
/// hundred nodes with draft distributions, far below this.
const MAX_TREE_BYTES: usize = 4 << 20;

/// One lazily connected channel per drafter endpoint, shared by sessions
/// (HTTP/2 multiplexes their streams).
#[derive(Debug, Clone)]
pub struct DrafterChannels {
    security: Security,
    /// The name drafters' certificates carry (TLS).
    server_name: Option<String>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl DrafterChannels {
    pub fn new(security: Security, server_name: Option<String>) -> DrafterChannels {
        DrafterChannels {
            security,
            server_name,
            channels: Arc::default(),
        }
    }

    fn get(&self, endpoint: &str, connect_timeout: Duration) -> Result<Channel, String> {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(endpoint) {
            return Ok(c.clone());
        }
        let dialer = Dialer {
            security: self.security.clone(),
            connect_timeout,
        };
        let channel = dialer
            .channel(endpoint, self.server_name.as_deref())
            .map_err(|e| e.to_string())?;
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
    /// When the last tree arrived (drafting ahead starts about then).
    arrived: Option<Instant>,
}

impl DraftLink {
    /// Opens the stream and sends the session's start.
    pub async fn open(
        channels: &DrafterChannels,
        endpoint: &str,
        start: v1::DraftStart,
        connect_timeout: Duration,
    ) -> Result<DraftLink, LinkLost> {
        let mut link = DraftLink::connect(channels, endpoint, connect_timeout).await?;
        link.start(start).await?;
        Ok(link)
    }

    /// Opens the stream without sending anything: the drafter waits for
    /// the start, which [`DraftLink::start`] sends. A re-attach connects
    /// in the background and sends the start at a step boundary, with the
    /// context committed by then.
    pub async fn connect(
        channels: &DrafterChannels,
        endpoint: &str,
        connect_timeout: Duration,
    ) -> Result<DraftLink, LinkLost> {
        let channel = channels.get(endpoint, connect_timeout).map_err(LinkLost)?;
        let (tx, rx) = mpsc::channel(4);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        specmesh_server::telemetry::inject(&mut request);
        let mut client = DrafterClient::new(channel).max_decoding_message_size(MAX_TREE_BYTES);
        let open = client.draft(request);
        let response = tokio::time::timeout(connect_timeout, open)
            .await
            .map_err(|_| {
                LinkLost(format!(
                    "no answer from {endpoint} within {connect_timeout:?}"
                ))
            })?
            .map_err(|s| LinkLost(format!("{endpoint}: {}: {}", s.code(), s.message())))?;
        Ok(DraftLink {
            tx,
            rx: response.into_inner(),
            early: None,
            arrived: None,
        })
    }

    /// Sends the session's start: the first message of the stream.
    pub async fn start(&mut self, start: v1::DraftStart) -> Result<(), LinkLost> {
        self.tx
            .send(v1::DraftRequest {
                kind: Some(v1::draft_request::Kind::Start(start)),
            })
            .await
            .map_err(|_| LinkLost("closed before start".into()))
    }

    /// The tree for (`epoch`, `step`), waiting at most `wait`: one for that
    /// step, or a span that started earlier and covers it. Trees of other
    /// epochs or for earlier steps only are late or duplicated: dropped.
    /// [`Answer::Late`]: no tree in time (verify the root alone). The tree
    /// is read within `limits` (see `validate::drafted`). Every tree that
    /// arrives logs its drafting into `drafting`, stale ones too: their
    /// drafting ran on some cores all the same.
    pub async fn tree_for(
        &mut self,
        epoch: u64,
        step: u64,
        wait: Duration,
        limits: TreeLimits,
        drafting: &DraftingLog,
    ) -> Answer {
        if let Some(t) = self.early.take() {
            if t.step > step {
                self.early = Some(t);
                return Answer::Late;
            }
            if covered_through(&t) >= step {
                return validate::drafted(t, limits);
            }
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let next = tokio::time::timeout_at(deadline, self.rx.message()).await;
            let tree = match next {
                Err(_) => return Answer::Late,
                // The drafter cannot draft as the request asked (no draft
                // model, or one of another vocabulary): the caller's to fix.
                Ok(Err(s)) if s.code() == tonic::Code::FailedPrecondition => {
                    return Answer::Refused(s.message().to_owned());
                }
                Ok(Err(s)) => return Answer::Lost(format!("{}: {}", s.code(), s.message())),
                Ok(Ok(None)) => return Answer::Lost("the drafter closed the stream".into()),
                Ok(Ok(Some(t))) => t,
            };
            let now = Instant::now();
            drafting.record(
                now,
                self.arrived.replace(now),
                Duration::from_micros(tree.draft_micros.into()),
                Duration::from_micros(tree.ahead_micros.into()),
            );
            if tree.epoch != epoch || covered_through(&tree) < step {
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
                return Answer::Late;
            }
            return validate::drafted(tree, limits);
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
fn covered_through(tree: &v1::TokenTree) -> u64 {
    if tree.nodes.is_empty() {
        last_step(tree.step, tree.span)
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
        assert_eq!(covered_through(&tree), 5);
        tree.span = 1;
        assert_eq!(covered_through(&tree), 5);
        tree.span = 4;
        assert_eq!(covered_through(&tree), 8);
        tree.nodes.push(v1::TreeNode::default());
        assert_eq!(covered_through(&tree), 5);
        let far = v1::TokenTree {
            step: u64::MAX - 1,
            span: 9,
            ..Default::default()
        };
        assert_eq!(covered_through(&far), u64::MAX);
    }
}
