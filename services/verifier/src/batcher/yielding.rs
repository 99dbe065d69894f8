//! Trees a batch does not wait for.
//!
//! A session's driver asks its drafter for a tree after every step, and
//! its next step reaches the batcher only with the answer: a drafter round
//! trip (0.4 ms mean at 16 streams on SmolLM2, Intel Xeon) that the whole
//! batch waits out whenever any of its sessions asked. That pays when the
//! tree is worth it. A session whose speculating does not pay (the goodput
//! planner's node budget for it is 0, so its drafter sends only probes)
//! held every other session for a probe: at saturation, once a forward.
//!
//! So a driver that waits for a tree registers the wait here, with its
//! [`Patience`], and the batcher calls waits in when they no longer pay:
//!
//! - [`Patience::Others`] (a session that does not pay): as soon as every
//!   other decoding session is in the batch, and the batch holds one;
//! - [`Patience::Deadline`] (every other one): when the batch's wait for
//!   missing sessions runs out. Without it the session would step in a
//!   forward of its own, out of phase with the rest.
//!
//! A called session's step verifies the root alone (plain, for that step);
//! its tree, when it comes, is stale and dropped, and the drafter learns
//! from the outcome that it was not waited for. A lone session, or one
//! whose batch has nobody else in yet, is never called: then nothing waits
//! for it but its own step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use tokio::sync::watch;

use super::{Counters, Job};

/// How long a batch waits for a session's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// Until every other decoding session is in.
    Others,
    /// Until the batch's wait for missing sessions runs out.
    Deadline,
}

impl Patience {
    /// Its `patience` label in `specmesh_verify_trees_yielded_total`.
    pub fn label(self) -> &'static str {
        match self {
            Patience::Others => "others",
            Patience::Deadline => "deadline",
        }
    }

    fn level(self) -> u8 {
        match self {
            Patience::Others => 1,
            Patience::Deadline => 2,
        }
    }
}

/// The batcher's side: the waits registered, and the call.
#[derive(Debug)]
pub struct Yields {
    /// Waits registered, by patience (`Others`, `Deadline`).
    waiting: [AtomicUsize; 2],
    /// The patience level called in the batch forming (0: none yet).
    call: watch::Sender<u8>,
}

impl Default for Yields {
    fn default() -> Yields {
        Yields {
            waiting: [AtomicUsize::new(0), AtomicUsize::new(0)],
            call: watch::channel(0).0,
        }
    }
}

impl Yields {
    fn slot(&self, patience: Patience) -> &AtomicUsize {
        &self.waiting[usize::from(patience.level() - 1)]
    }

    /// Waits registered with `patience`.
    pub fn waiting(&self, patience: Patience) -> usize {
        self.slot(patience).load(Ordering::SeqCst)
    }

    /// A new batch is forming: nobody is called.
    pub(super) fn reset(&self) {
        self.call
            .send_if_modified(|level| std::mem::replace(level, 0) != 0);
    }

    /// Calls in the waits of `patience` (and less), once per batch.
    pub(super) fn call(&self, patience: Patience) -> bool {
        let want = patience.level();
        self.call.send_if_modified(|level| {
            let raise = *level < want;
            *level = (*level).max(want);
            raise
        })
    }
}

/// A session's registered wait for its tree: [`YieldingWait::called`]
/// ends when its batch calls it in. Dropping it ends the registration.
#[derive(Debug)]
pub struct YieldingWait {
    counters: Arc<Counters>,
    patience: Patience,
    call: watch::Receiver<u8>,
}

impl YieldingWait {
    /// Registers a wait of `patience` and wakes the batcher to count it.
    pub(super) fn register(
        counters: &Arc<Counters>,
        tx: &mpsc::Sender<Job>,
        patience: Patience,
    ) -> YieldingWait {
        // Subscribed before it is counted: any call that counts it is
        // seen.
        let call = counters.yields.call.subscribe();
        counters
            .yields
            .slot(patience)
            .fetch_add(1, Ordering::SeqCst);
        // The batcher may be waiting for this very session's job: it counts
        // the wait only when it looks again.
        let _ = tx.send(Job::Wake);
        YieldingWait {
            counters: Arc::clone(counters),
            patience,
            call,
        }
    }

    /// Returns when the batch forming calls this wait in; never if it
    /// does not.
    pub async fn called(&mut self) {
        let want = self.patience.level();
        loop {
            if *self.call.borrow_and_update() >= want {
                return;
            }
            // The sender lives in `counters`, which this wait holds.
            if self.call.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for YieldingWait {
    fn drop(&mut self) {
        self.counters
            .yields
            .slot(self.patience)
            .fetch_sub(1, Ordering::SeqCst);
    }
}
