//! What the session's steps and its draft model's forwards took: the
//! clock the policy's step timing and level prices read.

use std::time::Instant;

use specmesh_draft::Arm;

use super::deadline::LiveTimes;

/// A propose that caught the draft model up on more context tokens than
/// this is a prefill: its time says nothing about a tree level's.
const MAX_LEVEL_CATCH_UP: u64 = 16;

/// Weight of a new sample in the draft model's per-forward time.
const FORWARD_EMA: f64 = 0.2;

/// The last applied outcome, until its time is recorded.
#[derive(Debug, Clone, Copy)]
pub(super) struct Untimed {
    pub(super) arm: Arm,
    /// Nodes drafted for it (0: plain steps).
    pub(super) drafted: usize,
    pub(super) batch: usize,
    /// Steps it reports.
    pub(super) steps: usize,
    /// Time the drafter spent drafting its tree, and the model forwards
    /// that took.
    pub(super) draft_secs: f64,
    pub(super) model_forwards: u64,
    /// Context tokens the model caught up on first (the prompt at the
    /// first propose): such a forward is a prefill, not a tree level.
    pub(super) caught_up: u64,
}

/// The session's clock; see the module docs.
#[derive(Debug)]
pub(super) struct Clock {
    /// Seconds of one draft model forward (moving average), once measured.
    pub(super) forward_secs: Option<f64>,
    /// The verifier's forward and the link's round trip, as reported and
    /// measured: how long a guess drafted ahead has (see `deadline`).
    pub(super) live: LiveTimes,
    /// The last tree's drafting: seconds, model forwards, context tokens
    /// caught up on.
    pub(super) last_draft: (f64, u64, u64),
    /// The last applied outcome, until its time is recorded.
    pub(super) untimed: Option<Untimed>,
    /// When the previous outcome arrived.
    pub(super) last_outcome: Option<Instant>,
}

impl Clock {
    /// A clock that knows the draft model's forward when the drafter
    /// measured one, and the verifier's step when it sent one.
    pub(super) fn starting(forward_secs: Option<f64>, step_secs: Option<f64>) -> Clock {
        Clock {
            forward_secs,
            live: LiveTimes::starting(step_secs),
            last_draft: (0.0, 0, 0),
            untimed: None,
            last_outcome: None,
        }
    }

    /// Settles the outcome applied last, arrived at `now`: learns the draft
    /// model's forward from its tree's levels, and returns it with the
    /// seconds since the previous outcome (`None` for the first outcome,
    /// which only starts the clock, or when none awaits its time).
    pub(super) fn settle(&mut self, now: Instant) -> Option<(Untimed, f64)> {
        let u = self.untimed.take()?;
        if u.model_forwards > 0 && u.caught_up <= MAX_LEVEL_CATCH_UP {
            let per = u.draft_secs / u.model_forwards as f64;
            let avg = self
                .forward_secs
                .map_or(per, |f| f + FORWARD_EMA * (per - f));
            self.forward_secs = Some(avg);
        }
        let prev = self.last_outcome.replace(now)?;
        Some((u, now.saturating_duration_since(prev).as_secs_f64()))
    }
}
