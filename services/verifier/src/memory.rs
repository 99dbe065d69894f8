//! KV memory: a byte budget shared by running sessions (reserved up front
//! for their whole length) and kept sessions (their actual caches), with
//! kept sessions evicted least recently used first when room is needed.
//! Kept sessions are found by tenant and key ([`CacheKey`]), so one tenant
//! never takes another's cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use specmesh_model::Sequence;
use specmesh_proto::CacheKey;

#[derive(Debug)]
struct State {
    budget: u64,
    reserved: u64,
    cached: HashMap<CacheKey, Kept>,
    max_cached: usize,
    /// Kept caches evicted since start.
    evicted: u64,
    /// Context tokens taken from kept caches since start.
    reused: u64,
}

#[derive(Debug)]
struct Kept {
    seq: Sequence,
    tokens: Vec<u32>,
    bytes: u64,
    used: Instant,
}

/// The verifier's KV memory; cheap to clone.
#[derive(Debug, Clone)]
pub struct KvMemory {
    state: Arc<Mutex<State>>,
}

/// Bytes held for a running session; released on drop.
#[derive(Debug)]
pub struct Reservation {
    state: Arc<Mutex<State>>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        s.reserved -= self.bytes;
    }
}

/// Not enough KV memory even after evicting every kept session.
#[derive(Debug, thiserror::Error)]
#[error(
    "the KV cache budget is exhausted: the session needs {need_mib:.1} MiB, {free_mib:.1} MiB of {budget_mib:.1} MiB are free; retry later or shorten the request"
)]
pub struct Exhausted {
    pub need_mib: f64,
    pub free_mib: f64,
    pub budget_mib: f64,
}

/// What `Stats` reports.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub reserved: u64,
    pub cached: u64,
    pub cached_sessions: usize,
    pub budget: u64,
    pub evicted: u64,
    pub reused_tokens: u64,
    /// Context tokens in kept caches.
    pub kept_tokens: u64,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const MIB: f64 = 1024.0 * 1024.0;

impl KvMemory {
    pub fn new(budget: u64, max_cached: usize) -> KvMemory {
        KvMemory {
            state: Arc::new(Mutex::new(State {
                budget,
                reserved: 0,
                cached: HashMap::new(),
                max_cached,
                evicted: 0,
                reused: 0,
            })),
        }
    }

    /// Reserves `bytes`, evicting kept sessions (oldest first) if needed.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, Exhausted> {
        let mut s = lock(&self.state);
        while s.reserved + cached_bytes(&s) + bytes > s.budget {
            if !evict_oldest(&mut s) {
                let free = s.budget.saturating_sub(s.reserved);
                return Err(Exhausted {
                    need_mib: bytes as f64 / MIB,
                    free_mib: free as f64 / MIB,
                    budget_mib: s.budget as f64 / MIB,
                });
            }
        }
        s.reserved += bytes;
        Ok(Reservation {
            state: Arc::clone(&self.state),
            bytes,
        })
    }

    /// Takes the kept cache of `key`, if any.
    pub fn take(&self, key: &CacheKey) -> Option<(Sequence, Vec<u32>)> {
        let mut s = lock(&self.state);
        s.cached.remove(key).map(|k| (k.seq, k.tokens))
    }

    /// Keeps a finished session's cache under `key` (if it fits).
    pub fn keep(&self, key: CacheKey, seq: Sequence, tokens: Vec<u32>) {
        let bytes = seq.kv_bytes() as u64;
        let mut s = lock(&self.state);
        s.cached.remove(&key);
        while s.cached.len() >= s.max_cached || s.reserved + cached_bytes(&s) + bytes > s.budget {
            if !evict_oldest(&mut s) {
                return;
            }
        }
        s.cached.insert(
            key,
            Kept {
                seq,
                tokens,
                bytes,
                used: Instant::now(),
            },
        );
    }

    pub fn usage(&self) -> Usage {
        let s = lock(&self.state);
        Usage {
            reserved: s.reserved,
            cached: cached_bytes(&s),
            cached_sessions: s.cached.len(),
            budget: s.budget,
            evicted: s.evicted,
            reused_tokens: s.reused,
            kept_tokens: s.cached.values().map(|k| k.tokens.len() as u64).sum(),
        }
    }

    /// Counts `tokens` context tokens whose KV a session took from a kept
    /// cache.
    pub fn record_reuse(&self, tokens: usize) {
        lock(&self.state).reused += tokens as u64;
    }
}

fn cached_bytes(s: &State) -> u64 {
    s.cached.values().map(|k| k.bytes).sum()
}

fn evict_oldest(s: &mut State) -> bool {
    let Some(key) = s
        .cached
        .iter()
        .min_by_key(|(_, k)| k.used)
        .map(|(key, _)| key.clone())
    else {
        return false;
    };
    tracing::info!(cache_key = %key, "evicting a kept KV cache");
    s.cached.remove(&key);
    s.evicted += 1;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_released() {
        let m = KvMemory::new(100, 4);
        let a = m.reserve(60).unwrap();
        let err = m.reserve(50).unwrap_err();
        assert!(err.to_string().contains("budget is exhausted"), "{err}");
        drop(a);
        let _b = m.reserve(100).unwrap();
        assert_eq!(m.usage().reserved, 100);
    }
}
