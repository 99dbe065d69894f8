//! The optional draft model: loaded once at startup, checked against the
//! target's tokenizer, and shared (`Arc`) by every session that drafts
//! with it. A draft model whose tokenizer is not the target's
//! (`--target-tokenizer` names the target's) drafts through text
//! ([`TextBridge`]); one whose tokenizer cannot is refused at start.
//!
//! Sharing is safe: [`Model::forward`] takes `&self` and serialises on the
//! model's scratch mutex, so concurrent sessions' forwards queue rather
//! than race; each session keeps its own KV [`Sequence`] inside its
//! [`ModelDrafter`]. That KV memory is why at most
//! [`DraftModelConfig::max_sessions`] sessions draft with the model at
//! once; the rest draft model-free. Their KV outlives them by prefix in
//! [`DraftKv`] (see [`crate::prefix`]).
//!
//! [`Sequence`]: specmesh_model::Sequence
//! [`ModelDrafter`]: specmesh_draft_model::ModelDrafter

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::validate::TargetModel;
use specmesh_draft_model::{BridgeError, TextBridge, TokenRanking, VocabMismatch, check_vocab};
use specmesh_model::{LoadOptions, Model, ModelError};
use specmesh_tokenizer::{Tokenizer, TokenizerError};
use tokio::sync::Semaphore;

use crate::config::DraftModelConfig;
use crate::prefix::DraftKv;

/// Why the draft model could not be set up; the process refuses to start.
/// Each variant's `source` holds the cause (print with `{:#}` or walk
/// `source()` for the whole story).
#[derive(Debug, thiserror::Error)]
pub enum DraftModelError {
    #[error("loading the draft model {path}")]
    Load {
        path: PathBuf,
        source: Box<ModelError>,
    },
    #[error("`--self-draft-layers {layers}` on {path}")]
    Truncate {
        path: PathBuf,
        layers: usize,
        source: Box<ModelError>,
    },
    #[error("reading the tokenizer of {path}")]
    Tokenizer {
        path: PathBuf,
        source: Box<TokenizerError>,
    },
    #[error("`--draft-head-tokens` with the ranking {ranking}")]
    Ranking {
        ranking: String,
        source: specmesh_draft_model::RankingError,
    },
    #[error("reading the token ranking {path}")]
    RankingFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "`--draft-head-tokens` needs a token ranking for the draft model {draft}, and none ships \
         for its tokenizer: make one with `specmesh token-ranking --model {draft} --out FILE` \
         and pass `--token-ranking FILE`"
    )]
    NoRanking { draft: PathBuf },
    #[error("`--draft-model-sha256`")]
    Digest {
        source: specmesh_catalog::digest::DigestError,
    },
    #[error("`--{flag}`")]
    Resolve {
        flag: &'static str,
        source: specmesh_catalog::CatalogError,
    },
    #[error("the draft model {draft} cannot draft for the target tokenizer {target}")]
    Vocab {
        draft: PathBuf,
        target: PathBuf,
        source: Box<VocabMismatch>,
    },
    #[error(
        "the draft model {draft} cannot draft for the target tokenizer {target}: {mismatch}; \
         and it cannot draft through text either"
    )]
    Bridge {
        draft: PathBuf,
        target: PathBuf,
        mismatch: Box<VocabMismatch>,
        #[source]
        source: Box<BridgeError>,
    },
}

/// The `n` tokens the draft head keeps: the most frequent of the ranking
/// given, or of the one shipped for the draft model's tokenizer.
fn head_tokens(
    cfg: &DraftModelConfig,
    n: usize,
    draft_tok: &Tokenizer,
) -> Result<Vec<u32>, DraftModelError> {
    let fingerprint = draft_tok.vocab_fingerprint();
    let (ranking, name) = match &cfg.token_ranking {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|source| DraftModelError::RankingFile {
                    path: path.clone(),
                    source,
                })?;
            let ranking =
                TokenRanking::parse(&text).map_err(|source| DraftModelError::Ranking {
                    ranking: path.display().to_string(),
                    source,
                })?;
            (ranking, path.display().to_string())
        }
        None => match TokenRanking::shipped(fingerprint) {
            Some((ranking, name)) => (ranking, format!("shipped {name}")),
            None => {
                return Err(DraftModelError::NoRanking {
                    draft: cfg.path.clone(),
                });
            }
        },
    };
    let keep = ranking
        .top(n, draft_tok.vocab_size(), fingerprint)
        .map_err(|source| DraftModelError::Ranking {
            ranking: name.clone(),
            source,
        })?;
    tracing::info!(
        ranking = %name,
        head_tokens = keep.len(),
        ranked = ranking.counts.len(),
        "the draft head scores only its most frequent tokens"
    );
    Ok(keep)
}

/// The loaded draft model, its identity and its session slots.
#[derive(Debug, Clone)]
pub struct DraftModel {
    model: Arc<Model>,
    /// `--draft-model` as given (a catalog name or a path), for messages.
    name: String,
    /// Its tokenizer's [`Tokenizer::vocab_fingerprint`].
    vocab_fingerprint: u64,
    /// Measured at load; `None` when the measurement failed.
    cost: Option<ForwardCost>,
    slots: Arc<Semaphore>,
    /// Set when the draft model's vocabulary is not the target's: it
    /// drafts through text for the target tokenizer given at start.
    bridge: Option<Bridged>,
    /// Its KV kept by prefix; `None` with `--draft-kv-budget-mib 0` or
    /// through text (the cache is keyed by the target's tokens).
    kv: Option<DraftKv>,
}

/// The text bridge and the fingerprint of its target tokenizer (computed
/// once at load: it hashes the whole vocabulary).
#[derive(Debug, Clone)]
struct Bridged {
    bridge: Arc<TextBridge>,
    target_fingerprint: u64,
}

/// What the draft model's forwards cost, measured once at load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForwardCost {
    /// One forward over one token: a new session prices a tree level with
    /// it before it has drafted one.
    pub forward_secs: f64,
    /// Per token of a 64-token prefill: what a session pays to catch the
    /// model up on context it has not seen.
    pub prefill_token_secs: f64,
}

impl ForwardCost {
    /// Times `model` at a short context (a few forwards: milliseconds).
    fn measure(model: &Model) -> Option<ForwardCost> {
        let timed = specmesh_model::cost::measure(model, 64, &[1, 64], 3).ok()?;
        let at = |k: usize| timed.iter().find(|s| s.k == k).map(|s| s.median);
        Some(ForwardCost {
            forward_secs: at(1)?,
            prefill_token_secs: at(64)? / 64.0,
        })
    }
}

/// Why a session cannot draft with the draft model it asked for; the
/// stream ends with FAILED_PRECONDITION and this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelRefusal {
    #[error(
        "the request asks for the draft model, but this drafter has none: start \
         specmesh-drafter with --draft-model NAME|PATH, or ask for model-free or automatic speculation"
    )]
    NoModel,
    #[error(
        "the draft model {draft} cannot draft for the target {target}: their vocabularies \
         differ ({why}); use a draft model with the target's tokenizer (a smaller model of the \
         same family), start the drafter with --target-tokenizer naming the target's model \
         (it then drafts through text), or use model-free speculation"
    )]
    Vocab {
        draft: String,
        target: String,
        why: String,
    },
}

impl DraftModel {
    /// Loads the model (blocking: seconds), truncates it for a self-draft
    /// and refuses it when its vocabulary differs from the target's.
    pub fn load(cfg: &DraftModelConfig) -> Result<DraftModel, DraftModelError> {
        // Catalog names become their cached files here, not in the config:
        // parsing flags touches no file.
        let resolve = |flag, spec: &std::path::Path| {
            specmesh_catalog::resolve(Some(spec))
                .map_err(|source| DraftModelError::Resolve { flag, source })
        };
        let name = cfg.path.display().to_string();
        let cfg = &DraftModelConfig {
            path: resolve("draft-model", &cfg.path)?,
            target_tokenizer: cfg
                .target_tokenizer
                .as_deref()
                .map(|t| resolve("target-tokenizer", t))
                .transpose()?,
            ..cfg.clone()
        };
        if let Some(expected) = &cfg.sha256 {
            let started = std::time::Instant::now();
            specmesh_catalog::digest::check_file(&cfg.path, expected)
                .map_err(|source| DraftModelError::Digest { source })?;
            tracing::info!(
                path = %cfg.path.display(),
                sha256 = %expected,
                secs = started.elapsed().as_secs_f64(),
                "draft model file has the expected SHA-256"
            );
        }
        let draft_tok = tokenizer(&cfg.path)?;
        let mut bridge = None;
        if let Some(target) = &cfg.target_tokenizer {
            let target_tok = tokenizer(target)?;
            if let Err(mismatch) = check_vocab(&target_tok, &draft_tok) {
                if cfg.self_draft_layers.is_some() {
                    return Err(DraftModelError::Vocab {
                        draft: cfg.path.clone(),
                        target: target.clone(),
                        source: Box::new(mismatch),
                    });
                }
                let target_name = target.display().to_string();
                let b = TextBridge::new(target_tok, draft_tok.clone(), &target_name, &name)
                    .map_err(|source| DraftModelError::Bridge {
                        draft: cfg.path.clone(),
                        target: target.clone(),
                        mismatch: Box::new(mismatch.clone()),
                        source: Box::new(source),
                    })?;
                tracing::info!(
                    draft = %name,
                    target = %target_name,
                    shared_chat_markers = b.shared_markers(),
                    why = %mismatch,
                    "the draft model's vocabulary is not the target's: drafting through text"
                );
                bridge = Some(Bridged {
                    target_fingerprint: b.target().vocab_fingerprint(),
                    bridge: Arc::new(b),
                });
            }
        }
        if bridge.is_none() && cfg.target_tokenizer.is_some() {
            tracing::info!(draft = %name, "the draft model drafts in the target's vocabulary");
        }
        let head = match cfg.head_tokens {
            Some(n) => Some(head_tokens(cfg, n, &draft_tok)?),
            None => None,
        };
        let opts = LoadOptions {
            threads: cfg.threads,
            isa: cfg.isa,
            kv_dtype: cfg.kv_dtype,
            head_tokens: head.as_deref(),
            ..LoadOptions::default()
        };
        let full = Model::load(&cfg.path, &opts).map_err(|source| DraftModelError::Load {
            path: cfg.path.clone(),
            source: Box::new(source),
        })?;
        let model = match cfg.self_draft_layers {
            Some(layers) => full
                .truncated(layers)
                .map_err(|source| DraftModelError::Truncate {
                    path: cfg.path.clone(),
                    layers,
                    source: Box::new(source),
                })?,
            None => full,
        };
        let cost = ForwardCost::measure(&model);
        tracing::info!(
            path = %cfg.path.display(),
            forward_ms = cost.map(|c| c.forward_secs * 1e3),
            layers = model.n_layers(),
            vocab = model.config().vocab_size,
            head_tokens = model.head_tokens().map_or(model.config().vocab_size, <[u32]>::len),
            threads = model.threads(),
            kernels = %model.kernels(),
            sessions = cfg.max_sessions,
            "draft model loaded"
        );
        let kv = (bridge.is_none() && cfg.kv_budget_bytes > 0)
            .then(|| DraftKv::new(cfg.kv_budget_bytes, model.kv_bytes_per_token() as u64));
        Ok(DraftModel {
            model: Arc::new(model),
            name,
            vocab_fingerprint: draft_tok.vocab_fingerprint(),
            cost,
            slots: Arc::new(Semaphore::new(cfg.max_sessions)),
            bridge,
            kv,
        })
    }

    /// The text bridge, when the draft model drafts through text.
    pub fn bridge(&self) -> Option<&Arc<TextBridge>> {
        self.bridge.as_ref().map(|b| &b.bridge)
    }

    /// Its KV cache by prefix, when it keeps one.
    pub fn kv(&self) -> Option<&DraftKv> {
        self.kv.as_ref()
    }

    /// What its forwards cost, when measured.
    pub fn cost(&self) -> Option<ForwardCost> {
        self.cost
    }

    /// Refuses a target whose vocabulary is not the draft model's: another
    /// size (`vocab`, the target's logits) or, when the verifier sent one,
    /// another fingerprint. Drafting through text, the target must be the
    /// tokenizer given at start instead: its fingerprint, and at least its
    /// ids in the target's logits.
    pub fn check_target(&self, target: &TargetModel, vocab: u32) -> Result<(), ModelRefusal> {
        let why = match &self.bridge {
            Some(b) => self.bridged_mismatch(b, target, vocab),
            None => self.vocab_mismatch(target, vocab),
        };
        match why {
            None => Ok(()),
            Some(why) => Err(ModelRefusal::Vocab {
                draft: self.name.clone(),
                target: target.display_name().to_owned(),
                why,
            }),
        }
    }

    fn vocab_mismatch(&self, target: &TargetModel, vocab: u32) -> Option<String> {
        let draft_vocab = self.model.config().vocab_size;
        if draft_vocab != vocab as usize {
            return Some(format!(
                "{draft_vocab} tokens in the draft model, {vocab} in the target"
            ));
        }
        target
            .vocab_fingerprint
            .filter(|&f| f != self.vocab_fingerprint)
            .map(|f| {
                format!(
                    "vocabulary fingerprint {:016x} in the draft model, {f:016x} in the target",
                    self.vocab_fingerprint
                )
            })
    }

    fn bridged_mismatch(&self, b: &Bridged, target: &TargetModel, vocab: u32) -> Option<String> {
        match target.vocab_fingerprint {
            Some(f) if f != b.target_fingerprint => Some(format!(
                "this drafter drafts through text for the target tokenizer given with \
                 --target-tokenizer (vocabulary fingerprint {:016x}), the target's is {f:016x}",
                b.target_fingerprint
            )),
            _ if (vocab as usize) < b.bridge.target().vocab_size() => Some(format!(
                "the target's logits cover {vocab} tokens, the target tokenizer given with \
                 --target-tokenizer has {}",
                b.bridge.target().vocab_size()
            )),
            _ => None,
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// A session slot, or `None` when every slot is taken.
    pub(crate) fn try_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }
}

/// The tokenizer of a GGUF file or of a Hugging Face model directory.
fn tokenizer(path: &Path) -> Result<Tokenizer, DraftModelError> {
    Tokenizer::from_model_path(path).map_err(|source| DraftModelError::Tokenizer {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}
