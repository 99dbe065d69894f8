//! Placement: stability, spread, exclusion, health and membership changes.

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
        prefix: &[],
        need_blocks: 0,
        structured: false,
        grammar: false,
    }
}

/// The verifiers at `indices` as failed by a request now.
fn failed(placer: &Placer, indices: &[usize]) -> Vec<FailedOn> {
    let verifiers = placer.verifiers();
    indices
        .iter()
        .map(|&i| FailedOn {
            member: verifiers[i].clone(),
            recoveries: verifiers[i].recoveries.load(Ordering::Relaxed),
        })
        .collect()
}

const ANON: PlacementKey<'static> = PlacementKey {
    session_id: None,
    tenant: "",
    speculate: true,
    prefix: &[],
    need_blocks: 0,
    structured: false,
    grammar: false,
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
        let moved = placer
            .place(session(id), &failed(&placer, &[2]), 2)
            .unwrap()
            .verifier
            .index();
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
    let e = placer.place(ANON, &failed(&placer, &[freed]), 1).unwrap();
    assert_ne!(e.verifier.index(), freed);
    drop((a, c, d, e));
    assert!((0..3).all(|i| placer.in_flight(i) == 0));
}

#[test]
fn no_verifier_left_is_none() {
    let placer = Placer::new(endpoints(2), Vec::new());
    assert!(placer.place(ANON, &failed(&placer, &[0, 1]), 1).is_none());
    assert!(
        placer
            .place(session("x"), &failed(&placer, &[1, 0]), 1)
            .is_none()
    );
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
                    prefix: &[],
                    need_blocks: 0,
                    structured: false,
                    grammar: false,
                },
                &[],
                1,
            )
            .unwrap();
        assert_eq!(p.drafter.as_deref(), Some(first.as_str()));
        assert_eq!(p.epoch, 1);
    }
    let tenants: std::collections::HashSet<String> = (0..60)
        .map(|i| placer.drafter(&format!("tenant-{i}")).unwrap())
        .collect();
    assert_eq!(tenants.len(), 3, "tenants spread over the drafters");
    let off = placer
        .place(
            PlacementKey {
                session_id: None,
                tenant: "acme",
                speculate: false,
                prefix: &[],
                need_blocks: 0,
                structured: false,
                grammar: false,
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
    let down =
        |p: &Placer, i: usize, up: bool| p.verifiers()[i].healthy.store(up, Ordering::Relaxed);
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
    let member = placer
        .drafters()
        .into_iter()
        .find(|d| d.endpoint == first)
        .unwrap();
    member.healthy.store(false, Ordering::Relaxed);
    let second = placer.drafter("acme").unwrap().to_owned();
    assert_ne!(second, first);
    // The verifier re-attaches to the others if it loses its drafter:
    // those up first, the down one last.
    let acme = PlacementKey {
        session_id: None,
        tenant: "acme",
        speculate: true,
        prefix: &[],
        need_blocks: 0,
        structured: false,
        grammar: false,
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
        .iter()
        .for_each(|d| d.healthy.store(false, Ordering::Relaxed));
    let p = placer.place(acme, &[], 1).unwrap();
    assert_eq!((p.drafter, p.fallback_drafters.len()), (None, 0));
}

#[test]
fn membership_changes_move_only_the_sessions_they_must() {
    let all = endpoints(4);
    let placer = Placer::new(all[..3].to_vec(), Vec::new());
    let ids: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
    let home = |p: &Placer| -> Vec<String> {
        ids.iter()
            .map(|id| {
                p.place(session(id), &[], 1)
                    .unwrap()
                    .verifier
                    .endpoint()
                    .to_owned()
            })
            .collect()
    };
    let before = home(&placer);

    // A fourth verifier takes only the sessions it now wins.
    let change = placer.set_verifiers(&all);
    assert_eq!(change.added.len(), 1);
    assert_eq!(change.added[0].endpoint, all[3]);
    assert!(change.removed.is_empty());
    let after = home(&placer);
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    assert!(
        after
            .iter()
            .zip(&before)
            .all(|(a, b)| a == b || *a == all[3])
    );
    assert!((150..350).contains(&moved), "{moved} of 1000 moved");

    // A verifier that stays keeps its state: health and requests in flight.
    placer.verifiers()[1].set_healthy(false);
    let running = placer.place(ANON, &[], 1).unwrap();
    let running_on = running.verifier.endpoint().to_owned();
    let change = placer.set_verifiers(&all[1..]);
    assert_eq!(change.removed.len(), 1);
    assert_eq!(change.removed[0].endpoint, all[0]);
    assert!(
        !placer.verifiers()[0].is_healthy(),
        "verifier 1 is still down"
    );
    if running_on != all[0] {
        let i = all[1..].iter().position(|e| *e == running_on).unwrap();
        assert_eq!(placer.in_flight(i), 1);
    }
    drop(running);

    // The removed one gets no new requests; its sessions go elsewhere.
    for id in &ids {
        let p = placer.place(session(id), &[], 1).unwrap();
        assert_ne!(p.verifier.endpoint(), all[0]);
        assert_ne!(p.verifier.endpoint(), all[1], "down");
    }
    for _ in 0..10 {
        assert_ne!(
            placer.place(ANON, &[], 1).unwrap().verifier.endpoint(),
            all[0]
        );
    }

    // A verifier a request failed on that leaves and comes back is a new
    // member (a new pod at the same address): it may take the request.
    let only = Placer::new(all[..1].to_vec(), Vec::new());
    let lost = only.place(ANON, &[], 1).unwrap().verifier.failed();
    assert!(only.place(ANON, std::slice::from_ref(&lost), 2).is_none());
    only.set_verifiers(&[]);
    assert!(only.place(ANON, &[], 2).is_none(), "no verifier at all");
    only.set_verifiers(&all[..1]);
    assert!(only.place(ANON, &[lost], 2).is_some());
}

#[test]
fn drafters_join_and_leave() {
    let placer = Placer::new(endpoints(1), Vec::new());
    assert_eq!(placer.drafter("acme"), None);
    let drafters: Vec<String> = (0..2).map(|i| format!("http://d-{i}:50061")).collect();
    let change = placer.set_drafters(&drafters);
    assert_eq!(change.added.len(), 2);
    let first = placer.drafter("acme").unwrap();
    placer
        .drafters()
        .iter()
        .find(|d| d.endpoint != first)
        .unwrap()
        .set_healthy(false);
    let change = placer.set_drafters(&drafters);
    assert!(change.added.is_empty() && change.removed.is_empty());
    assert_eq!(
        placer.drafters().iter().filter(|d| d.is_healthy()).count(),
        1
    );
    let keep: Vec<String> = drafters.iter().filter(|d| **d != first).cloned().collect();
    let change = placer.set_drafters(&keep);
    assert_eq!(change.removed[0].endpoint, first);
    // The one left is down: plain decoding, nothing to fall back to.
    let p = placer.place(ANON, &[], 1).unwrap();
    assert_eq!((p.drafter, p.fallback_drafters.len()), (None, 0));
}

/// A KV event batch: `stored` held now, `running` sessions, room for
/// `free` blocks more.
fn held(stored: &[u64], running: u32, free: u64) -> specmesh_proto::v1::KvEventBatch {
    specmesh_proto::v1::KvEventBatch {
        instance: "i".into(),
        block_tokens: 16,
        snapshot: true,
        stored: stored.to_vec(),
        removed: Vec::new(),
        load: Some(specmesh_proto::v1::KvLoad {
            running,
            reserved_blocks: 0,
            free_blocks: free,
            cached_blocks: stored.len() as u64,
        }),
    }
}

#[test]
fn a_request_goes_where_its_prefix_is_cached_weighed_against_load() {
    let placer = Placer::new(endpoints(3), Vec::new());
    let e = endpoints(3);
    let index = placer.kv_index();
    let prefix = [1, 2, 3, 4, 5, 6, 7, 8];
    let key = |session_id| PlacementKey {
        session_id,
        tenant: "t",
        speculate: false,
        prefix: &prefix,
        need_blocks: 10,
        structured: false,
        grammar: false,
    };
    // Nothing indexed: the session's rendezvous choice, or the least
    // loaded.
    let p = placer.place(key(Some("s")), &[], 1).unwrap();
    assert_eq!((p.reason, p.predicted_blocks), (Reason::Session, 0));
    // Its lease ends: nothing in flight below.
    drop(p);
    assert_eq!(
        placer.place(key(None), &[], 1).unwrap().reason,
        Reason::Load
    );
    // Verifier 1 holds 6 blocks, verifier 2 the first (a shared system
    // prompt): 1 wins, whatever the session's rendezvous says.
    index.apply(&e[0], &held(&[], 0, 100));
    index.apply(&e[1], &held(&prefix[..6], 3, 100));
    index.apply(&e[2], &held(&prefix[..1], 0, 100));
    let p = placer.place(key(Some("s")), &[], 1).unwrap();
    assert_eq!(
        (p.verifier.index, p.reason, p.predicted_blocks),
        (1, Reason::Prefix, 6)
    );
    drop(p);
    // Load counts: six more sessions on 1 tip it to 2 (cost 7 + 0 < 2 + 9).
    index.apply(&e[1], &held(&prefix[..6], 9, 100));
    assert_eq!(placer.place(key(None), &[], 1).unwrap().verifier.index, 2);
    // A verifier without room for the request is skipped; an excluded
    // (failed) one too.
    index.apply(&e[1], &held(&prefix[..6], 0, 3));
    assert_eq!(placer.place(key(None), &[], 1).unwrap().verifier.index, 2);
    index.apply(&e[1], &held(&prefix[..6], 0, 100));
    let p = placer.place(key(None), &failed(&placer, &[1]), 1).unwrap();
    assert_eq!(p.verifier.index, 2);
    // A verifier whose events stopped is forgotten.
    index.forget(&e[1]);
    index.forget(&e[2]);
    assert_eq!(
        placer.place(key(None), &[], 1).unwrap().reason,
        Reason::Load
    );
}

#[test]
fn a_speculative_request_goes_to_the_drafter_holding_its_prefix() {
    let drafters: Vec<String> = (0..3)
        .map(|i| format!("http://drafter-{i}.drafter:50061"))
        .collect();
    let placer = Placer::new(endpoints(1), drafters.clone());
    let index = placer.drafter_kv_index();
    let prefix = [11, 12, 13, 14];
    let key = PlacementKey {
        session_id: None,
        tenant: "acme",
        speculate: true,
        prefix: &prefix,
        need_blocks: 0,
        structured: false,
        grammar: false,
    };
    // Nothing cached anywhere: the tenant's drafter.
    let home = placer.drafter("acme").unwrap();
    let p = placer.place(key, &[], 1).unwrap();
    assert_eq!(
        (p.drafter.as_deref(), p.drafter_blocks),
        (Some(home.as_str()), 0)
    );
    // Another drafter holds the conversation (a failover moved it there):
    // it drafts there, and the tenant's drafter is the first fallback.
    let other = drafters.iter().find(|d| **d != home).unwrap().clone();
    index.apply(&other, &held(&prefix[..3], 0, 0));
    index.apply(&home, &held(&prefix[..1], 0, 0));
    let p = placer.place(key, &[], 1).unwrap();
    assert_eq!(
        (p.drafter.as_deref(), p.drafter_blocks),
        (Some(other.as_str()), 3)
    );
    assert_eq!(p.fallback_drafters[0], home, "then by blocks held");
    // Down, it is passed over; gone from the index, the tenant's again.
    let member = placer
        .drafters()
        .into_iter()
        .find(|d| d.endpoint == other)
        .unwrap();
    member.healthy.store(false, Ordering::Relaxed);
    let p = placer.place(key, &[], 1).unwrap();
    assert_eq!(
        (p.drafter.as_deref(), p.drafter_blocks),
        (Some(home.as_str()), 1)
    );
    member.healthy.store(true, Ordering::Relaxed);
    index.forget(&other);
    let p = placer.place(key, &[], 1).unwrap();
    assert_eq!(p.drafter.as_deref(), Some(home.as_str()));
    // A request without speculation gets no drafter at all.
    let plain = PlacementKey {
        speculate: false,
        ..key
    };
    assert_eq!(placer.place(plain, &[], 1).unwrap().drafter, None);
}

#[test]
fn structured_requests_go_only_to_members_that_serve_them() {
    let drafters: Vec<String> = (0..2).map(|i| format!("http://d{i}:1")).collect();
    let placer = Placer::new(endpoints(3), drafters);
    let structured = PlacementKey {
        structured: true,
        grammar: true,
        ..ANON
    };
    // No member has said it serves them yet: refused, not ignored.
    assert!(placer.place(structured, &[], 1).is_none());
    placer.verifiers()[2]
        .structured
        .store(true, Ordering::Relaxed);
    for _ in 0..6 {
        let p = placer.place(structured, &[], 1).unwrap();
        assert_eq!(p.verifier.member.endpoint, placer.verifiers()[2].endpoint);
        // No drafter serves them: plain decoding (the grammar still
        // forces what it forces).
        assert_eq!(p.drafter, None);
    }
    placer.drafters()[1]
        .structured
        .store(true, Ordering::Relaxed);
    let p = placer.place(structured, &[], 1).unwrap();
    assert_eq!(p.drafter.as_deref(), Some("http://d1:1"));
    assert!(p.fallback_drafters.is_empty());
    // Others go to the members that do not serve them too (the least
    // loaded: the capable one holds the requests above).
    let held: Vec<Placement> = (0..2)
        .map(|_| placer.place(ANON, &[], 1).unwrap())
        .collect();
    let spread: std::collections::HashSet<&str> = held
        .iter()
        .map(|p| p.verifier.member.endpoint.as_str())
        .collect();
    let verifiers = placer.verifiers();
    let others: std::collections::HashSet<&str> =
        verifiers[..2].iter().map(|m| m.endpoint.as_str()).collect();
    assert_eq!(spread, others);
}
