//! Chaos: two verifiers and two drafters `kill -9`ed at random moments and
//! started again at their addresses while 16 streamed requests (greedy and
//! seeded sampled) run at once. Nothing may be lost or changed: every
//! request completes, its chunks' offsets have no gap or repeat, its tokens
//! equal its fault-free run's; afterwards no verifier runs a session or
//! holds KV (no request has a session id, so nothing is kept).
//!
//! `chaos_kills_lose_and_change_nothing` runs in CI (10 kills);
//! `chaos_for_minutes` is the long run (`tests/chaos/run.sh`).

use std::time::Duration;

use specmesh_e2e::chaos::Plan;
use specmesh_e2e::cluster::Cluster;
use specmesh_e2e::load::{Tally, Until, under_chaos};

/// A number from the environment, else `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

/// Two verifiers, two drafters, a gateway that re-places a session up to
/// 20 times: several faults may hit one request.
fn cluster() -> Cluster {
    Cluster::start(2, 2, &[], &["--max-replacements", "20"])
}

/// [`Plan::quick`]; `SPECMESH_CHAOS_SETTLE_MS` overrides how long the other
/// verifier must have been back before a verifier is killed.
fn plan(seed: u64) -> Plan {
    let quick = Plan::quick(seed);
    let settle = env_or("SPECMESH_CHAOS_SETTLE_MS", quick.settle.as_millis() as u64);
    Plan {
        settle: Duration::from_millis(settle),
        ..quick
    }
}

/// What every chaos run asserts, once the chaos has stopped.
async fn assert_nothing_lost_or_changed(cluster: &Cluster, tally: &Tally) {
    assert!(
        tally.lost.is_empty(),
        "{} of {} requests lost:\n{}",
        tally.lost.len(),
        tally.requests,
        tally.lost.join("\n")
    );
    assert!(
        tally.changed.is_empty(),
        "{} of {} requests changed:\n{}",
        tally.changed.len(),
        tally.requests,
        tally.changed.join("\n")
    );
    // Every session ended (cancelled ones too) and freed its reservation;
    // what stays is the prefix cache, within the budget. Restarted
    // verifiers start empty, so the one that was never killed is the
    // telling one; all must be.
    let stats = cluster.settled_stats(Duration::from_secs(10)).await;
    for (url, s) in cluster.verifier_urls().iter().zip(&stats) {
        let s = s
            .as_ref()
            .unwrap_or_else(|| panic!("the verifier at {url} does not answer Stats"));
        assert_eq!(
            (s.active_sessions, s.reserved_bytes),
            (0, 0),
            "the verifier at {url} still holds sessions or their KV: {s:?}"
        );
        assert!(
            s.kv_bytes <= s.kv_budget_bytes && s.kv_bytes == s.prefix_cache_bytes,
            "the verifier at {url} holds KV outside its prefix cache: {s:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kills_lose_and_change_nothing() {
    let cluster = cluster();
    let seed = env_or("SPECMESH_CHAOS_SEED", 7);
    let until = Until {
        kills: 10,
        duration: Duration::ZERO,
    };
    let (tally, kills) = under_chaos(&cluster, plan(seed), &until).await;
    assert!(kills.len() >= 10, "only {} kills", kills.len());
    // A run whose verifier kills all fell between rounds tested nothing
    // about re-placement.
    assert!(
        !tally.stall_verifier.is_empty(),
        "no verifier was killed while requests ran: {kills:?}"
    );
    assert_nothing_lost_or_changed(&cluster, &tally).await;
}

/// The long run: load for `SPECMESH_CHAOS_MINUTES` (10) and at least
/// `SPECMESH_CHAOS_KILLS` (50) kills, whichever ends later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs for 10 minutes or more: tests/chaos/run.sh"]
async fn chaos_for_minutes() {
    let minutes: f64 = env_or("SPECMESH_CHAOS_MINUTES", 10.0);
    let kills: usize = env_or("SPECMESH_CHAOS_KILLS", 50);
    let seed = env_or("SPECMESH_CHAOS_SEED", 7);
    let duration = Duration::from_secs_f64(minutes * 60.0);
    // Spread the kills over the run: a kill, its down time and restart take
    // about 3 s besides the pause, so pauses average what is left.
    let per_kill = duration.as_secs_f64() / kills.max(1) as f64;
    let mean_pause = (per_kill - 3.0).max(0.5);
    let plan = Plan {
        pause: (
            Duration::from_millis(500),
            Duration::from_secs_f64(2.0 * mean_pause - 0.5),
        ),
        ..plan(seed)
    };
    let cluster = cluster();
    let (tally, log) = under_chaos(&cluster, plan, &Until { kills, duration }).await;
    assert!(log.len() >= kills, "only {} kills", log.len());
    assert_nothing_lost_or_changed(&cluster, &tally).await;
}
