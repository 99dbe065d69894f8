//! The gateway's subscription to each verifier's and drafter's KV events
//! (`specmesh.v1.KvEvents/Subscribe`), feeding [`crate::kv_index`] (one
//! index per role). Like the health watch ([`crate::health`]): one task
//! per member, retried with back-off; a broken stream drops the member's
//! entries at once, so placement never counts on a cache that may be gone
//! (a member that restarts comes back with a snapshot of its new, empty
//! cache).

use std::sync::Arc;
use std::time::Duration;

use specmesh_proto::v1;
use specmesh_proto::v1::kv_events_client::KvEventsClient;
use specmesh_server::backoff::Backoff;
use tonic::Code;
use tonic::transport::Channel;

use crate::health::Role;
use crate::kv_index::KvIndex;

const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(4);
/// A member sends its load every second: this long without a batch
/// means the stream is dead (a partition sends no reset).
const SILENCE: Duration = Duration::from_secs(5);
/// How long before asking a member without KV events again (it may be
/// upgraded in place).
const UNIMPLEMENTED_RETRY: Duration = Duration::from_secs(60);
/// A snapshot is 8 bytes per cached block: 64 MiB is 8 million blocks.
const MAX_BATCH_BYTES: usize = 64 << 20;

/// Watches the `role` member at `endpoint` for as long as the gateway
/// runs (the task is aborted when the member leaves).
pub async fn watch(role: Role, endpoint: String, channel: Channel, index: Arc<KvIndex>) {
    let mut client = KvEventsClient::new(channel).max_decoding_message_size(MAX_BATCH_BYTES);
    let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        match client.subscribe(v1::KvSubscribeRequest {}).await {
            Ok(response) => {
                let mut batches = response.into_inner();
                while let Ok(Ok(Some(batch))) =
                    tokio::time::timeout(SILENCE, batches.message()).await
                {
                    index.apply(&endpoint, &batch);
                    retry.reset();
                }
                index.forget(&endpoint);
            }
            Err(status) if status.code() == Code::Unimplemented => {
                tracing::warn!(
                    role = role.name(),
                    endpoint,
                    "the member publishes no KV events (an older release): placing on it \
                     without knowing its prefix cache"
                );
                index.forget(&endpoint);
                tokio::time::sleep(UNIMPLEMENTED_RETRY).await;
                continue;
            }
            Err(_) => index.forget(&endpoint),
        }
        tokio::time::sleep(retry.next_wait()).await;
    }
}
