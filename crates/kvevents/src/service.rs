//! `specmesh.v1.KvEvents`: a prefix cache's blocks as a stream, for the
//! gateways' prefix-aware placement. A snapshot first, then each change
//! as the store makes it, and the load about once a second; a subscriber
//! that falls behind the backlog gets a new snapshot.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use specmesh_kvcache::BlockEvent;
use specmesh_proto::v1;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::shared::SharedStore;

/// How often the load goes out when nothing else does.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Sessions the server runs now (the load it reports).
pub type RunningCount = Arc<dyn Fn() -> u32 + Send + Sync>;

#[derive(Clone)]
pub struct KvEventsService {
    store: SharedStore,
    running: RunningCount,
    /// This process, as subscribers tell a restarted server apart.
    instance: String,
}

impl std::fmt::Debug for KvEventsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventsService")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl KvEventsService {
    /// Publishes `store`, with `running` as the load.
    pub fn new(store: SharedStore, running: RunningCount) -> KvEventsService {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        KvEventsService {
            store,
            running,
            instance: format!("{:016x}", nanos ^ (u64::from(std::process::id()) << 40)),
        }
    }

    fn batch(&self, snapshot: bool, stored: Vec<u64>, removed: Vec<u64>) -> v1::KvEventBatch {
        let usage = self.store.usage();
        let block = self.store.block_bytes().max(1);
        v1::KvEventBatch {
            instance: self.instance.clone(),
            block_tokens: usage.block_tokens as u32,
            snapshot,
            stored,
            removed,
            load: Some(v1::KvLoad {
                running: (self.running)(),
                reserved_blocks: usage.reserved.div_ceil(block),
                free_blocks: usage.budget.saturating_sub(usage.reserved + usage.cached) / block,
                cached_blocks: usage.blocks as u64,
            }),
        }
    }

    /// Feeds one subscriber until it goes away.
    async fn feed(self, tx: mpsc::Sender<Result<v1::KvEventBatch, Status>>) {
        loop {
            let (held, mut changes) = self.store.subscribe();
            if tx
                .send(Ok(self.batch(true, held, Vec::new())))
                .await
                .is_err()
            {
                return;
            }
            let mut heartbeat = tokio::time::interval(HEARTBEAT);
            heartbeat.tick().await;
            loop {
                let batch = tokio::select! {
                    change = changes.recv() => match change {
                        Ok(events) => {
                            let (stored, removed) = net(&events);
                            self.batch(false, stored, removed)
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::info!(missed = n, "a KV event subscriber fell behind: sending a snapshot");
                            break;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = heartbeat.tick() => self.batch(false, Vec::new(), Vec::new()),
                    () = tx.closed() => return,
                };
                if tx.send(Ok(batch)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The blocks a batch of events leaves stored and removed: a block stored
/// then removed is removed; removed then stored (evicted, computed again)
/// is stored.
fn net(events: &[BlockEvent]) -> (Vec<u64>, Vec<u64>) {
    let last: HashMap<u64, bool> = events
        .iter()
        .map(|e| match *e {
            BlockEvent::Stored(h) => (h, true),
            BlockEvent::Removed(h) => (h, false),
        })
        .collect();
    let (mut stored, mut removed) = (Vec::new(), Vec::new());
    for e in events {
        match *e {
            // (A hash may repeat: the index's set takes it once.)
            BlockEvent::Stored(h) if last[&h] => stored.push(h),
            BlockEvent::Removed(h) if !last[&h] => removed.push(h),
            _ => {}
        }
    }
    (stored, removed)
}

type BatchStream = Pin<Box<dyn Stream<Item = Result<v1::KvEventBatch, Status>> + Send>>;

#[tonic::async_trait]
impl v1::kv_events_server::KvEvents for KvEventsService {
    type SubscribeStream = BatchStream;

    async fn subscribe(
        &self,
        _request: Request<v1::KvSubscribeRequest>,
    ) -> Result<Response<BatchStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(self.clone().feed(tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_keeps_each_blocks_last_change() {
        use BlockEvent::{Removed, Stored};
        let (stored, removed) = net(&[Stored(1), Removed(1), Removed(2), Stored(2), Stored(3)]);
        assert_eq!(stored, vec![2, 3]);
        assert_eq!(removed, vec![1]);
    }
}
