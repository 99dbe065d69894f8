//! The same decoding loops without any network: the engine and drafters
//! called directly, to measure what the distributed loop costs per round.

use std::time::Instant;

use anyhow::Result;
use specmesh_draft::{Adaptive, CostCurve, PolicyConfig, SpecPolicy};
use specmesh_engine::{Session, SessionLimits};
use specmesh_sampling::SamplingParams;
use specmesh_tree::TreeLimits;

use super::{Config, Run};
use crate::drafters::{self, DrafterKind};
use crate::specbench::Question;
use specmesh_harness::model::ModelArgs;
use specmesh_harness::prompt::encode_prompt;

pub struct InProcess {
    model: specmesh_model::Model,
    tokenizer: specmesh_tokenizer::Tokenizer,
}

impl InProcess {
    pub fn load(args: &ModelArgs) -> Result<InProcess> {
        Ok(InProcess {
            model: args.load_model()?,
            tokenizer: args.load_tokenizer()?,
        })
    }

    pub fn run(&self, q: &Question, c: Config, max_new: u32) -> Result<Run> {
        let prompt = encode_prompt(&self.tokenizer, q.prompt(), true)?;
        let vocab = self.model.config().vocab_size as u32;
        let limits = SessionLimits {
            max_new_tokens: max_new as usize,
            eos: self.tokenizer.eos_token_ids().to_vec(),
        };
        let shared = drafters::Shared::new();
        let mut drafter = Adaptive::new(
            drafters::make(DrafterKind::Merged, &shared, "bench"),
            SpecPolicy::new(CostCurve::cpu_default(), PolicyConfig::default())?,
        );
        let mut budget = |_: &Session| TreeLimits::new(65, 16, vocab);
        let t0 = Instant::now();
        let mut first = None;
        let mut on_commit = |_: &[u32]| {
            first.get_or_insert_with(Instant::now);
        };
        let g = specmesh_engine::generate(
            &self.model,
            &prompt,
            SamplingParams::greedy(),
            limits,
            (c == Config::InProcessAuto)
                .then_some(&mut drafter as &mut dyn specmesh_draft::Drafter),
            &mut budget,
            &mut on_commit,
        )?;
        let wall = t0.elapsed().as_secs_f64();
        let first = first.map_or(wall, |f| (f - t0).as_secs_f64());
        Ok(Run {
            question: q.id(),
            category: q.category.clone(),
            config: c,
            completion_tokens: g.tokens.len(),
            tokens: g.tokens,
            wall_seconds: wall,
            decode_seconds: g.stats.decode_seconds,
            ttft_seconds: first,
            inter_token_seconds: Vec::new(),
            verify_steps: g.stats.verify_steps as u32,
            drafted_tokens: g.stats.drafted_tokens as u32,
            accepted_tokens: g.stats.accepted_tokens as u32,
            tree_wait_seconds: 0.0,
            drafted_ahead_steps: 0,
        })
    }
}
