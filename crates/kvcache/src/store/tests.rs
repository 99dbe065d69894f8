use proptest::prelude::*;

use super::*;
use crate::hash::block_hashes;

const B: usize = 4;
const BYTES: u64 = 10;

fn data(tag: f32) -> Vec<u8> {
    tag.to_ne_bytes().repeat(3)
}

/// Caches every full block of `tokens` in `scope`; returns how many.
fn put(s: &mut Store, scope: Scope, tokens: &[u32]) -> usize {
    let h = block_hashes(scope, tokens, B);
    (0..h.len())
        .take_while(|&i| s.insert(scope, &h, tokens, i, data(i as f32)))
        .count()
}

fn hit(s: &mut Store, scope: Scope, tokens: &[u32]) -> usize {
    let h = block_hashes(scope, tokens, B);
    s.lookup(scope, &h, tokens, 0).len()
}

#[test]
fn a_prefix_is_found_block_by_block() {
    let mut s = Store::new(1000, B, BYTES);
    let a = Scope::new("a", "", None);
    let t: Vec<u32> = (0..10).collect();
    assert_eq!(put(&mut s, a, &t), 2);
    assert_eq!(hit(&mut s, a, &t), 2);
    // A longer prompt over the same start finds its first two blocks.
    let longer: Vec<u32> = (0..30).collect();
    assert_eq!(hit(&mut s, a, &longer), 2);
    // One changed token in block 1 keeps only block 0.
    let mut other = t.clone();
    other[5] = 77;
    assert_eq!(hit(&mut s, a, &other), 1);
    // The KV comes back as stored.
    let h = block_hashes(a, &t, B);
    assert_eq!(s.lookup(a, &h, &t, 1)[0].data(), &data(1.0)[..]);
    s.check();
}

#[test]
fn scopes_never_share() {
    let mut s = Store::new(1000, B, BYTES);
    let t: Vec<u32> = (0..8).collect();
    put(&mut s, Scope::new("a", "", None), &t);
    assert_eq!(hit(&mut s, Scope::new("b", "", None), &t), 0);
    assert_eq!(hit(&mut s, Scope::new("a", "salt", None), &t), 0);
    assert_eq!(hit(&mut s, Scope::new("a", "", None), &t), 2);
}

#[test]
fn the_tail_goes_first_and_reservations_evict() {
    // Room for 5 blocks.
    let mut s = Store::new(5 * BYTES, B, BYTES);
    let a = Scope::new("a", "", None);
    let long: Vec<u32> = (0..16).collect(); // 4 blocks
    assert_eq!(put(&mut s, a, &long), 4);
    // A reservation of two blocks' bytes takes the two last blocks only.
    s.reserve(2 * BYTES + 1).unwrap();
    assert_eq!(s.usage().blocks, 2);
    assert_eq!(hit(&mut s, a, &long), 2);
    assert_eq!(s.usage().evicted_blocks, 2);
    // What a router learns: four stored, then the two last removed, tail
    // first.
    let h = block_hashes(a, &long, B);
    assert_eq!(
        s.take_events(),
        [
            BlockEvent::Stored(h[0]),
            BlockEvent::Stored(h[1]),
            BlockEvent::Stored(h[2]),
            BlockEvent::Stored(h[3]),
            BlockEvent::Removed(h[3]),
            BlockEvent::Removed(h[2]),
        ]
    );
    assert!(s.take_events().is_empty());
    let mut held = s.hashes();
    held.sort_unstable();
    let mut want = h[..2].to_vec();
    want.sort_unstable();
    assert_eq!(held, want);
    // Nothing fits past the budget.
    let err = s.reserve(4 * BYTES).unwrap_err();
    assert!(err.to_string().contains("budget is exhausted"), "{err}");
    s.release(2 * BYTES + 1);
    assert_eq!(s.usage().reserved, 0);
    s.check();
}

#[test]
fn a_shared_start_outlives_its_branches() {
    let mut s = Store::new(4 * BYTES, B, BYTES);
    let a = Scope::new("a", "", None);
    let x: Vec<u32> = [0, 1, 2, 3, 10, 11, 12, 13].into();
    let y: Vec<u32> = [0, 1, 2, 3, 20, 21, 22, 23].into();
    let z: Vec<u32> = [0, 1, 2, 3, 30, 31, 32, 33].into();
    put(&mut s, a, &x);
    put(&mut s, a, &y);
    put(&mut s, a, &z);
    // 4 blocks: the shared start and three branches; a fifth evicts the
    // oldest branch (x's), never the start.
    let w: Vec<u32> = [0, 1, 2, 3, 40, 41, 42, 43].into();
    put(&mut s, a, &w);
    assert_eq!(hit(&mut s, a, &x), 1);
    assert_eq!(hit(&mut s, a, &w), 2);
    assert_eq!(hit(&mut s, a, &y), 2);
    s.check();
}

#[test]
fn memory_counts_blocks_still_being_copied() {
    let mut s = Store::new(2 * BYTES, B, BYTES);
    let a = Scope::new("a", "", None);
    let t: Vec<u32> = (0..8).collect();
    put(&mut s, a, &t);
    let h = block_hashes(a, &t, B);
    let copying = s.lookup(a, &h, &t, 0);
    // Evicting both blocks cannot free what a copy still holds: refused,
    // and nothing is evicted for it.
    assert!(s.reserve(BYTES).is_err());
    assert_eq!(s.usage().blocks, 2);
    drop(copying);
    s.reserve(BYTES).unwrap();
    assert_eq!(s.usage().blocks, 1, "one block made room");
}

#[test]
fn a_request_too_big_to_fit_evicts_nothing() {
    let mut s = Store::new(4 * BYTES, B, BYTES);
    let a = Scope::new("a", "", None);
    put(&mut s, a, &(0..8).collect::<Vec<u32>>());
    s.reserve(BYTES).unwrap();
    // 4 more blocks' worth can never fit beside the reservation.
    assert!(s.reserve(4 * BYTES).is_err());
    assert_eq!((s.usage().blocks, s.usage().evicted_blocks), (2, 0));
    s.check();
}

#[test]
fn a_colliding_hash_never_serves_other_tokens() {
    let mut s = Store::new(1000, B, BYTES);
    let a = Scope::new("a", "", None);
    let t: Vec<u32> = (0..4).collect();
    put(&mut s, a, &t);
    // Another prompt presented under t's hashes (as a collision would).
    let h = block_hashes(a, &t, B);
    let other: Vec<u32> = (100..104).collect();
    assert!(s.lookup(a, &h, &other, 0).is_empty());
    assert!(!s.insert(a, &h, &other, 0, data(9.0)));
    assert_eq!(s.lookup(a, &h, &t, 0)[0].data(), &data(0.0)[..]);
}

proptest! {
    #[test]
    fn any_history_keeps_the_invariants_and_the_budget(
        ops in prop::collection::vec((0u8..4, 0usize..3, prop::collection::vec(0u32..3, 0..20)), 1..60),
    ) {
        let budget = 12 * BYTES;
        let mut s = Store::new(budget, B, BYTES);
        let mut reserved = Vec::new();
        for (op, tenant, tokens) in ops {
            let scope = Scope::new(&tenant.to_string(), "", None);
            match op {
                0 | 1 => { put(&mut s, scope, &tokens); }
                2 => {
                    let n = hit(&mut s, scope, &tokens);
                    prop_assert!(n <= tokens.len() / B);
                }
                _ => {
                    let bytes = (tokens.len() as u64) * 3;
                    if s.reserve(bytes).is_ok() { reserved.push(bytes); }
                    if reserved.len() > 2 { s.release(reserved.remove(0)); }
                }
            }
            s.check();
            let u = s.usage();
            prop_assert!(u.reserved + u.cached <= budget, "{u:?}");
            prop_assert_eq!(u.cached, u.blocks as u64 * BYTES);
        }
    }
}
