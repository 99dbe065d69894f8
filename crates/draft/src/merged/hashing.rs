//! A fast, non-cryptographic hasher for the drafters' integer-keyed maps.
//!
//! The maps sit on the propose path (n-gram heads, trie children, recycling
//! rows) and their keys are integers chosen by the session's own text, so
//! SipHash's flood resistance buys nothing while costing several times more
//! per lookup. Each word is folded in with a "folded multiply" (the 128-bit
//! product's halves xored, as in foldhash and aHash): one multiplication
//! that spreads every input bit over the low bits hashbrown uses as the
//! bucket index, so keys differing only in their high half (a trie parent
//! id packed above a token) still spread. A plain multiply would leave the
//! low bits depending on the low input bits only.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// An odd multiplier with well-spread bits (that of `rustc-hash` 2).
const K: u64 = 0xf135_7aea_2e62_a9c5;

#[inline]
fn folded_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// See the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MixHasher(u64);

impl MixHasher {
    #[inline]
    fn add(&mut self, x: u64) {
        self.0 = folded_mul(self.0 ^ x, K);
    }
}

impl Hasher for MixHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.add(u64::from(x));
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.add(x);
    }

    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.add(x as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` keyed by integers the drafters compute themselves.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;

/// Folds one token into a running sequence hash. Used for n-gram keys and
/// document fingerprints; collisions are always re-checked against the
/// tokens, so this only has to spread well, not resist attack.
#[inline]
pub(crate) fn mix(h: u64, token: u32) -> u64 {
    // The added constant keeps runs of token 0 from hashing to 0 at every
    // length (folded_mul(0, K) is 0).
    folded_mul(h ^ u64::from(token) ^ 0x243f_6a88_85a3_08d3, K)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differing_in_the_high_half_spread_over_buckets() {
        // 1024 parents with the same token must not share low bits.
        let mut low: Vec<u64> = (0u64..1024)
            .map(|p| {
                let mut h = MixHasher::default();
                h.write_u64((p << 32) | 7);
                h.finish() & 1023
            })
            .collect();
        low.sort_unstable();
        low.dedup();
        // Uniformly random would give about 1024 (1 - 1/e) = 647.
        assert!(low.len() > 600, "only {} distinct buckets", low.len());
    }

    #[test]
    fn mix_depends_on_order_and_length() {
        assert_ne!(mix(mix(0, 1), 2), mix(mix(0, 2), 1));
        assert_ne!(mix(0, 0), 0);
        assert_ne!(mix(mix(0, 0), 0), mix(0, 0));
    }
}
