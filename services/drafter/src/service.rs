//! The `specmesh.v1.Drafter` gRPC service: admits a draft stream (or
//! refuses it with RESOURCE_EXHAUSTED when every session slot is taken)
//! and hands it to its own task, [`crate::stream`].
//!
//! Answering the call right away, before the `start` arrives, lets the
//! verifier's `open` return as soon as the stream exists; everything the
//! session does afterwards, errors included, travels on the stream.

use std::sync::Arc;

use specmesh_proto::v1;
use specmesh_proto::v1::drafter_server::Drafter;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::state::State;
use crate::stream::DraftStream;

/// Trees buffered per stream ahead of the verifier reading them. One tree
/// is sent per outcome, so a few are plenty; a full buffer holds the
/// session back instead of growing.
const OUTBOUND_TREES: usize = 4;

/// The gRPC service; clones share one [`State`].
#[derive(Debug, Clone)]
pub struct DraftService {
    state: Arc<State>,
}

impl DraftService {
    pub fn new(state: Arc<State>) -> DraftService {
        DraftService { state }
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
            draft_cached_tokens = tracing::field::Empty,
        );
        specmesh_server::telemetry::adopt(&span, &request);
        let slot = self.state.admit().inspect_err(|_| {
            let max = self.state.max_sessions;
            span.in_scope(|| {
                tracing::warn!(max, "refusing a draft stream: every session slot is taken")
            });
        })?;
        let (tx, rx) = mpsc::channel(OUTBOUND_TREES);
        let stream = DraftStream::new(Arc::clone(&self.state), request.into_inner(), tx, slot);
        tokio::spawn(stream.run().instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
