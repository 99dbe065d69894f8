//! Which verifier runs a request, and which drafter feeds it.
//!
//! * A request with a `session_id` goes to the verifier that rendezvous
//!   hashing (highest random weight) picks for that id, so every turn of a
//!   conversation lands where its KV cache is kept. Losing a verifier moves
//!   only the sessions it owned; every gateway replica computes the same
//!   choice without coordinating.
//! * Any other request goes to the verifier with the fewest requests in
//!   flight from this gateway (ties rotate, so idle pods share the load).
//! * The drafter is the rendezvous choice for the tenant, so one tenant's
//!   cross-session suffix index lives on one drafter.
//! * Members the gateway's health watch ([`crate::health`]) finds down are
//!   left out of both choices until they recover: a session or tenant whose
//!   member is down moves to the next in its rendezvous order, and back
//!   when it returns.
//!
//! The hash is FNV-1a with a SplitMix64 finalizer: fixed, so placements are
//! stable across processes and releases (std's `DefaultHasher` promises
//! neither).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The verifiers and drafters requests may be placed on.
#[derive(Debug)]
pub struct Placer {
    verifiers: Vec<VerifierSlot>,
    drafters: Vec<Member>,
    /// Where the least-loaded scan starts, so ties rotate.
    cursor: AtomicUsize,
}

#[derive(Debug)]
struct VerifierSlot {
    member: Member,
    in_flight: Arc<AtomicUsize>,
}

/// One configured verifier or drafter, and whether it is up.
#[derive(Debug, Clone)]
pub struct Member {
    pub endpoint: String,
    /// Set by the health watch; members start up, so a gateway that has not
    /// heard from them yet still places on them.
    pub healthy: Arc<AtomicBool>,
    /// Times the health watch saw the member come back up after being
    /// down: a request that lost it places on it again once this moves.
    pub recoveries: Arc<AtomicU64>,
}

impl Member {
    fn new(endpoint: String) -> Member {
        Member {
            endpoint,
            healthy: Arc::new(AtomicBool::new(true)),
            recoveries: Arc::default(),
        }
    }

    fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records the watch's verdict; returns whether it changed.
    pub fn set_healthy(&self, up: bool) -> bool {
        let was = self.healthy.swap(up, Ordering::Relaxed);
        if up && !was {
            self.recoveries.fetch_add(1, Ordering::Relaxed);
        }
        was != up
    }
}

/// What placement needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct PlacementKey<'a> {
    pub session_id: Option<&'a str>,
    pub tenant: &'a str,
    /// Whether the request wants a drafter at all.
    pub speculate: bool,
}

/// Where one attempt of a request runs.
#[derive(Debug)]
pub struct Placement {
    pub verifier: VerifierLease,
    /// The drafter's endpoint; `None` runs plain decoding.
    pub drafter: Option<String>,
    /// The drafters the verifier re-attaches the session to if it loses
    /// `drafter`, in the tenant's order: those up first, then those down
    /// (they may be back by then).
    pub fallback_drafters: Vec<String>,
    /// 1 for the first placement, one more for each re-placement.
    pub epoch: u64,
}

/// A verifier chosen for a request; counts as in flight until dropped.
#[derive(Debug)]
pub struct VerifierLease {
    index: usize,
    endpoint: String,
    in_flight: Arc<AtomicUsize>,
}

impl VerifierLease {
    /// Position of the verifier in the configured list.
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for VerifierLease {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Placer {
    pub fn new(verifiers: Vec<String>, drafters: Vec<String>) -> Self {
        Placer {
            verifiers: verifiers
                .into_iter()
                .map(|endpoint| VerifierSlot {
                    member: Member::new(endpoint),
                    in_flight: Arc::default(),
                })
                .collect(),
            drafters: drafters.into_iter().map(Member::new).collect(),
            cursor: AtomicUsize::new(0),
        }
    }

    pub fn verifier_count(&self) -> usize {
        self.verifiers.len()
    }

    /// The verifiers, in the configured order, for the health watch.
    pub fn verifiers(&self) -> impl Iterator<Item = &Member> {
        self.verifiers.iter().map(|v| &v.member)
    }

    /// The drafters, in the configured order, for the health watch.
    pub fn drafters(&self) -> impl Iterator<Item = &Member> {
        self.drafters.iter()
    }

    /// Times verifier `index` came back up after being down (see
    /// [`Member::recoveries`]).
    pub fn recoveries(&self, index: usize) -> u64 {
        self.verifiers
            .get(index)
            .map_or(0, |v| v.member.recoveries.load(Ordering::Relaxed))
    }

    /// Requests from this gateway running on verifier `index` now.
    pub fn in_flight(&self, index: usize) -> usize {
        self.verifiers
            .get(index)
            .map_or(0, |v| v.in_flight.load(Ordering::Relaxed))
    }

    /// Places a request, avoiding the verifiers in `exclude` (those that
    /// already failed it) and those found down. `None` when no verifier is
    /// left.
    pub fn place(&self, key: PlacementKey<'_>, exclude: &[usize], epoch: u64) -> Option<Placement> {
        let mut exclude = exclude.to_vec();
        exclude
            .extend((0..self.verifiers.len()).filter(|&i| !self.verifiers[i].member.is_healthy()));
        let exclude = exclude.as_slice();
        let index = match key.session_id {
            Some(id) => self.rendezvous_verifier(id, exclude),
            None => self.least_loaded(exclude),
        }?;
        let slot = self.verifiers.get(index)?;
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        let verifier = VerifierLease {
            index,
            endpoint: slot.member.endpoint.clone(),
            in_flight: slot.in_flight.clone(),
        };
        // No drafter up: plain decoding, nothing to re-attach to either.
        let order = if key.speculate {
            self.drafter_order(key.tenant)
        } else {
            Vec::new()
        };
        let (drafter, fallback_drafters) = match order.split_first() {
            Some((first, rest)) if first.is_healthy() => (
                Some(first.endpoint.clone()),
                rest.iter().map(|d| d.endpoint.clone()).collect(),
            ),
            _ => (None, Vec::new()),
        };
        Some(Placement {
            verifier,
            drafter,
            fallback_drafters,
            epoch,
        })
    }

    /// The tenant's drafter, `None` when none is configured or up.
    #[cfg(test)]
    pub fn drafter(&self, tenant: &str) -> Option<&str> {
        let first = self.drafter_order(tenant).into_iter().next()?;
        first.is_healthy().then_some(first.endpoint.as_str())
    }

    /// Every drafter in the tenant's order: those up by rendezvous score
    /// (the first is the tenant's drafter), then those down by theirs.
    fn drafter_order(&self, tenant: &str) -> Vec<&Member> {
        let mut order: Vec<(bool, std::cmp::Reverse<u64>, usize)> = self
            .drafters
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    !d.is_healthy(),
                    std::cmp::Reverse(score(tenant, &d.endpoint)),
                    i,
                )
            })
            .collect();
        order.sort_unstable();
        order
            .into_iter()
            .map(|(_, _, i)| &self.drafters[i])
            .collect()
    }

    fn rendezvous_verifier(&self, session_id: &str, exclude: &[usize]) -> Option<usize> {
        rendezvous(
            session_id,
            self.verifiers.iter().map(|v| v.member.endpoint.as_str()),
            exclude,
        )
    }

    fn least_loaded(&self, exclude: &[usize]) -> Option<usize> {
        let n = self.verifiers.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .filter(|i| !exclude.contains(i))
            .min_by_key(|&i| self.in_flight(i))
    }
}

/// The node with the highest hash of (key, node), skipping `exclude`.
fn rendezvous<'a>(
    key: &str,
    nodes: impl Iterator<Item = &'a str>,
    exclude: &[usize],
) -> Option<usize> {
    nodes
        .enumerate()
        .filter(|(i, _)| !exclude.contains(i))
        .max_by_key(|&(i, node)| (score(key, node), std::cmp::Reverse(i)))
        .map(|(i, _)| i)
}

/// A stable 64-bit hash of `key` and `node`.
fn score(key: &str, node: &str) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = FNV_OFFSET;
    // 0xff never occurs in UTF-8, so ("ab", "c") and ("a", "bc") differ.
    for &b in key.as_bytes().iter().chain(&[0xff]).chain(node.as_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    splitmix64(h)
}

/// SplitMix64's finalizer: spreads FNV's weak low bits over the whole word.
fn splitmix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://verifier-{i}.verifier:50052"))
            .collect()
    }

    fn session(id: &str) -> PlacementKey<'_> {
        PlacementKey {
            session_id: Some(id),
            tenant: "",
            speculate: true,
        }
    }

    const ANON: PlacementKey<'static> = PlacementKey {
        session_id: None,
        tenant: "",
        speculate: true,
    };

    #[test]
    fn a_session_always_lands_on_the_same_verifier() {
        let placer = Placer::new(endpoints(4), Vec::new());
        for i in 0..50 {
            let id = format!("session-{i}");
            let first = placer.place(session(&id), &[], 1).unwrap().verifier.index();
            for _ in 0..3 {
                assert_eq!(
                    placer.place(session(&id), &[], 1).unwrap().verifier.index(),
                    first
                );
            }
            // Another gateway replica (a fresh placer) agrees.
            let other = Placer::new(endpoints(4), Vec::new());
            assert_eq!(
                other.place(session(&id), &[], 1).unwrap().verifier.index(),
                first
            );
        }
    }

    #[test]
    fn the_hash_is_pinned() {
        // Changing the hash re-homes every session in a rolling upgrade.
        assert_eq!(
            score("session-1", "http://verifier-0.verifier:50052"),
            0xaf8c_1ed5_7b92_8389
        );
        assert_ne!(score("ab", "c"), score("a", "bc"));
        assert_eq!(splitmix64(1), 0x5692_161d_100b_05e5);
    }

    #[test]
    fn sessions_spread_and_only_a_lost_verifiers_sessions_move() {
        let placer = Placer::new(endpoints(4), Vec::new());
        let ids: Vec<String> = (0..2000).map(|i| format!("s{i}")).collect();
        let home: Vec<usize> = ids
            .iter()
            .map(|id| placer.place(session(id), &[], 1).unwrap().verifier.index())
            .collect();
        for v in 0..4 {
            let share = home.iter().filter(|&&h| h == v).count();
            assert!(
                (350..650).contains(&share),
                "verifier {v} got {share} of 2000"
            );
        }
        // Excluding verifier 2 (it failed) moves its sessions and no others.
        for (id, &h) in ids.iter().zip(&home) {
            let moved = placer.place(session(id), &[2], 2).unwrap().verifier.index();
            if h == 2 {
                assert_ne!(moved, 2);
            } else {
                assert_eq!(moved, h);
            }
        }
    }

    #[test]
    fn without_a_session_the_least_loaded_verifier_wins() {
        let placer = Placer::new(endpoints(3), Vec::new());
        let a = placer.place(ANON, &[], 1).unwrap();
        let b = placer.place(ANON, &[], 1).unwrap();
        let c = placer.place(ANON, &[], 1).unwrap();
        let mut used = [a.verifier.index(), b.verifier.index(), c.verifier.index()];
        used.sort_unstable();
        assert_eq!(used, [0, 1, 2], "idle verifiers share the load");
        assert!((0..3).all(|i| placer.in_flight(i) == 1));

        let freed = b.verifier.index();
        drop(b);
        assert_eq!(placer.in_flight(freed), 0);
        let d = placer.place(ANON, &[], 1).unwrap();
        assert_eq!(d.verifier.index(), freed);
        // Excluding the only idle one falls back to a busy one.
        let e = placer.place(ANON, &[freed], 1).unwrap();
        assert_ne!(e.verifier.index(), freed);
        drop((a, c, d, e));
        assert!((0..3).all(|i| placer.in_flight(i) == 0));
    }

    #[test]
    fn no_verifier_left_is_none() {
        let placer = Placer::new(endpoints(2), Vec::new());
        assert!(placer.place(ANON, &[0, 1], 1).is_none());
        assert!(placer.place(session("x"), &[1, 0], 1).is_none());
        assert!(
            Placer::new(Vec::new(), Vec::new())
                .place(ANON, &[], 1)
                .is_none()
        );
    }

    #[test]
    fn a_tenant_keeps_its_drafter_and_off_means_none() {
        let drafters: Vec<String> = (0..3).map(|i| format!("http://d-{i}:50061")).collect();
        let placer = Placer::new(endpoints(2), drafters.clone());
        let first = placer.drafter("acme").unwrap().to_owned();
        for _ in 0..5 {
            let p = placer
                .place(
                    PlacementKey {
                        session_id: None,
                        tenant: "acme",
                        speculate: true,
                    },
                    &[],
                    1,
                )
                .unwrap();
            assert_eq!(p.drafter.as_deref(), Some(first.as_str()));
            assert_eq!(p.epoch, 1);
        }
        let tenants: std::collections::HashSet<&str> = (0..60)
            .map(|i| placer.drafter(&format!("tenant-{i}")).unwrap())
            .collect();
        assert_eq!(tenants.len(), 3, "tenants spread over the drafters");
        let off = placer
            .place(
                PlacementKey {
                    session_id: None,
                    tenant: "acme",
                    speculate: false,
                },
                &[],
                1,
            )
            .unwrap();
        assert_eq!(off.drafter, None);
        let no_drafters = Placer::new(endpoints(1), Vec::new());
        assert_eq!(no_drafters.place(ANON, &[], 1).unwrap().drafter, None);
    }

    #[test]
    fn members_found_down_are_left_out_until_they_recover() {
        let drafters: Vec<String> = (0..3).map(|i| format!("http://d-{i}:50061")).collect();
        let placer = Placer::new(endpoints(3), drafters);
        let down = |p: &Placer, i: usize, up: bool| {
            p.verifiers()
                .nth(i)
                .unwrap()
                .healthy
                .store(up, Ordering::Relaxed)
        };
        // A session whose verifier is down moves, and comes back.
        let home = placer
            .place(session("s-7"), &[], 1)
            .unwrap()
            .verifier
            .index();
        down(&placer, home, false);
        let moved = placer
            .place(session("s-7"), &[], 1)
            .unwrap()
            .verifier
            .index();
        assert_ne!(moved, home);
        for _ in 0..10 {
            assert_ne!(placer.place(ANON, &[], 1).unwrap().verifier.index(), home);
        }
        down(&placer, home, true);
        assert_eq!(
            placer
                .place(session("s-7"), &[], 1)
                .unwrap()
                .verifier
                .index(),
            home
        );
        // Every verifier down: nothing to place on.
        (0..3).for_each(|i| down(&placer, i, false));
        assert!(placer.place(ANON, &[], 1).is_none());
        (0..3).for_each(|i| down(&placer, i, true));

        // A tenant whose drafter is down gets the next one; none up: plain.
        let first = placer.drafter("acme").unwrap().to_owned();
        let member = placer.drafters().find(|d| d.endpoint == first).unwrap();
        member.healthy.store(false, Ordering::Relaxed);
        let second = placer.drafter("acme").unwrap().to_owned();
        assert_ne!(second, first);
        // The verifier re-attaches to the others if it loses its drafter:
        // those up first, the down one last.
        let acme = PlacementKey {
            session_id: None,
            tenant: "acme",
            speculate: true,
        };
        let p = placer.place(acme, &[], 1).unwrap();
        assert_eq!(p.drafter.as_deref(), Some(second.as_str()));
        assert_eq!(p.fallback_drafters.len(), 2);
        assert_eq!(p.fallback_drafters[1], first);
        assert!(!p.fallback_drafters.contains(&second));
        member.healthy.store(true, Ordering::Relaxed);
        let p = placer.place(acme, &[], 1).unwrap();
        assert_eq!(p.drafter.as_deref(), Some(first.as_str()));
        assert_eq!(p.fallback_drafters[0], second, "the tenant's order");
        assert_eq!(placer.drafter("acme").unwrap(), first);
        placer
            .drafters()
            .for_each(|d| d.healthy.store(false, Ordering::Relaxed));
        let p = placer.place(acme, &[], 1).unwrap();
        assert_eq!((p.drafter, p.fallback_drafters.len()), (None, 0));
    }
}
