//! What every draft stream of the process shares: the drafters, what
//! finished sessions learned, the counters, the session slots and the stop
//! signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::drafters::DrafterSet;
use crate::error::DrafterError;
use crate::learned::Learning;
use crate::stats::Stats;

/// What every stream of the process shares.
#[derive(Debug)]
pub struct State {
    pub drafters: DrafterSet,
    pub stats: Arc<Stats>,
    /// One permit per open stream.
    pub slots: Arc<Semaphore>,
    pub max_sessions: usize,
    pub max_context: usize,
    /// Pipelined "nothing drafted" trees.
    pub pipeline: bool,
    /// What finished sessions taught, when sessions learn from each other.
    pub learning: Option<Learning>,
    /// Draft model trees are drafted ahead of their outcome.
    pub draft_ahead: bool,
    /// How long a new stream may take to send its `start`.
    pub start_timeout: Duration,
    /// Becomes `true` when the shutdown grace period is over: open streams
    /// end with UNAVAILABLE.
    pub stop: watch::Receiver<bool>,
}

impl State {
    /// A session slot for a new draft stream, or BUSY (counted) when every
    /// one is taken.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, DrafterError> {
        Arc::clone(&self.slots).try_acquire_owned().map_err(|_| {
            self.stats.session_refused();
            DrafterError::Busy {
                max: self.max_sessions,
            }
        })
    }
}
