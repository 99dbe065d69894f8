//! The store behind one lock, with its changes broadcast as they happen.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use specmesh_kvcache::{BlockEvent, BlockHash, Store, StoreUsage};
use tokio::sync::broadcast;

/// Batches of changes a slow subscriber may fall behind by before it is
/// sent a new snapshot instead.
const EVENT_BACKLOG: usize = 1024;

/// Changes of what the store holds, in order.
pub type Events = Arc<Vec<BlockEvent>>;

/// A [`Store`] shared by a server's sessions; cheap to clone.
#[derive(Debug, Clone)]
pub struct SharedStore {
    store: Arc<Mutex<Store>>,
    /// Every change, sent under the store's lock (so a snapshot and a
    /// subscription taken together miss nothing and repeat nothing).
    events: broadcast::Sender<Events>,
    block_bytes: u64,
}

/// The store, locked; its changes go out when the lock is let go.
#[derive(Debug)]
pub struct Locked<'a> {
    store: MutexGuard<'a, Store>,
    events: &'a broadcast::Sender<Events>,
}

impl Deref for Locked<'_> {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Store {
        &mut self.store
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let events = self.store.take_events();
        if !events.is_empty() {
            // No subscriber is no error.
            let _ = self.events.send(Arc::new(events));
        }
    }
}

impl SharedStore {
    /// Shares `store`, whose blocks are `block_bytes` each.
    pub fn new(store: Store, block_bytes: u64) -> SharedStore {
        SharedStore {
            store: Arc::new(Mutex::new(store)),
            events: broadcast::channel(EVENT_BACKLOG).0,
            block_bytes,
        }
    }

    /// The store, until the guard drops (then its changes are sent). A
    /// poisoned lock still holds a consistent store: every method of
    /// [`Store`] leaves it whole before it can panic.
    pub fn lock(&self) -> Locked<'_> {
        Locked {
            store: self.store.lock().unwrap_or_else(|e| e.into_inner()),
            events: &self.events,
        }
    }

    /// Every block held now, and the changes from then on.
    pub fn subscribe(&self) -> (Vec<BlockHash>, broadcast::Receiver<Events>) {
        let store = self.lock();
        (store.hashes(), self.events.subscribe())
    }

    /// Bytes of one block's KV.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    pub fn usage(&self) -> StoreUsage {
        self.lock().usage()
    }
}

#[cfg(test)]
mod tests {
    use specmesh_kvcache::{Scope, block_hashes};

    use super::*;

    #[test]
    fn a_subscriber_gets_the_snapshot_then_each_change_once() {
        let shared = SharedStore::new(Store::new(1 << 20, 2, 8), 8);
        let scope = Scope::new("t", "", None);
        let tokens = [1, 2, 3, 4];
        let hashes = block_hashes(scope, &tokens, 2);
        assert!(
            shared
                .lock()
                .insert(scope, &hashes, &tokens, 0, vec![0.0; 2])
        );
        let (held, mut changes) = shared.subscribe();
        assert_eq!(held, vec![hashes[0]]);
        assert!(
            shared
                .lock()
                .insert(scope, &hashes, &tokens, 1, vec![0.0; 2])
        );
        let batch = changes.try_recv().unwrap();
        assert_eq!(*batch, vec![BlockEvent::Stored(hashes[1])]);
        assert!(changes.try_recv().is_err(), "one batch per change");
        assert_eq!(shared.usage().blocks, 2);
    }
}
