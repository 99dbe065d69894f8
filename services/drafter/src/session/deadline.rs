//! When a model tree must be ready, from live times.
//!
//! **A tree drafted on an outcome.** The verifier waits for the session's
//! next tree only so long after its forward (each outcome says how long,
//! `StepOutcome.tree_deadline_us`): while other sessions decode, it holds
//! the batch's next forward a short while for a missing tree, and a later
//! one misses that forward and waits a whole one; alone, it waits up to
//! its draft timeout, and a later tree is not verified at all. A tree
//! drafted after the outcome has that deadline less the link's round trip
//! to be drafted in, and a model tree of depth `D` costs `D` draft model
//! forwards (the first catches the model up and gives the root's
//! children). So the model's arms are capped at the depth that fits, and
//! at 0 draft nothing: the policy then drafts model-free, or not at all.
//! (Within the deadline, what drafting costs a session that the verifier
//! waits for is priced per level by the policy.) A session that drafts
//! ahead is not capped so: its guesses are bounded as below.
//!
//! **Drafting ahead.** A guess drafted ahead (see `guess`) runs while the verifier verifies the
//! tree before it. It pays only if it is done when that tree's outcome
//! arrives: from then on the verifier waits on it, and a guess grown past
//! that point is a tree drafted late. The time it has is the verifier's
//! forward (each outcome reports it, `StepOutcome.forward_us`) plus the
//! link's round trip (the verifier's wait for a tree, less the drafting
//! the drafter did for it after the outcome came). Each level of the
//! guess costs one draft model forward, measured continuously
//! (`forward_secs`, a moving average of every tree's levels), and the
//! first forward catches the model up on the guessed path. So a guess
//! gets as many levels as forwards fit in that window, and none when fewer
//! than two do: one level only guesses the next token, which leaves no
//! tree under it. A guess still running when its outcome comes is stopped
//! at its next level if the outcome does not bear out the path it assumed
//! (see `stream`); one that holds is the next tree and finishes.
//!
//! Both times are moving averages, so one slow forward shortens the next
//! guesses for a few steps rather than switching drafting ahead off.

use super::DraftSession;

/// Weight of a new sample in the verifier's forward time and the link's
/// round trip.
const TIME_EMA: f64 = 0.2;

/// The window's share a guess plans to fill: a forward that runs a little
/// long must not make the guess late.
const WINDOW_SHARE: f64 = 0.9;

/// Live times of the verifier and the link, as one session saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct LiveTimes {
    /// The verifier's batched forward, seconds (moving average).
    pub(super) verify_secs: Option<f64>,
    /// The round trip between outcome and tree beyond the drafting,
    /// seconds (moving average).
    pub(super) link_secs: Option<f64>,
    /// How long after its forward the verifier waits for the next tree,
    /// as the last outcome said (seconds; `None`: not said).
    pub(super) deadline_secs: Option<f64>,
}

fn ema(old: Option<f64>, sample: f64) -> f64 {
    old.map_or(sample, |o| o + TIME_EMA * (sample - o))
}

impl LiveTimes {
    /// Before any outcome, the verifier's one-token step as it declared it
    /// at start (`DraftStart.target_step_seconds`) stands for its forward:
    /// a tree's forward takes at least that long, so the first guesses are
    /// not sized for a window longer than they will have.
    pub(super) fn starting(step_secs: Option<f64>) -> LiveTimes {
        LiveTimes {
            verify_secs: step_secs.filter(|s| s.is_finite() && *s > 0.0),
            ..LiveTimes::default()
        }
    }

    /// An outcome reported a forward of `forward_us` (0: not measured) and
    /// a wait of `tree_wait_us` for a tree the drafter spent `draft_secs`
    /// on after the outcome before it came. `clean`: nothing else held the
    /// drafter between the outcome before and the tree (no guess was
    /// running), so the wait less the drafting is the link's.
    pub(super) fn observe(
        &mut self,
        forward_us: u32,
        tree_wait_us: u64,
        draft_secs: f64,
        clean: bool,
    ) {
        if forward_us > 0 {
            self.verify_secs = Some(ema(self.verify_secs, f64::from(forward_us) * 1e-6));
        }
        if clean && tree_wait_us > 0 {
            let link = (tree_wait_us as f64 * 1e-6 - draft_secs).max(0.0);
            self.link_secs = Some(ema(self.link_secs, link));
        }
    }

    /// The verifier waits `deadline_us` after its forward for the next
    /// tree (0: not said).
    pub(super) fn observe_deadline(&mut self, deadline_us: u32) {
        self.deadline_secs = (deadline_us > 0).then(|| f64::from(deadline_us) * 1e-6);
    }

    /// The deepest model tree, drafted after an outcome, that reaches the
    /// verifier before its deadline at `forward_secs` a level; `None`: no
    /// cap (the deadline or the forward not known yet).
    pub(super) fn tree_depth(&self, forward_secs: Option<f64>) -> Option<usize> {
        let (wait, f) = (self.deadline_secs?, forward_secs.filter(|f| *f > 0.0)?);
        let room = (wait - self.link_secs.unwrap_or(0.0)).max(0.0);
        let fits = (room / f).floor();
        Some(if fits.is_finite() { fits as usize } else { 0 })
    }

    /// Seconds from sending a tree until its outcome arrives, once the
    /// verifier's forward has been reported.
    pub(super) fn window(&self) -> Option<f64> {
        self.verify_secs
            .map(|v| (v + self.link_secs.unwrap_or(0.0)) * WINDOW_SHARE)
    }

    /// The depth of a guess whose levels take `forward_secs` each, at most
    /// `wanted`: `None` when the window is not known yet (the guess is
    /// drafted as planned), `Some(0)` when no useful guess fits.
    pub(super) fn guess_depth(&self, forward_secs: Option<f64>, wanted: usize) -> Option<usize> {
        let (window, f) = (self.window()?, forward_secs.filter(|f| *f > 0.0)?);
        let fits = (window / f).floor();
        let fits = if fits.is_finite() { fits as usize } else { 0 };
        Some(if fits < 2 { 0 } else { fits.min(wanted) })
    }
}

impl DraftSession {
    /// The verifier's forward and the link's round trip as measured.
    pub fn live_times(&self) -> (Option<f64>, Option<f64>) {
        (self.clock.live.verify_secs, self.clock.live.link_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_window_before_the_verifier_reports_its_forward() {
        let mut t = LiveTimes::default();
        assert_eq!(t.guess_depth(Some(0.01), 9), None);
        t.observe(0, 5_000, 0.001, true);
        assert_eq!(t.guess_depth(Some(0.01), 9), None);
        assert!((t.link_secs.unwrap() - 0.004).abs() < 1e-9);
    }

    #[test]
    fn a_guess_gets_the_levels_that_fit_before_the_outcome() {
        let mut t = LiveTimes::default();
        // A 120 ms forward and a 5 ms link: 112.5 ms to fill at 90%.
        t.observe(120_000, 15_000, 0.010, true);
        assert!((t.window().unwrap() - 0.1125).abs() < 1e-9);
        // SmolLM2-sized levels (10 ms): 11 fit; the plan wants 9.
        assert_eq!(t.guess_depth(Some(0.010), 9), Some(9));
        // A 0.5B-sized draft (60 ms a level): only one forward fits, which
        // leaves no tree under the guessed token.
        assert_eq!(t.guess_depth(Some(0.060), 9), Some(0));
        // 40 ms a level: two forwards, a guess of depth 2.
        assert_eq!(t.guess_depth(Some(0.040), 9), Some(2));
    }

    #[test]
    fn a_wait_held_up_by_a_guess_teaches_nothing_about_the_link() {
        let mut t = LiveTimes::default();
        t.observe(100_000, 40_000, 0.0, false);
        assert_eq!(t.link_secs, None);
        t.observe(100_000, 3_000, 0.001, true);
        t.observe(100_000, 3_000, 0.001, true);
        assert!((t.link_secs.unwrap() - 0.002).abs() < 1e-9);
        // The drafting took longer than the wait (clock skew between the
        // two processes' measurements): no negative link.
        t.observe(100_000, 1_000, 0.005, true);
        assert!(t.link_secs.unwrap() >= 0.0);
    }

    #[test]
    fn a_model_tree_gets_the_levels_that_fit_before_the_deadline() {
        let mut t = LiveTimes::default();
        t.observe(120_000, 2_000, 0.0, true);
        // Before the verifier said how long it waits: no cap.
        assert_eq!(t.tree_depth(Some(0.003)), None);
        // In a batch, a 12 ms wait less a 2 ms link: three 3 ms levels fit.
        t.observe_deadline(12_000);
        assert_eq!(t.tree_depth(Some(0.003)), Some(3));
        assert_eq!(t.tree_depth(None), None);
        // An 11 ms forward a level: not even one fits.
        assert_eq!(t.tree_depth(Some(0.011)), Some(0));
        // Alone, a 200 ms draft timeout: 13 levels of 15 ms.
        t.observe_deadline(200_000);
        assert_eq!(t.tree_depth(Some(0.015)), Some(13));
        t.observe_deadline(0);
        assert_eq!(t.tree_depth(Some(0.003)), None);
    }

    #[test]
    fn the_declared_step_sizes_the_first_guesses() {
        let t = LiveTimes::starting(Some(0.050));
        assert_eq!(t.guess_depth(Some(0.010), 9), Some(4));
        assert_eq!(LiveTimes::starting(Some(f64::NAN)), LiveTimes::default());
    }

    #[test]
    fn one_slow_forward_moves_the_average_a_fifth() {
        let mut t = LiveTimes::default();
        t.observe(100_000, 0, 0.0, true);
        t.observe(600_000, 0, 0.0, true);
        assert!((t.verify_secs.unwrap() - 0.2).abs() < 1e-9);
    }
}
