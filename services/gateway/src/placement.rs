//! Which verifier runs a request, and which drafter feeds it.
//!
//! * A request whose prompt starts with blocks some verifier holds in its
//!   prefix cache (the gateway's index of every verifier's KV events,
//!   [`crate::kv_index`]) goes to the verifier with the lowest cost
//!   `PREFIX_WEIGHT × uncached blocks + load`, where load is the sessions
//!   it runs (the larger of its last report and this gateway's own
//!   requests in flight there): NVIDIA Dynamo's KV router and llm-d's
//!   weighted prefix and load scorers, with one running session weighing
//!   as much as one block (16 tokens) of prefill. A verifier whose free
//!   and cached blocks cannot hold the request is skipped.
//! * When no verifier holds any of it (a first turn, a fresh or stale
//!   index), a request with a `session_id` goes to the verifier that
//!   rendezvous hashing (highest random weight) picks for that id, so
//!   every turn of a conversation lands together. Losing a verifier moves
//!   only the sessions it owned, adding one takes only the sessions it now
//!   wins; every gateway replica computes the same choice without
//!   coordinating. Never a hash of the first block: one shared system
//!   prompt would send every request to one verifier.
//! * Any other request goes to the verifier with the fewest requests in
//!   flight from this gateway (ties rotate, so idle pods share the load).
//! * The drafter is the one holding the most of the request's prefix in
//!   its draft model's cache (the drafters' KV events, indexed apart from
//!   the verifiers'), so a conversation's draft model does not prefill its
//!   history again; when none holds any, the rendezvous choice for the
//!   tenant, so one tenant's cross-session suffix index lives on one
//!   drafter (a tenant's conversations stay there unless a failover moved
//!   one, which then stays where its draft KV is).
//! * Members the gateway's health watch ([`crate::health`]) finds down are
//!   left out of both choices until they recover: a session or tenant whose
//!   member is down moves to the next in its rendezvous order, and back
//!   when it returns.
//! * The member lists change while the gateway runs (DNS membership,
//!   [`crate::members`]): a member that stays keeps its health and load; one
//!   that leaves gets no new requests, while those it runs go on.
//!
//! The hash is FNV-1a with a SplitMix64 finalizer: fixed, so placements are
//! stable across processes and releases (std's `DefaultHasher` promises
//! neither).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::kv_index::KvIndex;

/// How much one uncached block (16 tokens to prefill) weighs against one
/// running session in the cost of placing a request on a verifier.
pub const PREFIX_WEIGHT: u64 = 1;

/// The verifiers and drafters requests may be placed on.
#[derive(Debug)]
pub struct Placer {
    /// Replaced whole on a membership change; placement reads a snapshot.
    verifiers: RwLock<Arc<[VerifierSlot]>>,
    drafters: RwLock<Arc<[Member]>>,
    /// Where the least-loaded scan starts, so ties rotate.
    cursor: AtomicUsize,
    /// Which verifier holds which prefix.
    kv: Arc<KvIndex>,
    /// Which drafter holds which prefix in its draft model's cache.
    drafter_kv: Arc<KvIndex>,
}

/// Why a verifier was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// It holds the most of the request's prefix, for its load.
    Prefix,
    /// No verifier holds any of it: the session's rendezvous choice.
    Session,
    /// Neither: the least loaded.
    Load,
}

impl Reason {
    /// As the metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Prefix => "prefix",
            Reason::Session => "session",
            Reason::Load => "load",
        }
    }
}

#[derive(Debug, Clone)]
struct VerifierSlot {
    member: Member,
    in_flight: Arc<AtomicUsize>,
}

/// One verifier or drafter, and whether it is up. Clones share the state.
#[derive(Debug, Clone)]
pub struct Member {
    pub endpoint: String,
    /// Set by the health watch; members start up, so a gateway that has not
    /// heard from them yet still places on them.
    pub healthy: Arc<AtomicBool>,
    /// Times the health watch saw the member come back up after being
    /// down: a request that lost it places on it again once this moves.
    pub recoveries: Arc<AtomicU64>,
    /// It serves structured outputs and logprobs
    /// ([`specmesh_server::capability::STRUCTURED`]), as its health says;
    /// false until the watch has asked (version skew fails closed).
    pub structured: Arc<AtomicBool>,
}

impl Member {
    fn new(endpoint: String) -> Member {
        Member {
            endpoint,
            healthy: Arc::new(AtomicBool::new(true)),
            recoveries: Arc::default(),
            structured: Arc::default(),
        }
    }

    /// Whether it serves structured outputs and logprobs.
    pub fn serves_structured(&self) -> bool {
        self.structured.load(Ordering::Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
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

    /// Whether `other` is this member (not merely one at the same
    /// endpoint that left and came back).
    fn same(&self, other: &Member) -> bool {
        Arc::ptr_eq(&self.recoveries, &other.recoveries)
    }
}

/// A verifier a request failed on, as it was then: it takes the request
/// again once the health watch has seen it come back up (a restarted pod),
/// or once it has left the list and come back as a new member.
#[derive(Debug, Clone)]
pub struct FailedOn {
    member: Member,
    recoveries: u64,
}

impl FailedOn {
    fn excludes(&self, member: &Member) -> bool {
        self.member.same(member) && member.recoveries.load(Ordering::Relaxed) == self.recoveries
    }
}

/// What placement needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct PlacementKey<'a> {
    pub session_id: Option<&'a str>,
    pub tenant: &'a str,
    /// Whether the request wants a drafter at all.
    pub speculate: bool,
    /// The block hashes of its context (what verifiers' prefix caches
    /// publish), first block first.
    pub prefix: &'a [u64],
    /// Blocks of KV the request reserves on its verifier.
    pub need_blocks: u64,
    /// It has a `structured` constraint or asks for logprobs,
    /// `min_new_tokens` or `ignore_eos`: only verifiers that serve them may
    /// take it.
    pub structured: bool,
    /// It has a grammar, whose forced tokens only drafters that serve
    /// structured outputs read in their outcomes (a drafter that does not
    /// drafts for none).
    pub grammar: bool,
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
    pub reason: Reason,
    /// Blocks of the prefix the index says the verifier holds.
    pub predicted_blocks: usize,
    /// Blocks of the prefix the drafter's draft model holds (0: the
    /// tenant's rendezvous drafter).
    pub drafter_blocks: usize,
}

/// A verifier chosen for a request; counts as in flight until dropped.
#[derive(Debug)]
pub struct VerifierLease {
    member: Member,
    in_flight: Arc<AtomicUsize>,
    /// Position in the member list when placed (tests read it).
    #[cfg_attr(not(test), allow(dead_code))]
    index: usize,
}

impl VerifierLease {
    pub fn endpoint(&self) -> &str {
        &self.member.endpoint
    }

    /// Records that the request failed here (see [`FailedOn`]).
    pub fn failed(&self) -> FailedOn {
        FailedOn {
            member: self.member.clone(),
            recoveries: self.member.recoveries.load(Ordering::Relaxed),
        }
    }

    #[cfg(test)]
    pub fn index(&self) -> usize {
        self.index
    }
}

impl Drop for VerifierLease {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a membership change did: the members to start and stop watching.
#[derive(Debug, Default)]
pub struct Change {
    pub added: Vec<Member>,
    pub removed: Vec<Member>,
}

impl Placer {
    pub fn new(verifiers: Vec<String>, drafters: Vec<String>) -> Self {
        let placer = Placer {
            verifiers: RwLock::new(Arc::from([])),
            drafters: RwLock::new(Arc::from([])),
            cursor: AtomicUsize::new(0),
            kv: Arc::default(),
            drafter_kv: Arc::default(),
        };
        placer.set_verifiers(&verifiers);
        placer.set_drafters(&drafters);
        placer
    }

    /// Makes `endpoints` the verifiers, in that order. A verifier that
    /// stays keeps its state (health, requests in flight); one that leaves
    /// gets no new requests, its running ones go on.
    pub fn set_verifiers(&self, endpoints: &[String]) -> Change {
        let mut list = write(&self.verifiers);
        let mut change = Change::default();
        let next: Arc<[VerifierSlot]> = endpoints
            .iter()
            .map(|endpoint| {
                list.iter()
                    .find(|v| &v.member.endpoint == endpoint)
                    .cloned()
                    .unwrap_or_else(|| {
                        let member = Member::new(endpoint.clone());
                        change.added.push(member.clone());
                        VerifierSlot {
                            member,
                            in_flight: Arc::default(),
                        }
                    })
            })
            .collect();
        change.removed = list
            .iter()
            .filter(|v| !endpoints.contains(&v.member.endpoint))
            .map(|v| v.member.clone())
            .collect();
        *list = next;
        change
    }

    /// Makes `endpoints` the drafters, in that order (see
    /// [`Placer::set_verifiers`]).
    pub fn set_drafters(&self, endpoints: &[String]) -> Change {
        let mut list = write(&self.drafters);
        let mut change = Change::default();
        let next: Arc<[Member]> = endpoints
            .iter()
            .map(|endpoint| {
                list.iter()
                    .find(|d| &d.endpoint == endpoint)
                    .cloned()
                    .unwrap_or_else(|| {
                        let member = Member::new(endpoint.clone());
                        change.added.push(member.clone());
                        member
                    })
            })
            .collect();
        change.removed = list
            .iter()
            .filter(|d| !endpoints.contains(&d.endpoint))
            .cloned()
            .collect();
        *list = next;
        change
    }

    /// The verifiers now, in list order.
    pub fn verifiers(&self) -> Vec<Member> {
        read(&self.verifiers)
            .iter()
            .map(|v| v.member.clone())
            .collect()
    }

    /// The drafters now, in list order.
    pub fn drafters(&self) -> Vec<Member> {
        read(&self.drafters).to_vec()
    }

    /// Requests from this gateway running on verifier `index` now.
    #[cfg(test)]
    pub fn in_flight(&self, index: usize) -> usize {
        read(&self.verifiers)
            .get(index)
            .map_or(0, |v| v.in_flight.load(Ordering::Relaxed))
    }

    /// Places a request, avoiding the verifiers it `failed` on (until they
    /// recover) and those found down. `None` when no verifier is left.
    pub fn place(
        &self,
        key: PlacementKey<'_>,
        failed: &[FailedOn],
        epoch: u64,
    ) -> Option<Placement> {
        let verifiers = read(&self.verifiers);
        let exclude: Vec<usize> = verifiers
            .iter()
            .enumerate()
            .filter(|(_, v)| {
                !v.member.is_healthy()
                    || (key.structured && !v.member.serves_structured())
                    || failed.iter().any(|f| f.excludes(&v.member))
            })
            .map(|(i, _)| i)
            .collect();
        let (index, reason, predicted_blocks) = match self.by_prefix(&verifiers, &exclude, key) {
            Some((i, hits)) => (i, Reason::Prefix, hits),
            None => match key.session_id {
                Some(id) => (
                    rendezvous(
                        id,
                        verifiers.iter().map(|v| v.member.endpoint.as_str()),
                        &exclude,
                    )?,
                    Reason::Session,
                    0,
                ),
                None => (self.least_loaded(&verifiers, &exclude)?, Reason::Load, 0),
            },
        };
        let slot = verifiers.get(index)?;
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        let verifier = VerifierLease {
            member: slot.member.clone(),
            in_flight: slot.in_flight.clone(),
            index,
        };
        // No drafter up: plain decoding, nothing to re-attach to either.
        let mut order = if key.speculate {
            self.drafter_order(key.tenant, key.prefix)
        } else {
            Vec::new()
        };
        if key.grammar {
            order.retain(|(d, _)| d.serves_structured());
        }
        let (drafter, fallback_drafters, drafter_blocks) = match order.split_first() {
            Some(((first, hits), rest)) if first.is_healthy() => (
                Some(first.endpoint.clone()),
                rest.iter().map(|(d, _)| d.endpoint.clone()).collect(),
                *hits,
            ),
            _ => (None, Vec::new(), 0),
        };
        Some(Placement {
            verifier,
            drafter,
            fallback_drafters,
            epoch,
            reason,
            predicted_blocks,
            drafter_blocks,
        })
    }

    /// The index the verifiers' KV watches feed.
    pub fn kv_index(&self) -> Arc<KvIndex> {
        Arc::clone(&self.kv)
    }

    /// The index the drafters' KV watches feed.
    pub fn drafter_kv_index(&self) -> Arc<KvIndex> {
        Arc::clone(&self.drafter_kv)
    }

    /// The verifier of least cost for `key`'s prefix and its hit blocks;
    /// `None` when no eligible verifier holds any of it.
    fn by_prefix(
        &self,
        verifiers: &[VerifierSlot],
        exclude: &[usize],
        key: PlacementKey<'_>,
    ) -> Option<(usize, usize)> {
        if key.prefix.is_empty() {
            return None;
        }
        let n = key.prefix.len() as u64;
        let len = verifiers.len().max(1);
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % len;
        // (cost, in flight, rotation) and hits of each eligible verifier
        // the index knows.
        let scored: Vec<((u64, usize, usize), usize, usize)> = verifiers
            .iter()
            .enumerate()
            .filter(|(i, _)| !exclude.contains(i))
            .filter_map(|(i, v)| {
                let (hits, load) = self.kv.hits(&v.member.endpoint, key.prefix)?;
                // Room: what is free, and what its cache would give up.
                if load.free_blocks + load.cached_blocks < key.need_blocks {
                    return None;
                }
                let in_flight = v.in_flight.load(Ordering::Relaxed);
                let running = u64::from(load.running).max(in_flight as u64);
                let cost = PREFIX_WEIGHT * (n - hits as u64) + running;
                Some(((cost, in_flight, (i + len - start) % len), i, hits))
            })
            .collect();
        // Nothing cached anywhere: not a prefix placement.
        if scored.iter().all(|&(_, _, hits)| hits == 0) {
            return None;
        }
        scored
            .into_iter()
            .min_by_key(|&(rank, _, _)| rank)
            .map(|(_, i, hits)| (i, hits))
    }

    /// The tenant's drafter for a request without a cached prefix, `None`
    /// when none is configured or up.
    #[cfg(test)]
    pub fn drafter(&self, tenant: &str) -> Option<String> {
        let (first, _) = self.drafter_order(tenant, &[]).into_iter().next()?;
        first.is_healthy().then_some(first.endpoint)
    }

    /// Every drafter in the order a request of `tenant` with `prefix`
    /// tries them, with the blocks of the prefix each holds: those up
    /// first, by blocks held, then by the tenant's rendezvous score (so
    /// with nothing cached the first is the tenant's drafter); then those
    /// down, the same way.
    fn drafter_order(&self, tenant: &str, prefix: &[u64]) -> Vec<(Member, usize)> {
        let drafters = read(&self.drafters);
        let mut order: Vec<(
            bool,
            std::cmp::Reverse<usize>,
            std::cmp::Reverse<u64>,
            usize,
        )> = drafters
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let hits = if prefix.is_empty() {
                    0
                } else {
                    self.drafter_kv
                        .hits(&d.endpoint, prefix)
                        .map_or(0, |(hits, _)| hits)
                };
                (
                    !d.is_healthy(),
                    std::cmp::Reverse(hits),
                    std::cmp::Reverse(score(tenant, &d.endpoint)),
                    i,
                )
            })
            .collect();
        order.sort_unstable();
        order
            .into_iter()
            .map(|(_, hits, _, i)| (drafters[i].clone(), hits.0))
            .collect()
    }

    fn least_loaded(&self, verifiers: &[VerifierSlot], exclude: &[usize]) -> Option<usize> {
        let n = verifiers.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .filter(|i| !exclude.contains(i))
            .min_by_key(|&i| verifiers[i].in_flight.load(Ordering::Relaxed))
    }
}

/// A snapshot of a member list (a poisoned lock still holds a whole list:
/// writers replace it in one store).
fn read<T: ?Sized>(list: &RwLock<Arc<T>>) -> Arc<T> {
    list.read().unwrap_or_else(|e| e.into_inner()).clone()
}

fn write<T: ?Sized>(list: &RwLock<Arc<T>>) -> std::sync::RwLockWriteGuard<'_, Arc<T>> {
    list.write().unwrap_or_else(|e| e.into_inner())
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
mod tests;
