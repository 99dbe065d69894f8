//! A chaos thread: `kill -9` of random verifiers and drafters of a
//! [`Cluster`] at random moments, each started again at its address after
//! a short random down time. Seeded, so a failing run can be replayed
//! (as far as the machine's timing allows).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cluster::{Members, Role};

/// SplitMix64: tiny, seeded, good enough to pick victims and delays (the
/// workspace's `rand` is not a dependency of this crate, and adding one
/// would change the lock file).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        let span = hi.saturating_sub(lo).as_micros() as u64;
        lo + Duration::from_micros(if span == 0 {
            0
        } else {
            self.next_u64() % (span + 1)
        })
    }
}

/// How the chaos thread behaves.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    /// Wait before each kill (after the previous victim is back).
    pub pause: (Duration, Duration),
    /// How long a victim stays down before it is started again.
    pub down: (Duration, Duration),
    /// A verifier is killed only when every other verifier has been back
    /// this long (0: at any moment). With none left up, requests wait for
    /// one to come back (the gateway's `--placement-wait-ms`), which the
    /// gateway's health watch sees within its back-off of up to 4 s.
    pub settle: Duration,
}

impl Plan {
    /// The CI run's: a kill every few seconds.
    pub fn quick(seed: u64) -> Plan {
        Plan {
            seed,
            pause: (Duration::from_millis(500), Duration::from_millis(4000)),
            down: (Duration::ZERO, Duration::from_millis(1500)),
            settle: Duration::ZERO,
        }
    }
}

/// One kill: who, when it died, when it listened again.
#[derive(Debug, Clone)]
pub struct Kill {
    pub role: Role,
    pub index: usize,
    pub pid: u32,
    pub at: Instant,
    pub back: Instant,
}

/// The running chaos thread; [`Chaos::stop`] ends it with every member up.
#[derive(Debug)]
pub struct Chaos {
    stop: Arc<AtomicBool>,
    kills: Arc<Mutex<Vec<Kill>>>,
    /// The kill in progress (its victim is down), if any.
    pending: Arc<Mutex<Option<(Role, usize, Instant)>>>,
    thread: Option<JoinHandle<()>>,
}

impl Chaos {
    pub fn start(members: Members, plan: Plan) -> Chaos {
        let stop = Arc::new(AtomicBool::new(false));
        let kills = Arc::new(Mutex::new(Vec::new()));
        let pending = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, kills, pending) = (stop.clone(), kills.clone(), pending.clone());
            std::thread::spawn(move || run(&members, &plan, &stop, &kills, &pending))
        };
        Chaos {
            stop,
            kills,
            pending,
            thread: Some(thread),
        }
    }

    /// Kills so far (counted when the victim dies).
    pub fn kills(&self) -> usize {
        let log = self.kills.lock().unwrap_or_else(|e| e.into_inner());
        log.len() + usize::from(self.in_progress().is_some())
    }

    /// The victim down now, and since when.
    pub fn in_progress(&self) -> Option<(Role, usize, Instant)> {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every kill so far whose victim is back.
    pub fn log(&self) -> Vec<Kill> {
        self.kills.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ends the thread after its current kill's restart; every member is up
    /// when it returns. Returns every kill.
    pub fn stop(mut self) -> Vec<Kill> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take()
            && let Err(panic) = t.join()
        {
            std::panic::resume_unwind(panic);
        }
        self.log()
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    members: &Members,
    plan: &Plan,
    stop: &AtomicBool,
    kills: &Mutex<Vec<Kill>>,
    pending: &Mutex<Option<(Role, usize, Instant)>>,
) {
    let mut rng = Rng::new(plan.seed);
    let victims: Vec<(Role, usize)> = [Role::Verifier, Role::Drafter]
        .into_iter()
        .flat_map(|role| (0..members.count(role)).map(move |i| (role, i)))
        .collect();
    loop {
        if sleep_unless_stopped(rng.between(plan.pause), stop) {
            return;
        }
        // Every member is as likely a victim; a verifier waits until the
        // others have settled (see `Plan::settle`).
        let (role, index) = victims[rng.below(victims.len())];
        if role == Role::Verifier {
            let settled = || {
                (0..members.count(Role::Verifier))
                    .filter(|&other| other != index)
                    .all(|other| {
                        members
                            .up_for(Role::Verifier, other)
                            .is_some_and(|up| up >= plan.settle)
                    })
            };
            while !settled() {
                if sleep_unless_stopped(Duration::from_millis(100), stop) {
                    return;
                }
            }
        }
        // Draw the down time before the kill so the sequence of draws, and
        // so the schedule, depends on the seed only.
        let down = rng.between(plan.down);
        let at = Instant::now();
        *pending.lock().unwrap_or_else(|e| e.into_inner()) = Some((role, index, at));
        let pid = members.kill(role, index);
        eprintln!(
            "chaos: kill -9 {} #{index} (pid {pid}), down for {down:?}",
            role.binary()
        );
        std::thread::sleep(down);
        members.restart(role, index);
        let back = Instant::now();
        // Both under the log's lock, so `Chaos::kills` never counts this
        // kill twice or not at all.
        let mut log = kills.lock().unwrap_or_else(|e| e.into_inner());
        log.push(Kill {
            role,
            index,
            pid,
            at,
            back,
        });
        *pending.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Sleeps `d` in short slices; true when asked to stop meanwhile.
fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
    }
    stop.load(Ordering::SeqCst)
}
