//! The draft model's KV by prefix (`--draft-kv-budget-mib`): the same
//! chained block hashes and store as the verifiers' prefix cache
//! ([`specmesh_kvcache`]), so that a conversation's later turn does not
//! make the draft model prefill the whole history again.
//!
//! A session looks its context up once, when it starts (the context the
//! verifier sends: prompt and committed output), and imports the longest
//! cached run of blocks into its [`ModelDrafter`] before the first
//! propose; the catch-up the drafter prices its model arm with then
//! counts only the rest. After each propose of the model, the complete
//! blocks it holds of the *committed* context are published: a drafter's
//! cache may also hold a drafted stem the target has not accepted, which
//! is never published. The blocks are in the scope of the tenant and the
//! request's `cache_salt`, as the gateway hashes them, so the gateways'
//! drafter placement can find the drafter holding a conversation
//! (`specmesh.v1.KvEvents` on the drafter's port).
//!
//! Only the store's blocks count against the budget: a running session's
//! own KV is bounded by `--draft-model-sessions` instead.

use crate::validate::CacheScope;
use specmesh_draft_model::ModelDrafter;
use specmesh_kvcache::{BLOCK_TOKENS, BlockHash, Scope, Store, block_hashes, extend_block_hashes};
use specmesh_kvevents::SharedStore;

/// The process's cache of draft model KV; cheap to clone.
#[derive(Debug, Clone)]
pub struct DraftKv {
    store: SharedStore,
}

/// One session's place in the cache: its scope, the hashes of its
/// context's blocks and how many of them are known cached.
#[derive(Debug)]
pub struct SessionPrefix {
    store: SharedStore,
    scope: Scope,
    hashes: Vec<BlockHash>,
    published: usize,
}

impl DraftKv {
    /// A cache of `budget` bytes for a model of `bytes_per_token` bytes of
    /// KV per token.
    pub fn new(budget: u64, bytes_per_token: u64) -> DraftKv {
        let block_bytes = bytes_per_token * BLOCK_TOKENS as u64;
        DraftKv {
            store: SharedStore::new(Store::new(budget, BLOCK_TOKENS, block_bytes), block_bytes),
        }
    }

    /// The store, as `KvEvents` publishes it and metrics read it.
    pub fn shared(&self) -> &SharedStore {
        &self.store
    }

    /// Starts a session in `scope` whose context is `context` (the last
    /// token, the first tree's root, excluded): imports the cached blocks
    /// of its prefix into `drafter`, which must hold nothing yet. Returns
    /// the session's prefix and the tokens imported.
    pub fn seed(
        &self,
        scope: &CacheScope,
        context: &[u32],
        drafter: &mut ModelDrafter,
    ) -> (SessionPrefix, usize) {
        let scope = Scope::new(&scope.tenant, &scope.salt, None);
        let before_root = &context[..context.len().saturating_sub(1)];
        let hashes = block_hashes(scope, before_root, BLOCK_TOKENS);
        let mut taken = 0;
        if drafter.cached_len() == 0 {
            let blocks = self.store.lock().lookup(scope, &hashes, before_root, 0);
            for (i, block) in blocks.iter().enumerate() {
                let tokens = &before_root[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS];
                if let Err(error) = drafter.import_kv(tokens, block.data()) {
                    tracing::warn!(%error, "a cached draft block does not fit: computing it");
                    break;
                }
                taken += BLOCK_TOKENS;
            }
            self.store.lock().record_query(before_root.len(), taken);
        }
        let prefix = SessionPrefix {
            store: self.store.clone(),
            scope,
            hashes,
            published: taken / BLOCK_TOKENS,
        };
        (prefix, taken)
    }
}

impl SessionPrefix {
    /// Caches the complete blocks of `context` (the committed context)
    /// that `drafter` holds and that are not cached yet.
    pub fn publish(&mut self, drafter: &ModelDrafter, context: &[u32]) {
        let held = drafter
            .cached_tokens()
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        let upto = held / BLOCK_TOKENS;
        if upto <= self.published {
            return;
        }
        let tokens = &context[..upto * BLOCK_TOKENS];
        extend_block_hashes(self.scope, &mut self.hashes, tokens, BLOCK_TOKENS);
        let hashes = &self.hashes[..upto];
        self.published =
            self.store
                .publish(self.scope, hashes, tokens, (self.published, upto), |i| {
                    drafter
                        .export_kv(i * BLOCK_TOKENS, BLOCK_TOKENS)
                        .map_err(
                            |e| tracing::warn!(error = %e, "exporting a draft block: not cached"),
                        )
                        .ok()
                });
    }
}
