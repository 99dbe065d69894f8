//! The node budget a verifier expects to grant a session next step, sent
//! to its drafter with every outcome: the one rule for tree sizes across
//! the mesh. The drafter proposes at most that; the planner prunes to what
//! it grants.
//!
//! When the planner cut the last tree, the grant was binding and the
//! forecast moves towards it. When it verified the whole tree, the drafter
//! could have been given more, so the forecast moves towards twice the
//! grant (at least [`GROW_FLOOR`]), up to the session's maximum. Moving
//! half-way each step keeps one odd batch from swinging the drafter's trees.
//! A step without a tree (plain, or a span) leaves it as it was.

/// The smallest budget an unconstrained grant grows towards.
pub const GROW_FLOOR: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forecast {
    budget: usize,
    max: usize,
}

impl Forecast {
    /// A session that may draft up to `max` nodes starts with all of it.
    pub fn new(max: usize) -> Forecast {
        Forecast { budget: max, max }
    }

    /// Drafted nodes the verifier expects to grant next step.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The drafter proposed `proposed` nodes and the planner granted
    /// `granted` of them.
    pub fn observe(&mut self, proposed: usize, granted: usize) {
        if proposed == 0 {
            return;
        }
        let granted = granted.min(proposed);
        let target = if granted < proposed {
            granted
        } else {
            (2 * granted).max(GROW_FLOOR).min(self.max)
        };
        // Half-way, rounding towards the target so it is reached.
        self.budget = if target >= self.budget {
            self.budget + (target - self.budget).div_ceil(2)
        } else {
            self.budget - (self.budget - target).div_ceil(2)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_trees_shrink_the_forecast_and_whole_ones_grow_it() {
        let mut f = Forecast::new(16);
        assert_eq!(f.budget(), 16);
        f.observe(16, 2);
        assert_eq!(f.budget(), 9);
        f.observe(9, 2);
        f.observe(5, 2);
        f.observe(3, 2);
        assert_eq!(f.budget(), 2);
        f.observe(2, 0);
        assert_eq!(f.budget(), 1);
        f.observe(1, 0);
        assert_eq!(f.budget(), 0);
        // Nothing proposed: unchanged.
        f.observe(0, 0);
        assert_eq!(f.budget(), 0);
        // Whole trees grow it back, never past the maximum.
        let mut f = Forecast::new(16);
        f.observe(16, 1);
        f.observe(9, 1);
        f.observe(5, 1);
        f.observe(3, 1);
        assert_eq!(f.budget(), 1);
        f.observe(1, 1);
        assert_eq!(f.budget(), 3);
        for _ in 0..10 {
            let b = f.budget();
            f.observe(b, b);
        }
        assert_eq!(f.budget(), 16);
        // A grant above the proposal is the proposal.
        f.observe(4, 40);
        assert!(f.budget() <= 16);
    }
}
