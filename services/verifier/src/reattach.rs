//! Re-attaching a session to a drafter after it lost its own (or never
//! reached it). The session decodes plain meanwhile; the link to the next
//! drafter is opened in the background, so a dead or slow endpoint never
//! holds up a step, and the session sends it the start, with the context
//! committed by then, at the first step boundary after it opened.
//!
//! Endpoints are tried in the gateway's order for the tenant (the run's
//! fallbacks), then the session's own drafter again (a restarted pod comes
//! back at its address), round and round; each failed try doubles the
//! wait before the next, from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`] (with
//! jitter, so sessions that lost the same drafter do not retry in step),
//! and a link that opens resets it.

use std::time::Duration;

use specmesh_server::backoff::Backoff;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::draft_link::{DraftLink, DrafterChannels, LinkLost};
use crate::validate::DraftPlan;

/// Wait after the first failed try.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Longest wait between tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Which endpoint to try next, and when: the schedule alone, no I/O.
#[derive(Debug)]
pub struct Schedule {
    endpoints: Vec<String>,
    next: usize,
    backoff: Backoff,
    not_before: Instant,
}

impl Schedule {
    /// The run's fallbacks, then its own drafter; a first try is due now.
    pub fn new(plan: &DraftPlan, now: Instant) -> Schedule {
        let mut endpoints: Vec<String> = Vec::with_capacity(plan.fallbacks.len() + 1);
        for e in plan.fallbacks.iter().chain(std::iter::once(&plan.endpoint)) {
            if !endpoints.contains(e) {
                endpoints.push(e.clone());
            }
        }
        Schedule {
            endpoints,
            next: 0,
            backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
            not_before: now,
        }
    }

    /// The endpoint to try now, if a try is due; moves on to the next.
    pub fn due(&mut self, now: Instant) -> Option<&str> {
        if now < self.not_before || self.endpoints.is_empty() {
            return None;
        }
        let i = self.next;
        self.next = (i + 1) % self.endpoints.len();
        Some(&self.endpoints[i])
    }

    /// The try failed: the next one waits the back-off, which grows.
    pub fn failed(&mut self, now: Instant) {
        self.not_before = now + self.backoff.next_wait();
    }

    /// A link opened: should it be lost too, the next try is due at once.
    pub fn attached(&mut self, now: Instant) {
        self.backoff.reset();
        self.not_before = now;
    }
}

/// The schedule and the link being opened, if one is.
#[derive(Debug)]
pub struct Reattach {
    schedule: Schedule,
    pending: Option<(String, JoinHandle<Result<DraftLink, LinkLost>>)>,
}

impl Reattach {
    pub fn new(plan: &DraftPlan) -> Reattach {
        Reattach {
            schedule: Schedule::new(plan, Instant::now()),
            pending: None,
        }
    }

    /// At a step boundary of a session without a drafter: a link that has
    /// opened since (its endpoint, to send the start to), else starts the
    /// next try if one is due. Never waits on the network.
    pub async fn poll(
        &mut self,
        channels: &DrafterChannels,
        connect_timeout: Duration,
    ) -> Option<(String, DraftLink)> {
        let now = Instant::now();
        if let Some((endpoint, task)) = self.pending.take() {
            if !task.is_finished() {
                self.pending = Some((endpoint, task));
                return None;
            }
            match task.await {
                Ok(Ok(link)) => return Some((endpoint, link)),
                Ok(Err(e)) => tracing::debug!(error = %e, "re-attaching: no drafter yet"),
                Err(e) => tracing::warn!(error = %e, "re-attaching: the try panicked"),
            }
            self.schedule.failed(now);
            return None;
        }
        let endpoint = self.schedule.due(now)?.to_owned();
        let channels = channels.clone();
        let target = endpoint.clone();
        let task =
            tokio::spawn(
                async move { DraftLink::connect(&channels, &target, connect_timeout).await },
            );
        self.pending = Some((endpoint, task));
        None
    }

    /// The link from [`Reattach::poll`] took the session's start.
    pub fn attached(&mut self) {
        self.schedule.attached(Instant::now());
    }

    /// The link from [`Reattach::poll`] closed before taking the start.
    pub fn failed(&mut self) {
        self.schedule.failed(Instant::now());
    }
}

impl Drop for Reattach {
    fn drop(&mut self) {
        // A session that ends stops its try; the drafter sees a stream end
        // with no start, which it ignores.
        if let Some((_, task)) = self.pending.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::validate::test_plan as plan;

    #[test]
    fn fallbacks_come_first_then_the_own_drafter_round_and_round() {
        let t0 = Instant::now();
        let mut s = Schedule::new(&plan("a", &["b", "c", "a"]), t0);
        let mut tried = Vec::new();
        for _ in 0..5 {
            tried.push(s.due(t0).unwrap().to_owned());
        }
        assert_eq!(tried, ["b", "c", "a", "b", "c"]);
        let mut alone = Schedule::new(&plan("a", &[]), t0);
        assert_eq!(alone.due(t0), Some("a"));
        assert_eq!(alone.due(t0), Some("a"));
    }

    #[test]
    fn each_failure_doubles_the_wait_up_to_the_cap_and_an_attach_resets_it() {
        let t0 = Instant::now();
        let mut s = Schedule::new(&plan("a", &["b"]), t0);
        assert!(s.due(t0).is_some());
        let mut now = t0;
        for base in [250u64, 500, 1000, 2000, 4000, 4000] {
            s.failed(now);
            let wait = s.not_before - now;
            assert!(s.due(now + wait - Duration::from_millis(1)).is_none());
            assert!(s.due(now + wait).is_some());
            // The step, plus up to as much again of jitter.
            let ms = wait.as_millis() as u64;
            assert!(
                (base..2 * base).contains(&ms),
                "{ms} ms for a {base} ms step"
            );
            now += wait;
        }
        s.attached(now);
        assert!(s.due(now).is_some(), "a lost link is retried at once");
        s.failed(now);
        assert!(
            (s.not_before - now).as_millis() < 500,
            "the back-off starts over"
        );
    }
}
