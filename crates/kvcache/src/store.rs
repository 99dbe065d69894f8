//! The block store: KV blocks by chained hash, one byte budget shared with
//! the reservations of running sequences, least recently used leaves
//! evicted first.
//!
//! Only leaves (blocks no cached block extends) are evicted, so a chain
//! always loses its tail first: a long conversation that has gone cold
//! keeps its beginning (often a system prompt others share) longest. A hit
//! touches its whole chain, root to tail, so the tail is its chain's most
//! recent block and its parent becomes the next candidate only after it.
//!
//! Memory is counted by the blocks alive — tokens held, not capacity —
//! including blocks already evicted but still being copied into a
//! sequence (their `Arc` keeps them, and their count, until the copy ends).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::hash::{BlockHash, Scope};

/// One block's KV, in the layout its model exports (opaque here).
#[derive(Debug)]
pub struct KvBlock {
    data: Box<[u8]>,
    held: Arc<AtomicU64>,
    bytes: u64,
}

impl KvBlock {
    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for KvBlock {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Not enough room even after evicting every cached block.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error(
    "the KV cache budget is exhausted: the session needs {need_mib:.1} MiB, {free_mib:.1} MiB of {budget_mib:.1} MiB are free; retry later or shorten the request"
)]
pub struct Exhausted {
    pub need_mib: f64,
    pub free_mib: f64,
    pub budget_mib: f64,
}

/// What the store holds and has done, for stats and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreUsage {
    pub budget: u64,
    /// Bytes reserved by running sequences.
    pub reserved: u64,
    /// Bytes of cached blocks alive (including evicted ones still copied).
    pub cached: u64,
    pub blocks: usize,
    pub block_tokens: usize,
    /// Prompt tokens looked up since start.
    pub queried_tokens: u64,
    /// Of those, tokens whose KV was found.
    pub hit_tokens: u64,
    pub inserted_blocks: u64,
    pub evicted_blocks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parent {
    /// The first block of a chain: its scope's seed.
    Seed(u64),
    Block(BlockHash),
}

#[derive(Debug)]
struct Entry {
    parent: Parent,
    tokens: Box<[u32]>,
    kv: Arc<KvBlock>,
    /// Cached blocks whose parent this is; 0 = a leaf, evictable.
    children: u32,
    tick: u64,
}

/// The cached blocks of every scope, and the reservations beside them.
#[derive(Debug)]
pub struct Store {
    budget: u64,
    reserved: u64,
    held: Arc<AtomicU64>,
    block_tokens: usize,
    block_bytes: u64,
    blocks: HashMap<BlockHash, Entry>,
    /// Leaves by last use: the eviction order.
    leaves: BTreeSet<(u64, BlockHash)>,
    tick: u64,
    queried: u64,
    hits: u64,
    inserted: u64,
    evicted: u64,
    /// Blocks stored and removed since [`Store::take_events`] last ran,
    /// in order: what the store publishes to routers.
    events: Vec<BlockEvent>,
}

/// A change of what the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockEvent {
    Stored(BlockHash),
    Removed(BlockHash),
}

const MIB: f64 = 1024.0 * 1024.0;

impl Store {
    /// A store of `budget` bytes for blocks of `block_tokens` tokens of
    /// `block_bytes` bytes each.
    pub fn new(budget: u64, block_tokens: usize, block_bytes: u64) -> Store {
        assert!(block_tokens > 0, "a block holds at least one token");
        Store {
            budget,
            reserved: 0,
            held: Arc::new(AtomicU64::new(0)),
            block_tokens,
            block_bytes,
            blocks: HashMap::new(),
            leaves: BTreeSet::new(),
            tick: 0,
            queried: 0,
            hits: 0,
            inserted: 0,
            evicted: 0,
            events: Vec::new(),
        }
    }

    /// The changes since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<BlockEvent> {
        std::mem::take(&mut self.events)
    }

    /// Every block held now (a subscriber's starting point: later
    /// changes come from [`Store::take_events`]).
    pub fn hashes(&self) -> Vec<BlockHash> {
        self.blocks.keys().copied().collect()
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Reserves `bytes` for a running sequence, evicting cached blocks if
    /// needed.
    pub fn reserve(&mut self, bytes: u64) -> Result<(), Exhausted> {
        if !self.make_room(bytes) {
            return Err(Exhausted {
                need_mib: bytes as f64 / MIB,
                free_mib: self.budget.saturating_sub(self.reserved) as f64 / MIB,
                budget_mib: self.budget as f64 / MIB,
            });
        }
        self.reserved += bytes;
        Ok(())
    }

    /// Returns a reservation.
    pub fn release(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_sub(bytes);
    }

    /// The cached blocks continuing `tokens`'s prefix from block `from`
    /// (whose earlier blocks the caller already has), as long as they run
    /// on; touches each. `hashes` are `block_hashes(scope, tokens, ..)`.
    pub fn lookup(
        &mut self,
        scope: Scope,
        hashes: &[BlockHash],
        tokens: &[u32],
        from: usize,
    ) -> Vec<Arc<KvBlock>> {
        let mut found = Vec::new();
        for i in from..hashes.len() {
            if !self.matches(scope, hashes, tokens, i) {
                break;
            }
            self.touch(hashes[i]);
            found.push(Arc::clone(&self.blocks[&hashes[i]].kv));
        }
        found
    }

    /// How many leading blocks of `tokens` are cached (touches nothing).
    pub fn cached_run(&self, scope: Scope, hashes: &[BlockHash], tokens: &[u32]) -> usize {
        (0..hashes.len())
            .take_while(|&i| self.matches(scope, hashes, tokens, i))
            .count()
    }

    /// Whether block `i` of `tokens` is cached (touches nothing).
    pub fn has(&self, scope: Scope, hashes: &[BlockHash], tokens: &[u32], i: usize) -> bool {
        self.matches(scope, hashes, tokens, i)
    }

    /// Counts a lookup of `queried` prompt tokens of which `hit` were found.
    pub fn record_query(&mut self, queried: usize, hit: usize) {
        self.queried += queried as u64;
        self.hits += hit as u64;
    }

    /// Caches block `i` of `tokens` with its KV `data`; its parent must be
    /// cached. Returns whether the block is cached now (it may have been
    /// already: then `data` may be empty; it is not when its parent is
    /// gone or no room is left).
    pub fn insert(
        &mut self,
        scope: Scope,
        hashes: &[BlockHash],
        tokens: &[u32],
        i: usize,
        data: Vec<u8>,
    ) -> bool {
        let Some(&hash) = hashes.get(i) else {
            return false;
        };
        let b = self.block_tokens;
        if tokens.len() < (i + 1) * b {
            return false;
        }
        if self.matches(scope, hashes, tokens, i) {
            self.touch(hash);
            return true;
        }
        // No KV (the caller found the block cached, and it was evicted
        // since): nothing to store.
        if data.is_empty() {
            return false;
        }
        if self.blocks.contains_key(&hash) {
            // A different prefix under the same hash (a 64-bit collision):
            // the cached one stays.
            return false;
        }
        let parent = if i == 0 {
            Parent::Seed(scope.seed())
        } else {
            if !self.matches(scope, hashes, tokens, i - 1) {
                return false;
            }
            Parent::Block(hashes[i - 1])
        };
        // The parent counts its child before room is made, so it is not a
        // leaf meanwhile and cannot be evicted to make that room.
        if let Parent::Block(p) = parent {
            let e = self.blocks.get_mut(&p).expect("a matched parent");
            if e.children == 0 {
                self.leaves.remove(&(e.tick, p));
            }
            e.children += 1;
        }
        if !self.make_room(self.block_bytes) {
            if let Parent::Block(p) = parent {
                let e = self.blocks.get_mut(&p).expect("a pinned parent");
                e.children -= 1;
                if e.children == 0 {
                    self.leaves.insert((e.tick, p));
                }
            }
            return false;
        }
        self.held.fetch_add(self.block_bytes, Ordering::Relaxed);
        let kv = Arc::new(KvBlock {
            data: data.into_boxed_slice(),
            held: Arc::clone(&self.held),
            bytes: self.block_bytes,
        });
        self.tick += 1;
        self.blocks.insert(
            hash,
            Entry {
                parent,
                tokens: tokens[i * b..(i + 1) * b].into(),
                kv,
                children: 0,
                tick: self.tick,
            },
        );
        self.leaves.insert((self.tick, hash));
        self.inserted += 1;
        self.events.push(BlockEvent::Stored(hash));
        true
    }

    pub fn usage(&self) -> StoreUsage {
        StoreUsage {
            budget: self.budget,
            reserved: self.reserved,
            cached: self.held.load(Ordering::Relaxed),
            blocks: self.blocks.len(),
            block_tokens: self.block_tokens,
            queried_tokens: self.queried,
            hit_tokens: self.hits,
            inserted_blocks: self.inserted,
            evicted_blocks: self.evicted,
        }
    }

    /// Whether block `i` of `tokens` is cached: same hash, same parent,
    /// same tokens.
    fn matches(&self, scope: Scope, hashes: &[BlockHash], tokens: &[u32], i: usize) -> bool {
        let b = self.block_tokens;
        let Some(e) = hashes.get(i).and_then(|h| self.blocks.get(h)) else {
            return false;
        };
        let parent = if i == 0 {
            Parent::Seed(scope.seed())
        } else {
            Parent::Block(hashes[i - 1])
        };
        e.parent == parent && tokens.get(i * b..(i + 1) * b) == Some(&e.tokens[..])
    }

    fn touch(&mut self, hash: BlockHash) {
        self.tick += 1;
        let e = self.blocks.get_mut(&hash).expect("a cached block");
        if e.children == 0 {
            self.leaves.remove(&(e.tick, hash));
            self.leaves.insert((self.tick, hash));
        }
        e.tick = self.tick;
    }

    /// Evicts least recently used leaves until `extra` more bytes fit.
    /// Evicts nothing when they cannot fit even with every block gone
    /// that eviction would free (blocks still being copied stay alive):
    /// a refused request must not empty the cache for everyone else.
    fn make_room(&mut self, extra: u64) -> bool {
        let fits = |s: &Store| s.reserved + s.held.load(Ordering::Relaxed) + extra <= s.budget;
        if fits(self) {
            return true;
        }
        let freeable: u64 = self
            .blocks
            .values()
            .filter(|e| Arc::strong_count(&e.kv) == 1)
            .map(|e| e.kv.bytes)
            .sum();
        let held = self.held.load(Ordering::Relaxed);
        if self.reserved + (held - freeable.min(held)) + extra > self.budget {
            return false;
        }
        while !fits(self) {
            let Some((_, hash)) = self.leaves.pop_first() else {
                return false;
            };
            let e = self.blocks.remove(&hash).expect("a leaf is cached");
            self.evicted += 1;
            self.events.push(BlockEvent::Removed(hash));
            if let Parent::Block(p) = e.parent
                && let Some(pe) = self.blocks.get_mut(&p)
            {
                pe.children -= 1;
                if pe.children == 0 {
                    self.leaves.insert((pe.tick, p));
                }
            }
        }
        true
    }

    /// Checks the store's invariants (tests).
    #[doc(hidden)]
    pub fn check(&self) {
        let mut children: HashMap<BlockHash, u32> = HashMap::new();
        for e in self.blocks.values() {
            if let Parent::Block(p) = e.parent {
                assert!(self.blocks.contains_key(&p), "an orphan block");
                *children.entry(p).or_default() += 1;
            }
        }
        for (h, e) in &self.blocks {
            assert_eq!(e.children, children.get(h).copied().unwrap_or(0));
            assert_eq!(e.children == 0, self.leaves.contains(&(e.tick, *h)));
        }
        assert_eq!(
            self.leaves.len(),
            self.blocks.values().filter(|e| e.children == 0).count()
        );
    }
}

#[cfg(test)]
mod tests;
