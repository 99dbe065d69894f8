//! The global suffix index: outputs of finished sessions, shared by the
//! later sessions of the same tenant.
//!
//! SuffixDecoding's big wins come from workloads that repeat themselves
//! across requests (agents re-emitting plans, tool calls, boilerplate), so
//! outputs are kept in one suffix trie per tenant. Three properties matter
//! in production:
//!
//! - **Isolation.** Each tenant has its own trie; a drafter is bound to one
//!   tenant when it is made and can only read that trie, so one tenant's
//!   text can never be drafted into another's session.
//! - **Bounded memory.** Live trie nodes and stored documents are counted
//!   against [`GlobalConfig::max_bytes`] (over all tenants); inserting past
//!   it evicts whole documents, least recently used first, removing exactly
//!   their counts from their tenant's trie. A document is "used" when it is
//!   inserted again: an identical output bumps the stored one's weight
//!   (its counts, capped) instead of being stored twice.
//! - **Cheap reads.** Drafting takes only its tenant's read lock; inserts
//!   serialise on a registry mutex and write-lock only the tenant they touch
//!   (always registry first, then tenant; readers never hold both), so a
//!   large insert stalls neither other tenants nor other inserts' callers
//!   for longer than that tenant's update.
//!
//! The byte count is an estimate of live data (see [`trie::NODE_BYTES`]);
//! a tenant's arena keeps its high-water capacity until the tenant is
//! emptied, when it is released.
//!
//! [`trie::NODE_BYTES`]: super::trie::NODE_BYTES

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::trie::SuffixTrie;
use crate::merged::hashing::{FastMap, mix};

/// Bytes charged per stored document besides its tokens: the record, its
/// map entries and its LRU entry.
const DOC_OVERHEAD: usize = 128;
/// Most times an identical document is counted (so a response repeated
/// thousands of times cannot drown everything else, nor overflow counts).
const MAX_WEIGHT: u32 = 64;

/// Who owns a text. Drafting only ever reads the drafter's own tenant.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantKey(Arc<str>);

impl TenantKey {
    pub fn new(key: &str) -> TenantKey {
        TenantKey(Arc::from(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantKey({:?})", &*self.0)
    }
}

impl From<&str> for TenantKey {
    fn from(key: &str) -> TenantKey {
        TenantKey::new(key)
    }
}

impl From<String> for TenantKey {
    fn from(key: String) -> TenantKey {
        TenantKey(Arc::from(key))
    }
}

/// Bounds of a [`GlobalSuffixIndex`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalConfig {
    /// Memory budget over all tenants, in (estimated) bytes.
    pub max_bytes: usize,
    /// Depth of the tries: longest pattern plus continuation (≥ 2).
    pub max_depth: usize,
    /// Documents are cut to their first this many tokens.
    pub max_doc_tokens: usize,
}

impl Default for GlobalConfig {
    fn default() -> GlobalConfig {
        GlobalConfig {
            max_bytes: 256 << 20,
            max_depth: 24,
            max_doc_tokens: 8192,
        }
    }
}

#[derive(Debug)]
struct Doc {
    tokens: Box<[u32]>,
    weight: u32,
    stamp: u64,
    hash: u64,
}

/// One tenant's documents and their trie.
#[derive(Debug)]
pub(crate) struct TenantIndex {
    pub(crate) trie: SuffixTrie,
    docs: FastMap<u64, Doc>,
    by_hash: FastMap<u64, u64>,
    doc_bytes: usize,
}

impl TenantIndex {
    fn new(max_depth: usize) -> TenantIndex {
        TenantIndex {
            trie: SuffixTrie::new(max_depth),
            docs: FastMap::default(),
            by_hash: FastMap::default(),
            doc_bytes: 0,
        }
    }

    fn bytes(&self) -> usize {
        self.trie.bytes() + self.doc_bytes
    }

    fn remove_doc(&mut self, id: u64) {
        let Some(doc) = self.docs.remove(&id) else {
            return;
        };
        self.trie.remove(&doc.tokens, doc.weight);
        if self.by_hash.get(&doc.hash) == Some(&id) {
            self.by_hash.remove(&doc.hash);
        }
        self.doc_bytes = self
            .doc_bytes
            .saturating_sub(doc.tokens.len() * 4 + DOC_OVERHEAD);
        if self.docs.is_empty() {
            // Give the arena's high-water capacity back.
            *self = TenantIndex::new(self.trie.max_depth());
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    tenants: HashMap<TenantKey, Arc<RwLock<TenantIndex>>>,
    /// Stamp → document, oldest first.
    lru: BTreeMap<u64, (TenantKey, u64)>,
    bytes: usize,
    clock: u64,
}

#[derive(Debug)]
struct Shared {
    cfg: GlobalConfig,
    registry: Mutex<Registry>,
}

/// A handle on the shared index; clones share it. See the module docs.
#[derive(Clone, Debug)]
pub struct GlobalSuffixIndex {
    shared: Arc<Shared>,
}

// A poisoned lock means another thread panicked mid-update; the index holds
// only counts and is never left unsafe to read, so carry on rather than
// spread the panic to every session.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

fn fingerprint(tokens: &[u32]) -> u64 {
    let h = tokens.iter().fold(0x9e37_79b9_7f4a_7c15, |h, &t| mix(h, t));
    mix(h, tokens.len() as u32)
}

impl Default for GlobalSuffixIndex {
    fn default() -> GlobalSuffixIndex {
        GlobalSuffixIndex::new(GlobalConfig::default())
    }
}

impl GlobalSuffixIndex {
    pub fn new(cfg: GlobalConfig) -> GlobalSuffixIndex {
        let cfg = GlobalConfig {
            max_depth: cfg.max_depth.max(2),
            ..cfg
        };
        GlobalSuffixIndex {
            shared: Arc::new(Shared {
                cfg,
                registry: Mutex::new(Registry::default()),
            }),
        }
    }

    pub fn config(&self) -> GlobalConfig {
        self.shared.cfg
    }

    /// Adds a finished output of `tenant` (its first
    /// [`max_doc_tokens`](GlobalConfig::max_doc_tokens) tokens), then evicts
    /// least recently used documents until the index fits its budget — the
    /// new one too, if it alone does not fit. Costs O(tokens × max_depth)
    /// under the tenant's write lock.
    pub fn insert(&self, tenant: &TenantKey, tokens: &[u32]) {
        let tokens = &tokens[..tokens.len().min(self.shared.cfg.max_doc_tokens)];
        if tokens.is_empty() {
            return;
        }
        let hash = fingerprint(tokens);
        let mut reg = lock(&self.shared.registry);
        let reg = &mut *reg;
        let stamp = reg.clock;
        reg.clock += 1;
        let depth = self.shared.cfg.max_depth;
        let shard = reg
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| Arc::new(RwLock::new(TenantIndex::new(depth))))
            .clone();
        let mut guard = write(&shard);
        let before = guard.bytes();
        let t = &mut *guard;
        let same = t
            .by_hash
            .get(&hash)
            .copied()
            .filter(|id| t.docs.get(id).is_some_and(|d| *d.tokens == *tokens));
        let id = match same.and_then(|id| t.docs.get_mut(&id).map(|d| (id, d))) {
            Some((id, doc)) => {
                if doc.weight < MAX_WEIGHT {
                    t.trie.insert(tokens, 1);
                    doc.weight += 1;
                }
                reg.lru.remove(&doc.stamp);
                doc.stamp = stamp;
                id
            }
            None => {
                t.trie.insert(tokens, 1);
                t.docs.insert(
                    stamp,
                    Doc {
                        tokens: tokens.into(),
                        weight: 1,
                        stamp,
                        hash,
                    },
                );
                t.by_hash.entry(hash).or_insert(stamp);
                t.doc_bytes += tokens.len() * 4 + DOC_OVERHEAD;
                stamp
            }
        };
        reg.lru.insert(stamp, (tenant.clone(), id));
        reg.bytes = (reg.bytes + t.bytes()).saturating_sub(before);
        drop(guard);
        drop(shard);
        self.evict(reg);
    }

    fn evict(&self, reg: &mut Registry) {
        while reg.bytes > self.shared.cfg.max_bytes {
            let Some((_, (tenant, id))) = reg.lru.pop_first() else {
                break;
            };
            let Some(shard) = reg.tenants.get(&tenant).cloned() else {
                continue;
            };
            let mut t = write(&shard);
            let before = t.bytes();
            t.remove_doc(id);
            reg.bytes = (reg.bytes + t.bytes()).saturating_sub(before);
        }
        // Forget tenants that hold nothing and that no drafter holds.
        reg.tenants
            .retain(|_, shard| Arc::strong_count(shard) > 1 || !read(shard).docs.is_empty());
    }

    /// Forgets everything `tenant` stored (e.g. on account deletion).
    pub fn remove_tenant(&self, tenant: &TenantKey) {
        let mut reg = lock(&self.shared.registry);
        let reg = &mut *reg;
        let Some(shard) = reg.tenants.get(tenant).cloned() else {
            return;
        };
        let mut t = write(&shard);
        reg.bytes = reg.bytes.saturating_sub(t.bytes());
        *t = TenantIndex::new(self.shared.cfg.max_depth);
        reg.lru.retain(|_, (k, _)| k != tenant);
        drop(t);
        drop(shard);
        self.evict(reg);
    }

    /// Estimated bytes in use (never above `max_bytes` after an insert).
    pub fn bytes(&self) -> usize {
        lock(&self.shared.registry).bytes
    }

    /// Stored documents over all tenants (identical ones count once).
    pub fn documents(&self) -> usize {
        lock(&self.shared.registry).lru.len()
    }

    /// Stored documents of `tenant`.
    pub fn tenant_documents(&self, tenant: &TenantKey) -> usize {
        let reg = lock(&self.shared.registry);
        reg.tenants.get(tenant).map_or(0, |s| read(s).docs.len())
    }

    /// The shard drafters of `tenant` read, created empty if needed.
    pub(crate) fn shard(&self, tenant: &TenantKey) -> Arc<RwLock<TenantIndex>> {
        let mut reg = lock(&self.shared.registry);
        let depth = self.shared.cfg.max_depth;
        reg.tenants
            .entry(tenant.clone())
            .or_insert_with(|| Arc::new(RwLock::new(TenantIndex::new(depth))))
            .clone()
    }
}
