//! Chained block hashes: block `i`'s hash covers the scope and every token
//! of blocks `0..=i`, so equal hashes name equal prefixes (up to a 64-bit
//! collision, which the store rules out by comparing tokens and parents).

/// A block's hash: names the whole prefix up to and including the block.
pub type BlockHash = u64;

/// Who may share a cached prefix: one tenant, and within it one
/// `cache_salt` (empty: the tenant's shared cache). The seed of every
/// chain, so two scopes never produce the same block hashes and one
/// tenant's cache is never found by another (no timing side channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope(u64);

const DOMAIN: &str = "specmesh-prefix-v1";

impl Scope {
    /// The scope of `tenant` (empty: the anonymous tenant) and `salt`;
    /// `key` narrows it further to one session (`--prefix-cache=false`:
    /// only a session's own earlier turns are found).
    pub fn new(tenant: &str, salt: &str, key: Option<&str>) -> Scope {
        let mut h = Fnv::new();
        h.bytes(DOMAIN.as_bytes());
        // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
        for part in [Some(tenant), Some(salt), key] {
            match part {
                Some(p) => {
                    h.u64(1);
                    h.u64(p.len() as u64);
                    h.bytes(p.as_bytes());
                }
                None => h.u64(0),
            }
        }
        Scope(h.finish())
    }

    /// The seed: the parent "hash" of a chain's first block.
    pub fn seed(self) -> u64 {
        self.0
    }
}

/// The hashes of the full blocks of `tokens` (a trailing partial block has
/// none), each chained on the one before it.
pub fn block_hashes(scope: Scope, tokens: &[u32], block_tokens: usize) -> Vec<BlockHash> {
    let mut parent = scope.seed();
    tokens
        .chunks_exact(block_tokens)
        .map(|block| {
            parent = chain(parent, block);
            parent
        })
        .collect()
}

/// Extends `hashes`, the hashes of the first blocks of `tokens`, to every
/// full block of `tokens` (hashing only the new ones: a growing context
/// is hashed once in all).
pub fn extend_block_hashes(
    scope: Scope,
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_tokens: usize,
) {
    let mut parent = hashes.last().copied().unwrap_or(scope.seed());
    let done = hashes.len() * block_tokens;
    if let Some(rest) = tokens.get(done..) {
        for block in rest.chunks_exact(block_tokens) {
            parent = chain(parent, block);
            hashes.push(parent);
        }
    }
}

/// The hash of a block after `parent`.
pub(crate) fn chain(parent: u64, block: &[u32]) -> BlockHash {
    let mut h = Fnv::new();
    h.u64(parent);
    for &t in block {
        h.u64(u64::from(t));
    }
    h.finish()
}

/// FNV-1a over bytes, finished with SplitMix64 so nearby inputs spread
/// over all 64 bits. Stable across processes and versions (the hashes are
/// published to gateways); not a defence against chosen collisions, which
/// the store's token comparison makes harmless.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_values_stay_fixed() {
        // Published to other processes: a change here is a wire change.
        let s = Scope::new("acme", "", None);
        let h = block_hashes(s, &(0..32).collect::<Vec<u32>>(), 16);
        assert_eq!(h.len(), 2);
        assert_eq!(
            (s.seed(), h[0], h[1]),
            (GOLDEN.0, GOLDEN.1, GOLDEN.2),
            "{:#x} {:#x} {:#x}",
            s.seed(),
            h[0],
            h[1]
        );
    }

    const GOLDEN: (u64, u64, u64) = (
        0x69f9_aa84_3672_0e63,
        0xa18d_4f75_2f55_8a44,
        0x2597_22cf_0f05_930b,
    );

    #[test]
    fn scopes_separate_tenants_salts_and_keys() {
        let scopes = [
            Scope::new("a", "", None),
            Scope::new("b", "", None),
            Scope::new("a", "x", None),
            Scope::new("a", "", Some("")),
            Scope::new("a", "", Some("k")),
            Scope::new("ab", "c", None),
            Scope::new("a", "bc", None),
        ];
        for (i, a) in scopes.iter().enumerate() {
            for b in &scopes[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn extending_hashes_equals_hashing_the_whole() {
        let scope = Scope::new("t", "", None);
        let tokens: Vec<u32> = (0..53).collect();
        let mut hashes = Vec::new();
        for end in [0, 7, 16, 17, 40, 53] {
            extend_block_hashes(scope, &mut hashes, &tokens[..end], 8);
            assert_eq!(hashes, block_hashes(scope, &tokens[..end], 8));
        }
    }

    #[test]
    fn a_hash_names_the_whole_prefix() {
        let s = Scope::new("t", "", None);
        let a: Vec<u32> = (0..48).collect();
        let mut b = a.clone();
        b[3] = 999;
        let (ha, hb) = (block_hashes(s, &a, 16), block_hashes(s, &b, 16));
        assert_eq!(ha.len(), 3);
        // Only the first block differs, yet every later hash does too.
        assert!(ha.iter().zip(&hb).all(|(x, y)| x != y));
        // A partial block has no hash; a prefix's hashes are a prefix.
        assert_eq!(block_hashes(s, &a[..40], 16), ha[..2]);
    }
}
