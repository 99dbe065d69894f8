//! A fork-join pool tuned for the forward pass: hundreds of short parallel
//! sections per token, each a few microseconds long.
//!
//! A general-purpose pool (rayon) parks its workers between jobs and wakes
//! them through a futex, which costs more than a small matmul itself. Here the
//! calling thread is participant 0, workers spin briefly on a generation
//! counter between sections and only then sleep on a condvar, so back-to-back
//! sections in a forward pass start in well under a microsecond.

use std::any::Any;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin iterations before a worker with nothing to do goes to sleep.
const SPIN_LIMIT: u32 = 20_000;
/// Pure spins before a waiting thread starts yielding its core: on a
/// machine with more runnable threads than cores (CI, a busy node) a pure
/// spin would burn the timeslice the thread it waits for needs.
const SPIN_BEFORE_YIELD: u32 = 256;

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    participants: usize,
    generation: AtomicUsize,
    pending: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    job: Mutex<Option<SendJob>>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    lock: Mutex<()>,
    wake: Condvar,
}

#[derive(Clone, Copy)]
struct SendJob(Job);
// SAFETY: the pointee is `Sync` and `ThreadPool::run` keeps it alive until
// every worker has finished calling it (it waits for `pending == 0`).
unsafe impl Send for SendJob {}

/// A pool of `threads` participants: the caller plus `threads - 1` workers.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    // Serialises `run` calls: one section in flight at a time.
    call: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.shared.participants)
            .finish()
    }
}

impl ThreadPool {
    /// Creates a pool with `threads` participants (at least 1).
    pub fn new(threads: usize) -> ThreadPool {
        let participants = threads.max(1);
        let shared = Arc::new(Shared {
            participants,
            generation: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            job: Mutex::new(None),
            panic: Mutex::new(None),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..participants)
            .map(|tid| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("specmesh-kernel-{tid}"))
                    .spawn(move || worker(shared, tid))
                    .expect("spawning a kernel thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            call: Mutex::new(()),
        }
    }

    /// Number of participants, the caller included.
    pub fn threads(&self) -> usize {
        self.shared.participants
    }

    /// Runs `f(tid)` once on every participant (`tid` in `0..threads`) and
    /// returns when all have finished. A panic in any participant is resumed
    /// on the caller.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        if s.participants == 1 {
            f(0);
            return;
        }
        let _serial = self.call.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the lifetime is erased only for the duration of this call;
        // we do not return before `pending` drops to zero, i.e. before every
        // worker is done with `f`.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        *s.job.lock().unwrap() = Some(SendJob(job));
        s.pending.store(s.participants - 1, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap();
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *s.job.lock().unwrap() = None;
        if let Err(p) = mine {
            resume_unwind(p);
        }
        let worker_panic = s.panic.lock().unwrap().take();
        if let Some(p) = worker_panic {
            resume_unwind(p);
        }
    }

    /// Splits `0..len` into one contiguous range per participant and runs
    /// `f` on each. Ranges depend only on `len` and the thread count.
    pub fn for_ranges(&self, len: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        let n = self.threads();
        if n == 1 || len < 2 {
            f(0..len);
            return;
        }
        self.run(&|tid| {
            let (a, b) = (len * tid / n, len * (tid + 1) / n);
            if a < b {
                f(a..b);
            }
        });
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap();
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: Arc<Shared>, tid: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        let mut current = s.generation.load(Ordering::Acquire);
        while current == seen {
            if spins < SPIN_LIMIT {
                spins += 1;
                if spins < SPIN_BEFORE_YIELD {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            } else {
                let mut g = s.lock.lock().unwrap();
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen {
                    g = s.wake.wait(g).unwrap();
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            current = s.generation.load(Ordering::Acquire);
        }
        seen = current;
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let job = (*s.job.lock().unwrap()).expect("job published before generation");
        // SAFETY: see `SendJob`; the caller keeps the closure alive until
        // `pending` reaches zero, which happens after this call returns.
        let f = unsafe { &*job.0 };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(tid))) {
            *s.panic.lock().unwrap() = Some(p);
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_is_visited_once() {
        let pool = ThreadPool::new(3);
        for len in [0usize, 1, 2, 5, 1000] {
            let hits: Vec<AtomicUsize> = (0..len).map(|_| AtomicUsize::new(0)).collect();
            pool.for_ranges(len, &|r| {
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn many_sections_back_to_back() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        for _ in 0..10_000 {
            pool.run(&|tid| {
                total.fetch_add(tid + 1, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 10_000 * 3);
    }

    #[test]
    fn worker_panic_reaches_the_caller() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|tid| assert!(tid == 0, "boom"));
        }));
        assert!(r.is_err());
        // The pool is still usable afterwards.
        let n = AtomicUsize::new(0);
        pool.run(&|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }
}
