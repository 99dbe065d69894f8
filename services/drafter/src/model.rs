//! The optional draft model: loaded once at startup, checked against the
//! target's tokenizer, and shared (`Arc`) by every session that drafts
//! with it.
//!
//! Sharing is safe: [`Model::forward`] takes `&self` and serialises on the
//! model's scratch mutex, so concurrent sessions' forwards queue rather
//! than race; each session keeps its own KV [`Sequence`] inside its
//! [`ModelDrafter`]. That KV memory is why at most
//! [`DraftModelConfig::max_sessions`] sessions draft with the model at
//! once; the rest draft model-free.
//!
//! [`Sequence`]: specmesh_model::Sequence
//! [`ModelDrafter`]: specmesh_draft_model::ModelDrafter

use std::path::{Path, PathBuf};
use std::sync::Arc;

use specmesh_draft_model::{VocabMismatch, check_vocab};
use specmesh_model::{LoadOptions, Model, ModelError};
use specmesh_tokenizer::{Tokenizer, TokenizerError};
use tokio::sync::Semaphore;

use crate::config::DraftModelConfig;

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
}

/// The loaded draft model and its session slots.
#[derive(Debug, Clone)]
pub struct DraftModel {
    model: Arc<Model>,
    slots: Arc<Semaphore>,
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
        let cfg = &DraftModelConfig {
            path: resolve("draft-model", &cfg.path)?,
            target_tokenizer: cfg
                .target_tokenizer
                .as_deref()
                .map(|t| resolve("target-tokenizer", t))
                .transpose()?,
            ..cfg.clone()
        };
        if let Some(target) = &cfg.target_tokenizer {
            let target_tok = tokenizer(target)?;
            let draft_tok = tokenizer(&cfg.path)?;
            check_vocab(&target_tok, &draft_tok).map_err(|source| DraftModelError::Vocab {
                draft: cfg.path.clone(),
                target: target.clone(),
                source: Box::new(source),
            })?;
        }
        let opts = LoadOptions {
            threads: cfg.threads,
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
        tracing::info!(
            path = %cfg.path.display(),
            layers = model.n_layers(),
            vocab = model.config().vocab_size,
            threads = model.threads(),
            sessions = cfg.max_sessions,
            "draft model loaded"
        );
        Ok(DraftModel::new(Arc::new(model), cfg.max_sessions))
    }

    /// Wraps an already loaded model; at most `max_sessions` sessions draft
    /// with it at once.
    pub fn new(model: Arc<Model>, max_sessions: usize) -> DraftModel {
        DraftModel {
            model,
            slots: Arc::new(Semaphore::new(max_sessions)),
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
