//! Which verifier holds which prefix: the gateway's index of the KV events
//! every verifier publishes (`specmesh.v1.KvEvents`, watched by
//! [`crate::kv_watch`]), and the load each last reported.
//!
//! A block hash names a whole prefix (the tenant, the caller's salt and
//! every token up to the block's end: [`specmesh_kvcache::block_hashes`]),
//! so a request's cached prefix on a verifier is the longest run of its
//! hashes, from the first, that the verifier holds. Every gateway builds
//! the same index from the same events: a restarted gateway starts from
//! each verifier's snapshot.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use specmesh_proto::v1;

/// What a verifier reported of its load with its last batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    pub running: u32,
    pub reserved_blocks: u64,
    pub free_blocks: u64,
    pub cached_blocks: u64,
}

#[derive(Debug, Default)]
struct Holder {
    instance: String,
    blocks: HashSet<u64>,
    load: Load,
}

/// The index; shared by placement and the watches.
#[derive(Debug, Default)]
pub struct KvIndex {
    members: RwLock<HashMap<String, Holder>>,
}

impl KvIndex {
    /// Applies a batch the verifier at `endpoint` sent.
    pub fn apply(&self, endpoint: &str, batch: &v1::KvEventBatch) {
        let mut members = self.members.write().unwrap_or_else(|e| e.into_inner());
        let holder = members.entry(endpoint.to_owned()).or_default();
        if batch.snapshot || holder.instance != batch.instance {
            holder.blocks.clear();
            holder.instance.clone_from(&batch.instance);
        }
        holder.blocks.extend(&batch.stored);
        for h in &batch.removed {
            holder.blocks.remove(h);
        }
        if let Some(l) = &batch.load {
            holder.load = Load {
                running: l.running,
                reserved_blocks: l.reserved_blocks,
                free_blocks: l.free_blocks,
                cached_blocks: l.cached_blocks,
            };
        }
    }

    /// Forgets the verifier at `endpoint` (its stream broke: gone or
    /// restarting).
    pub fn forget(&self, endpoint: &str) {
        self.members
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(endpoint);
    }

    /// How many leading blocks of `prefix` the verifier at `endpoint`
    /// holds, with its load; `None` when the index knows nothing of it.
    pub fn hits(&self, endpoint: &str, prefix: &[u64]) -> Option<(usize, Load)> {
        let members = self.members.read().unwrap_or_else(|e| e.into_inner());
        let holder = members.get(endpoint)?;
        let hits = prefix
            .iter()
            .take_while(|h| holder.blocks.contains(h))
            .count();
        Some((hits, holder.load))
    }

    /// Blocks indexed, over every verifier (a gauge).
    pub fn blocks(&self) -> usize {
        self.members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|h| h.blocks.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(instance: &str, snapshot: bool, stored: &[u64], removed: &[u64]) -> v1::KvEventBatch {
        v1::KvEventBatch {
            instance: instance.into(),
            block_tokens: 16,
            snapshot,
            stored: stored.to_vec(),
            removed: removed.to_vec(),
            load: Some(v1::KvLoad {
                running: 2,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_prefix_counts_its_leading_blocks_held() {
        let index = KvIndex::default();
        assert_eq!(index.hits("a", &[1, 2]), None);
        index.apply("a", &batch("i", true, &[1, 2, 4], &[]));
        assert_eq!(index.hits("a", &[1, 2, 3, 4]).unwrap().0, 2);
        assert_eq!(index.hits("a", &[9, 1]).unwrap().0, 0);
        assert_eq!(index.hits("a", &[1]).unwrap().1.running, 2);
        // A delta; then a snapshot replaces everything.
        index.apply("a", &batch("i", false, &[3], &[2]));
        assert_eq!(index.hits("a", &[1, 2, 3]).unwrap().0, 1);
        index.apply("a", &batch("i", true, &[7], &[]));
        assert_eq!(index.hits("a", &[1]).unwrap().0, 0);
        assert_eq!(index.blocks(), 1);
        // A restarted verifier (another instance) starts over.
        index.apply("a", &batch("j", false, &[8], &[]));
        assert_eq!(index.hits("a", &[7]).unwrap().0, 0);
        index.forget("a");
        assert_eq!(index.hits("a", &[8]), None);
        assert_eq!(index.blocks(), 0);
    }
}
