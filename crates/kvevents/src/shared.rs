//! The store behind one lock, with its changes broadcast as they happen.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use specmesh_kvcache::{BlockEvent, BlockHash, Scope, Store, StoreUsage};
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

    /// Caches blocks `from..upto` of `tokens` (`hashes` are theirs, in
    /// `scope`), their KV from `export(i)` for each block `i` not cached
    /// yet; returns the end of the run cached from `from` (`upto` unless
    /// room, a parent or an export ran out). The exports run without the
    /// lock, which every lookup and prefill chunk takes.
    pub fn publish(
        &self,
        scope: Scope,
        hashes: &[BlockHash],
        tokens: &[u32],
        (from, upto): (usize, usize),
        mut export: impl FnMut(usize) -> Option<Vec<u8>>,
    ) -> usize {
        let missing: Vec<usize> = {
            let store = self.lock();
            (from..upto)
                .filter(|&i| !store.has(scope, hashes, tokens, i))
                .collect()
        };
        let mut exported = Vec::with_capacity(missing.len());
        for i in missing {
            match export(i) {
                Some(d) => exported.push((i, d)),
                None => break,
            }
        }
        let mut exported = exported.into_iter().peekable();
        let mut store = self.lock();
        let mut end = from;
        for i in from..upto {
            let data = match exported.peek() {
                Some(&(j, _)) if j == i => exported.next().map(|(_, d)| d).unwrap_or_default(),
                // Cached when looked at (an empty block is never stored:
                // `insert` only touches a block it already has).
                _ => Vec::new(),
            };
            if !store.insert(scope, hashes, tokens, i, data) {
                // No room (everything else is reserved), its parent is
                // gone or it was evicted since: the rest of the chain
                // cannot be cached now.
                break;
            }
            end = i + 1;
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use specmesh_kvcache::block_hashes;

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
                .insert(scope, &hashes, &tokens, 0, vec![0u8; 2])
        );
        let (held, mut changes) = shared.subscribe();
        assert_eq!(held, vec![hashes[0]]);
        assert!(
            shared
                .lock()
                .insert(scope, &hashes, &tokens, 1, vec![0u8; 2])
        );
        let batch = changes.try_recv().unwrap();
        assert_eq!(*batch, vec![BlockEvent::Stored(hashes[1])]);
        assert!(changes.try_recv().is_err(), "one batch per change");
        assert_eq!(shared.usage().blocks, 2);
    }

    #[test]
    fn publishing_exports_only_the_missing_blocks_and_stops_at_a_gap() {
        let shared = SharedStore::new(Store::new(1 << 20, 2, 8), 8);
        let scope = Scope::new("t", "", None);
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
        let hashes = block_hashes(scope, &tokens, 2);
        let mut asked = Vec::new();
        let mut export = |i| {
            asked.push(i);
            Some(vec![0u8; 2])
        };
        assert_eq!(
            shared.publish(scope, &hashes, &tokens, (0, 2), &mut export),
            2
        );
        // Blocks 0 and 1 are cached: only 2 and 3 are exported.
        assert_eq!(
            shared.publish(scope, &hashes, &tokens, (0, 4), &mut export),
            4
        );
        assert_eq!(asked, vec![0, 1, 2, 3]);
        // An export that fails ends the run there.
        let u = Scope::new("u", "", None);
        let other = block_hashes(u, &tokens, 2);
        let end = shared.publish(u, &other, &tokens, (0, 3), |i| {
            (i < 1).then(|| vec![0u8; 2])
        });
        assert_eq!(end, 1);
    }
}
