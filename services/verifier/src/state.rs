//! What every session of the process shares, and the gauges that count
//! sessions while they live.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use specmesh_model::Model;
use specmesh_proto::v1;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::allowed_drafters::Drafters;
use crate::batcher::Batcher;
use crate::config::Config;
use crate::draft_link::DrafterChannels;
use crate::error::VerifierError;
use crate::memory::KvMemory;
use crate::validate::{RunLimits, ValidRun};

/// Everything sessions share.
#[derive(Debug)]
pub struct State {
    pub config: Config,
    pub model: Arc<Model>,
    pub batcher: Batcher,
    pub memory: KvMemory,
    pub channels: DrafterChannels,
    /// The drafters a draft plan may name.
    pub drafters: Arc<Drafters>,
    pub eos: Vec<u32>,
    /// Compiles the runs' `structured` constraints (cached by text).
    pub grammars: Arc<specmesh_grammar::Grammars>,
    pub vocab: u32,
    /// The target as drafters are told it: its name and vocabulary.
    pub target: Target,
    pub cost_curve: Vec<(usize, f64)>,
    /// One permit per running session: admission takes one or refuses, in
    /// one atomic step, so concurrent calls cannot slip past the limit.
    pub slots: Arc<Semaphore>,
    /// Sessions past prefill: the batcher waits for their trees.
    pub decoding: Arc<AtomicUsize>,
}

impl State {
    pub fn cost_curve_wire(&self) -> Vec<v1::CostPoint> {
        self.cost_curve
            .iter()
            .map(|&(k, c)| v1::CostPoint {
                tokens: k as u32,
                relative_cost: c,
            })
            .collect()
    }

    /// What a run is validated against.
    pub fn run_limits(&self) -> RunLimits {
        RunLimits {
            vocab: self.vocab,
            max_context: self.model.config().max_context,
            max_draft_tokens: self.config.max_draft_tokens,
        }
    }

    /// Tokens of KV a run may need: its context, its output and one tree.
    pub fn kv_tokens(&self, run: &ValidRun) -> usize {
        let tree = run.draft.as_ref().map_or(1, |d| d.max_draft_tokens + 1);
        (run.tokens.len() + run.max_new_tokens + tree).min(self.model.config().max_context)
    }

    /// A session slot, or BUSY when every one is taken.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, VerifierError> {
        Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| VerifierError::Busy {
                max: self.config.max_sessions,
            })
    }

    /// Sessions admitted and not yet ended.
    pub fn running(&self) -> usize {
        self.config.max_sessions - self.slots.available_permits()
    }
}

/// The target model as a drafter checks its draft model against it.
#[derive(Debug, Clone)]
pub struct Target {
    /// `--model` as given (a catalog name or a path).
    pub name: String,
    /// [`specmesh_tokenizer::Tokenizer::vocab_fingerprint`] of its tokenizer.
    pub vocab_fingerprint: u64,
    /// Seconds of one forward over one token, measured at start-up.
    pub step_seconds: f64,
}

/// Counts a value up while it lives (decoding sessions).
#[derive(Debug)]
pub struct Gauge(Arc<AtomicUsize>);

impl Gauge {
    pub fn up(counter: &Arc<AtomicUsize>) -> Gauge {
        counter.fetch_add(1, Ordering::Relaxed);
        Gauge(Arc::clone(counter))
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
