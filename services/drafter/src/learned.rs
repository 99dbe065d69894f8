//! What finished sessions taught the sessions after them: per workload and
//! arm, the acceptance per depth and the speculative overhead they
//! measured ([`specmesh_draft::Ledger`]).
//!
//! A workload is a tenant's requests for one target, greedy or sampled:
//! the separation callers already make (a code assistant and a chat front
//! are different tenants), and the one acceptance follows (sampling
//! accepts less than greedy; another target agrees differently). A new
//! session's arms start from their workload's record; an ended one adds
//! its own (a session the verifier dropped still measured its steps; one
//! ended by a bad message adds nothing). The record holds numbers only, never text,
//! and at most [`CAPACITY`] keys.

use std::sync::{Arc, Mutex};

use crate::validate::StartSpec;
use specmesh_draft::{Arm, Ledger, TenantKey};

use crate::session::DraftSession;

/// Workload × arm keys kept; the least recently used goes first.
pub const CAPACITY: usize = 4096;

/// Whose sessions learn from each other; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Workload {
    tenant: TenantKey,
    target: Arc<str>,
    greedy: bool,
}

impl Workload {
    pub fn of(spec: &StartSpec) -> Workload {
        Workload {
            tenant: spec.tenant.clone(),
            target: Arc::from(spec.target.name.as_str()),
            greedy: spec.sampling.is_greedy(),
        }
    }
}

/// The process's record of finished sessions.
#[derive(Debug)]
pub struct Learning {
    ledger: Mutex<Ledger<(Workload, Arm)>>,
}

impl Default for Learning {
    fn default() -> Learning {
        Learning {
            ledger: Mutex::new(Ledger::new(CAPACITY)),
        }
    }
}

impl Learning {
    /// Starts `session`'s arms from what `workload`'s earlier sessions
    /// learned. Returns how many sessions taught the arm taught most.
    pub fn seed(&self, workload: &Workload, session: &mut DraftSession) -> u64 {
        let depth = session.max_depth();
        let arms: Vec<Arm> = session.arms().collect();
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let mut most = 0;
        for arm in arms {
            if let Some(learned) = ledger.learned(&(workload.clone(), arm), depth) {
                most = most.max(learned.sessions);
                session.seed(arm, &learned);
            }
        }
        most
    }

    /// Adds what `session`'s arms measured to `workload`'s record.
    pub fn record(&self, workload: &Workload, session: &DraftSession) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        for (arm, policy) in session.policies() {
            ledger.record((workload.clone(), arm), policy);
        }
    }
}
