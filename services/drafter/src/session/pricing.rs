//! What the session's policy is told before it decides: what earlier
//! sessions of its workload learned, the price of a draft model's tree
//! level, the cost of switching to the model, and the deepest model tree
//! that reaches the verifier in time.

use specmesh_draft::{Arm, Learned, SpecPolicy};

use super::DraftSession;

impl DraftSession {
    /// The arms the session chooses among.
    pub fn arms(&self) -> impl Iterator<Item = Arm> + '_ {
        self.arms.arms()
    }

    /// Each arm's policy, for the record of what the session measured.
    pub fn policies(&self) -> impl Iterator<Item = (Arm, &SpecPolicy)> + '_ {
        self.arms
            .arms()
            .filter_map(|a| self.arms.policy(a).map(|p| (a, p)))
    }

    /// The deepest tree the session drafts.
    pub fn max_depth(&self) -> usize {
        self.terms.max_depth
    }

    /// Starts `arm` from what earlier sessions of the workload learned.
    pub fn seed(&mut self, arm: Arm, learned: &Learned) {
        self.arms.seed(arm, learned);
    }

    /// Prices each arm's tree levels at the draft model's forward over the
    /// verifier's plain step, less the share that drafting ahead hides.
    pub(super) fn price_levels(&mut self) {
        let exposed = self.exposed_drafting();
        for &arm in self.drafter.arms() {
            let forward = self.clock.forward_secs.filter(|_| arm.uses_model());
            let Some(p) = self.arms.policy_mut(arm) else {
                continue;
            };
            if let (Some(f), Some(unit)) = (forward, p.timing().plain_secs()) {
                p.set_level_cost(f / unit * exposed);
            }
        }
    }

    /// Caps the model's arms at the depth that reaches the verifier before
    /// its deadline (see [`super::deadline`]). Drafting ahead in a batch, a guess
    /// that holds is ready at the outcome: its depth is bounded as a
    /// guess's instead, where the batch's short wait would leave none.
    pub(super) fn cap_model_depth(&mut self, batch: usize) {
        let cap = if self.guesses.on && batch > 1 {
            None
        } else {
            self.clock.live.tree_depth(self.clock.forward_secs)
        };
        for &arm in self.drafter.arms() {
            if arm.uses_model() {
                self.arms.set_depth_cap(arm, cap);
            }
        }
    }

    /// Tells the arms what the draft model's catch-up on the context would
    /// cost now, in plain steps.
    pub(super) fn price_switches(&mut self) {
        let secs = self.drafter.catch_up_secs(self.context.len());
        for &arm in self.drafter.arms() {
            if !arm.uses_model() {
                continue;
            }
            let unit = self.arms.policy(arm).and_then(|p| p.timing().plain_secs());
            if let Some(unit) = unit {
                self.arms.set_switch_cost(arm, secs / unit);
            }
        }
    }
}
