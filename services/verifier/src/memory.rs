//! KV memory: one byte budget shared by running sessions (reserved up front
//! for their whole length) and the prefix cache (blocks of committed KV,
//! found by their tokens within a tenant: [`specmesh_kvcache`]).
//!
//! A session looks its context up when its prefill starts, and again before
//! each chunk (another session may have published the blocks meanwhile);
//! its prefill publishes each block as it completes, and its end publishes
//! what it decoded. Only committed KV is published: a session's staged
//! tree nodes sit above its committed length and are never exported.

use specmesh_engine::Session;
use specmesh_kvcache::{
    BLOCK_TOKENS, BlockHash, Exhausted, Scope, Store, StoreUsage, block_hashes,
};
use specmesh_kvevents::SharedStore;

use crate::validate::ValidRun;

/// The verifier's KV memory; cheap to clone.
#[derive(Debug, Clone)]
pub struct KvMemory {
    /// Published to the gateways (`KvEvents`).
    store: SharedStore,
    /// `--prefix-cache`: share prefixes within a tenant (and salt);
    /// without it only a session's own earlier turns (its `cache_key`).
    prefix_cache: bool,
}

/// Bytes held for a running session; released on drop.
#[derive(Debug)]
pub struct Reservation {
    store: SharedStore,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.store.lock().release(self.bytes);
    }
}

/// Where a session's prefix is found and published: its scope and the
/// hashes of its context's full blocks (all but the last token, the first
/// tree's root).
#[derive(Debug, Clone)]
pub struct PrefixKey {
    scope: Scope,
    hashes: Vec<BlockHash>,
    /// Blocks of the session published (or found) so far.
    published: usize,
    /// Whether the session's KV is published at all (not a last turn's
    /// with the prefix cache off: it only reads its session's blocks).
    publish: bool,
}

impl KvMemory {
    pub fn new(budget: u64, bytes_per_token: u64, prefix_cache: bool) -> KvMemory {
        let block_bytes = bytes_per_token * BLOCK_TOKENS as u64;
        KvMemory {
            store: SharedStore::new(Store::new(budget, BLOCK_TOKENS, block_bytes), block_bytes),
            prefix_cache,
        }
    }

    /// The store, as `KvEvents` publishes it.
    pub fn shared(&self) -> &SharedStore {
        &self.store
    }

    /// Whether prefixes are shared within a tenant (`--prefix-cache`).
    pub fn prefix_cache(&self) -> bool {
        self.prefix_cache
    }

    /// Reserves `bytes`, evicting cached blocks (least recently used
    /// leaves first) if needed.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, Exhausted> {
        self.store.lock().reserve(bytes)?;
        Ok(Reservation {
            store: self.store.clone(),
            bytes,
        })
    }

    /// The prefix key of `run`, or `None` when nothing of it may be cached
    /// (the prefix cache off and no `cache_key`). Touches its cached
    /// prefix, so that the room its admission makes does not evict it.
    pub fn key(&self, run: &ValidRun) -> Option<PrefixKey> {
        let key = run.cache_key.as_ref().map(|k| k.key.as_str());
        let mut prefix = self.key_of(&run.tenant, &run.cache_salt, key, &run.tokens)?;
        prefix.publish = self.prefix_cache || run.keep_cache;
        Some(prefix)
    }

    /// [`KvMemory::key`] of a context of `tokens` by `tenant`, with its
    /// `salt` and session key.
    pub fn key_of(
        &self,
        tenant: &str,
        salt: &str,
        session_key: Option<&str>,
        tokens: &[u32],
    ) -> Option<PrefixKey> {
        let scope = if self.prefix_cache {
            Scope::new(tenant, salt, None)
        } else {
            Scope::new(tenant, salt, Some(session_key?))
        };
        let context = &tokens[..tokens.len().saturating_sub(1)];
        let hashes = block_hashes(scope, context, BLOCK_TOKENS);
        drop(self.store.lock().lookup(scope, &hashes, context, 0));
        Some(PrefixKey {
            scope,
            hashes,
            published: 0,
            publish: true,
        })
    }

    /// Copies the cached KV continuing `session`'s prefill into it; returns
    /// the tokens taken. Only from a block boundary.
    pub fn import(&self, key: &mut PrefixKey, session: &mut Session) -> usize {
        let done = session.prefilled();
        if !done.is_multiple_of(BLOCK_TOKENS) {
            return 0;
        }
        let from = done / BLOCK_TOKENS;
        let blocks = self
            .store
            .lock()
            .lookup(key.scope, &key.hashes, session.tokens(), from);
        let mut taken = 0;
        for block in &blocks {
            match session.import_kv(block.data()) {
                Ok(n) => taken += n,
                Err(e) => {
                    tracing::warn!(error = %e, "a cached prefix block does not fit: prefilling it");
                    break;
                }
            }
        }
        key.published = key.published.max(session.prefilled() / BLOCK_TOKENS);
        taken
    }

    /// Publishes the complete blocks `session` prefilled since the last
    /// call (while its prefill runs).
    pub fn publish_prefill(&self, key: &mut PrefixKey, session: &Session) {
        let upto = (session.prefilled() / BLOCK_TOKENS).min(key.hashes.len());
        if key.publish && upto > key.published {
            key.published = self.publish(key.scope, &key.hashes, session, key.published, upto);
        }
    }

    /// Publishes every complete block of `session`'s committed context
    /// (its end: the prompt and what it decoded), touching those cached.
    pub fn publish_all(&self, key: &PrefixKey, session: &Session) {
        if !key.publish {
            return;
        }
        let committed = &session.tokens()[..session.prefilled()];
        let hashes = block_hashes(key.scope, committed, BLOCK_TOKENS);
        self.publish(key.scope, &hashes, session, 0, hashes.len());
    }

    /// Caches blocks `from..upto` of `session`; returns the end of the run
    /// cached from `from` (`upto` unless room or a parent ran out).
    fn publish(
        &self,
        scope: Scope,
        hashes: &[BlockHash],
        session: &Session,
        from: usize,
        upto: usize,
    ) -> usize {
        self.store
            .publish(scope, hashes, session.tokens(), (from, upto), |i| {
                session
                    .export_kv(i * BLOCK_TOKENS, BLOCK_TOKENS)
                    .map_err(|e| tracing::warn!(error = %e, "exporting a block: not cached"))
                    .ok()
            })
    }

    /// Counts a prefill of `queried` context tokens of which `hit` came
    /// from the cache.
    pub fn record_query(&self, queried: usize, hit: usize) {
        self.store.lock().record_query(queried, hit);
    }

    pub fn usage(&self) -> StoreUsage {
        self.store.usage()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_released() {
        let m = KvMemory::new(100, 1, true);
        let a = m.reserve(60).unwrap();
        let err = m.reserve(50).unwrap_err();
        assert!(err.to_string().contains("budget is exhausted"), "{err}");
        drop(a);
        let _b = m.reserve(100).unwrap();
        assert_eq!(m.usage().reserved, 100);
    }
}
