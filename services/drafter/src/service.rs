//! The `specmesh.v1.Drafter` gRPC service: admits a draft stream (or
//! refuses it with RESOURCE_EXHAUSTED when every session slot is taken)
//! and hands it to its own task, [`crate::stream`].
//!
//! Answering the call right away, before the `start` arrives, lets the
//! verifier's `open` return as soon as the stream exists; everything the
//! session does afterwards, errors included, travels on the stream.

use std::sync::Arc;
use std::time::Duration;

use specmesh_proto::v1;
use specmesh_proto::v1::drafter_server::Drafter;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::drafters::DrafterSet;
use crate::error::SessionError;
use crate::stats::Stats;
use crate::stream::DraftStream;

/// Trees buffered per stream ahead of the verifier reading them. One tree
/// is sent per outcome, so a few are plenty; a full buffer holds the
/// session back instead of growing.
const OUTBOUND_TREES: usize = 4;

/// What every stream of the process shares.
#[derive(Debug)]
pub struct Shared {
    pub drafters: DrafterSet,
    pub stats: Arc<Stats>,
    /// One permit per open stream.
    pub slots: Arc<Semaphore>,
    pub max_sessions: usize,
    pub max_context: usize,
    /// Pipelined "nothing drafted" trees.
    pub pipeline: bool,
    /// How long a new stream may take to send its `start`.
    pub start_timeout: Duration,
    /// Becomes `true` when the shutdown grace period is over: open streams
    /// end with UNAVAILABLE.
    pub stop: watch::Receiver<bool>,
}

/// The gRPC service; clones share one [`Shared`].
#[derive(Debug, Clone)]
pub struct DraftService {
    shared: Arc<Shared>,
}

impl DraftService {
    pub fn new(shared: Arc<Shared>) -> DraftService {
        DraftService { shared }
    }
}

#[tonic::async_trait]
impl Drafter for DraftService {
    type DraftStream = ReceiverStream<Result<v1::TokenTree, Status>>;

    async fn draft(
        &self,
        request: Request<Streaming<v1::DraftRequest>>,
    ) -> Result<Response<Self::DraftStream>, Status> {
        let span = tracing::info_span!(
            "draft_session",
            session_id = tracing::field::Empty,
            epoch = tracing::field::Empty,
            tenant = tracing::field::Empty,
        );
        specmesh_server::telemetry::adopt(&span, &request);
        let Ok(slot) = Arc::clone(&self.shared.slots).try_acquire_owned() else {
            self.shared.stats.session_refused();
            let max = self.shared.max_sessions;
            span.in_scope(|| {
                tracing::warn!(max, "refusing a draft stream: every session slot is taken")
            });
            return Err(SessionError::Busy { max }.into());
        };
        let (tx, rx) = mpsc::channel(OUTBOUND_TREES);
        let stream = DraftStream::new(Arc::clone(&self.shared), request.into_inner(), tx, slot);
        tokio::spawn(stream.run().instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
