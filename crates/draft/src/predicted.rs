//! Predicted outputs: the caller's expected text (OpenAI's `prediction`,
//! e.g. the file an editor asks the model to rewrite) as a draft source.
//! The target still decides every token, so drafting from it is lossless;
//! where the output follows the prediction, whole stretches of it are
//! accepted in one step.
//!
//! The drafter keeps a cursor into the prediction: the position right after
//! the last output token that followed it. While the output keeps to the
//! prediction (the cursor advances by exactly what was committed), it
//! proposes the next stretch as one chain. Once the output diverges (an
//! edit), it re-synchronises: the output's last n tokens (n from
//! [`PredictedConfig::max_ngram`] down to `min_ngram`) are looked up in an
//! n-gram index of the prediction, and the occurrence nearest after the
//! old cursor wins (an edit that deleted text skips ahead; one that
//! inserted text comes back where it left), else the nearest before it.
//!
//! Scores are `rate^depth`, `rate` the per-token acceptance observed for
//! this session's prediction (decayed counts from a prior of 0.6, weighing
//! about the last ten steps), so the chain competes with the other
//! drafters' nodes in a merge on the same footing: the probability that
//! the target accepts the path. A more trusting prior (0.8, slower to
//! learn) deepened trees past the edits of code-edit answers and cost
//! SmolLM2-135M 13% against automatic speculation alone (docs/lab/drafting.md).

use specmesh_tree::TokenTree;

use crate::merged::candidates::Candidates;
use crate::merged::hashing::{FastMap, mix};
use crate::merged::rate::{Rate, survived};
use crate::merged::{checked_root, fallback};
use crate::{DraftContext, Drafter, Feedback};

/// Tuning of [`Predicted`]; out-of-range values are clamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PredictedConfig {
    /// Shortest run of output tokens that re-synchronises (≥ 1).
    pub min_ngram: usize,
    /// Longest run tried first (≤ 8).
    pub max_ngram: usize,
}

impl Default for PredictedConfig {
    fn default() -> PredictedConfig {
        PredictedConfig {
            min_ngram: 2,
            max_ngram: 4,
        }
    }
}

/// The prior acceptance of a prediction's tokens, worth two observations,
/// learned over about the last ten (see the module docs for why not more).
fn prior() -> Rate {
    Rate::new(0.6, 2.0, 0.9)
}

/// The predicted-output drafter of one session; see the module docs.
#[derive(Debug)]
pub struct Predicted {
    cfg: PredictedConfig,
    prediction: Vec<u32>,
    /// `(hash of an n-gram, n)` → the positions where it ends, ascending.
    index: FastMap<u64, Vec<u32>>,
    /// Where the next output token is expected in the prediction, and how
    /// long the context was then; `None` once diverged, until re-synced.
    cursor: Option<(usize, usize)>,
    /// The last cursor held, to re-synchronise near it.
    last_cursor: usize,
    rate: Rate,
    /// The chain proposed last step (prediction positions) and its root.
    last: Option<(u32, usize, usize)>,
    cands: Candidates,
}

impl Predicted {
    /// A drafter expecting the output to be `prediction`, from the first
    /// output token on (`prompt_len` is where the output starts).
    pub fn new(prediction: Vec<u32>, prompt_len: usize, cfg: PredictedConfig) -> Predicted {
        let max_ngram = cfg.max_ngram.clamp(1, 8);
        let cfg = PredictedConfig {
            min_ngram: cfg.min_ngram.clamp(1, max_ngram),
            max_ngram,
        };
        let mut index: FastMap<u64, Vec<u32>> = FastMap::default();
        for end in 1..=prediction.len().min(u32::MAX as usize) {
            let mut h = 0u64;
            for n in 1..=cfg.max_ngram.min(end) {
                h = mix(h, prediction[end - n]);
                if n >= cfg.min_ngram {
                    index.entry(mix(h, n as u32)).or_default().push(end as u32);
                }
            }
        }
        Predicted {
            cfg,
            prediction,
            index,
            cursor: Some((0, prompt_len)),
            last_cursor: 0,
            rate: prior(),
            last: None,
            cands: Candidates::new(),
        }
    }

    /// The prediction's length in tokens.
    pub fn len(&self) -> usize {
        self.prediction.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prediction.is_empty()
    }

    /// Where the next token is expected in the prediction, given the whole
    /// context; moves the cursor.
    fn locate(&mut self, tokens: &[u32]) -> Option<usize> {
        if let Some((at, seen)) = self.cursor {
            // Still following: what came since is the prediction's next part.
            if let Some(new) = tokens.get(seen..)
                && self.prediction.get(at..at + new.len()) == Some(new)
            {
                let at = at + new.len();
                self.cursor = Some((at, tokens.len()));
                self.last_cursor = at;
                return Some(at);
            }
            self.cursor = None;
        }
        let at = self.resync(tokens)?;
        self.cursor = Some((at, tokens.len()));
        self.last_cursor = at;
        Some(at)
    }

    /// The end of the occurrence of the context's last n tokens nearest
    /// after the last cursor (else nearest before), longest n first.
    fn resync(&self, tokens: &[u32]) -> Option<usize> {
        for n in (self.cfg.min_ngram..=self.cfg.max_ngram).rev() {
            let Some(tail) = tokens.len().checked_sub(n).map(|s| &tokens[s..]) else {
                continue;
            };
            let h = tail.iter().rev().fold(0u64, |h, &x| mix(h, x));
            let Some(ends) = self.index.get(&mix(h, n as u32)) else {
                continue;
            };
            let real = |&&e: &&u32| self.prediction[e as usize - n..e as usize] == *tail;
            let split = ends.partition_point(|&e| (e as usize) < self.last_cursor);
            let after = ends[split..].iter().find(real);
            let before = || ends[..split].iter().rev().find(real);
            if let Some(&e) = after.or_else(before) {
                return Some(e as usize);
            }
        }
        None
    }
}

impl Drafter for Predicted {
    fn name(&self) -> &'static str {
        "prediction"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let Some(root) = checked_root(ctx) else {
            return fallback(ctx);
        };
        self.last = None;
        let limits = ctx.limits;
        let Some(at) = self.locate(ctx.tokens) else {
            return TokenTree::placeholder(Some(root), limits);
        };
        let depth = limits
            .max_depth
            .min(limits.max_nodes.saturating_sub(1))
            .min(self.prediction.len() - at);
        if depth == 0 {
            return TokenTree::placeholder(Some(root), limits);
        }
        self.cands.reset(root, limits);
        let rate = self.rate.mean();
        let (mut node, mut score, mut taken) = (0, 1.0f32, 0);
        for &tok in &self.prediction[at..at + depth] {
            if tok >= limits.vocab {
                break;
            }
            score *= rate;
            match self.cands.insert(node, tok, score) {
                Some(c) => node = c,
                None => break,
            }
            taken += 1;
        }
        if taken > 0 {
            self.last = Some((root, at, taken));
        }
        self.cands.build()
    }

    /// Learns the acceptance rate from how much of the last chain survived
    /// into the verified tree (walked by token) and was committed.
    fn observe(&mut self, feedback: &Feedback<'_>) {
        let Some((root, at, len)) = self.last.take() else {
            return;
        };
        if root != feedback.tree.root_token() {
            return;
        }
        let chain = &self.prediction[at..at + len];
        let (accepted, offered) = survived(feedback.tree, chain, feedback.committed);
        if offered > 0 {
            self.rate.observe(accepted, offered);
        }
    }
}

#[cfg(test)]
mod tests;
