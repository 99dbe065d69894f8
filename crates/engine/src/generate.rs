//! The whole speculative loop in one process: draft, verify, commit, feed
//! back. The services split exactly these calls across processes.

use std::time::Instant;

use specmesh_draft::{DraftContext, Drafter, Feedback};
use specmesh_model::Model;
use specmesh_sampling::SamplingParams;
use specmesh_tree::{TokenTree, TreeLimits};

use crate::EngineError;
use crate::batch::step_batch;
use crate::session::{Finish, Session, SessionLimits};

/// Speculation counters of one generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub verify_steps: usize,
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Time spent in the drafter's `propose` and `observe`.
    pub draft_seconds: f64,
}

impl Stats {
    /// Committed tokens per verify step, bonus included (plain = 1.0).
    pub fn mean_accepted_per_step(&self, committed: usize) -> f64 {
        committed as f64 / self.verify_steps.max(1) as f64
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub stats: Stats,
}

/// Generates from `prompt` in-process. With `drafter == None` (or a budget
/// of one node) this is plain decoding; `budget` gives each step's tree
/// limits (the adaptive policy, or a constant). `on_commit` sees each step's
/// committed tokens as they come.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    params: SamplingParams,
    limits: SessionLimits,
    mut drafter: Option<&mut dyn Drafter>,
    budget: &mut dyn FnMut(&Session) -> TreeLimits,
    on_commit: &mut dyn FnMut(&[u32]),
) -> Result<Generation, EngineError> {
    let mut session = Session::new(model, prompt.to_vec(), prompt.len(), params, limits, None)?;
    let mut stats = Stats {
        prefill_seconds: session.prefill(model)?.1,
        ..Stats::default()
    };
    let t0 = Instant::now();
    let mut out = Vec::new();
    let vocab = model.config().vocab_size as u32;
    loop {
        let mut limits = budget(&session);
        limits.vocab = vocab;
        limits.max_nodes = limits.max_nodes.min(session.room(model) + 1).max(1);
        let t = Instant::now();
        let tree = match drafter.as_deref_mut() {
            Some(d) if limits.max_nodes > 1 => d.propose(&DraftContext {
                tokens: session.tokens(),
                prompt_len: session.prompt_len(),
                limits,
            }),
            _ => TokenTree::root_only(session.root(), limits).expect("the root is a model token"),
        };
        stats.draft_seconds += t.elapsed().as_secs_f64();
        let step = step_batch(model, &mut [(&mut session, &tree)], 8)?
            .pop()
            .expect("one step per session");
        stats.verify_steps += 1;
        stats.drafted_tokens += step.drafted;
        stats.accepted_tokens += step.accepted;
        on_commit(&step.committed);
        out.extend_from_slice(&step.committed);
        if let Some(d) = drafter.as_deref_mut() {
            let t = Instant::now();
            d.observe(&Feedback {
                tree: &tree,
                path: &step.verification.path,
                committed: &step.verification.committed(),
                top_k: &step.verification.top_k,
            });
            stats.draft_seconds += t.elapsed().as_secs_f64();
        }
        if let Some(finish) = step.finish {
            stats.decode_seconds = t0.elapsed().as_secs_f64();
            return Ok(Generation {
                tokens: out,
                finish,
                stats,
            });
        }
    }
}
