//! The outcome a session owes its drafter: that of one step, or of every
//! step a span stood for (a tree with no nodes whose `span` covers several
//! steps), gathered as the steps are verified and sent as one
//! `StepOutcome` after the last.

use specmesh_engine::Step;

/// An outcome being gathered; see the module docs.
#[derive(Debug)]
pub struct Report {
    /// The first step reported.
    first: u64,
    /// The last step reported: the outcome is due once it is verified.
    last: u64,
    /// Steps verified so far.
    added: u64,
    path: Vec<u32>,
    committed: Vec<u32>,
    /// Committed tokens after the path's that the grammar forced.
    forced: u32,
    top_k: Vec<Vec<(u32, f32)>>,
    /// Microseconds its steps waited for the drafter's tree.
    wait_us: u64,
    /// The verified nodes, when the planner verified part of the tree.
    granted: Option<Vec<u32>>,
    /// The planner's forecast for the next tree.
    node_budget: Option<u32>,
    /// The last step's forward, and how long after it the verifier waits
    /// for the next tree, in microseconds.
    forward_us: u32,
    tree_deadline_us: u32,
}

impl Report {
    /// The report of steps `first..=last`.
    pub fn new(first: u64, last: u64) -> Report {
        debug_assert!(last >= first);
        Report {
            first,
            last: last.max(first),
            added: 0,
            path: Vec::new(),
            committed: Vec::new(),
            forced: 0,
            top_k: Vec::new(),
            wait_us: 0,
            granted: None,
            node_budget: None,
            forward_us: 0,
            tree_deadline_us: 0,
        }
    }

    /// The forward that verified the step just added took `us`, and the
    /// verifier waits `deadline_us` after it for the next tree.
    pub fn forward(&mut self, us: u32, deadline_us: u32) {
        self.forward_us = us;
        self.tree_deadline_us = deadline_us;
    }

    /// Adds what a step waited for the drafter's tree.
    pub fn waited(&mut self, us: u32) {
        self.wait_us += u64::from(us);
    }

    /// Adds the next step's verification: `offered` drafted nodes were
    /// proposed for it, of which the planner verified `granted` (`None`:
    /// all); `node_budget` is its forecast for the next tree.
    pub fn add(
        &mut self,
        step: &Step,
        offered: usize,
        granted: Option<Vec<u32>>,
        node_budget: Option<u32>,
    ) {
        let v = &step.verification;
        // Only a tree with nodes has a path to report (in the drafter's
        // indices, even where the planner verified part of it), and such
        // a tree stands for its step alone.
        if offered > 0 {
            debug_assert_eq!(self.first, self.last);
            self.path = v.path.iter().map(|&n| n as u32).collect();
            self.granted = granted;
        }
        self.node_budget = node_budget;
        self.committed.extend_from_slice(&v.accepted);
        self.committed.push(v.bonus);
        self.forced += step.forced as u32;
        self.top_k.extend(v.top_k.iter().cloned());
        self.added += 1;
    }

    /// Whether every step reported has been added: the outcome is due.
    pub fn is_complete(&self) -> bool {
        self.first + self.added > self.last
    }

    /// The outcome, with the verifier's batch size at the last step.
    pub fn into_outcome(self, batch_size: usize) -> Outcome {
        Outcome {
            step: self.last,
            span: (self.last - self.first + 1) as u32,
            path: self.path,
            committed: self.committed,
            forced: self.forced,
            top_k: self.top_k,
            batch_size: batch_size as u32,
            tree_wait_us: self.wait_us,
            node_budget: self.node_budget,
            granted: self.granted,
            forward_us: self.forward_us,
            tree_deadline_us: self.tree_deadline_us,
        }
    }
}

/// What the target did with the steps a tree stood for, for the drafter.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The last step reported.
    pub step: u64,
    /// Steps reported, `step` the last.
    pub span: u32,
    /// The accepted nodes (the drafter's indices), for a tree with nodes.
    pub path: Vec<u32>,
    /// Every token the steps committed.
    pub committed: Vec<u32>,
    /// Tokens of `committed` after the path's that the grammar forced.
    pub forced: u32,
    /// The target's top-k (token, log-probability) per accepted node.
    pub top_k: Vec<Vec<(u32, f32)>>,
    pub batch_size: u32,
    pub tree_wait_us: u64,
    pub node_budget: Option<u32>,
    /// The verified nodes, when the planner verified part of the tree.
    pub granted: Option<Vec<u32>>,
    pub forward_us: u32,
    pub tree_deadline_us: u32,
}
