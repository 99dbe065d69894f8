//! Structured outputs: a JSON schema, a regular expression or a Lark
//! grammar, compiled by [llguidance](https://github.com/guidance-ai/llguidance)
//! over the target's tokenizer into a token [`Constraint`] that
//! verification masks the target's rows with.
//!
//! Why llguidance rather than our own: it is the engine behind llama.cpp's,
//! vLLM's and SGLang's structured outputs, computes a mask over a 150k
//! vocabulary in tens of microseconds (a slicer over a token trie), rolls
//! back (which fitting a drafted tree to the grammar needs), and forces
//! bytes (jump-forward), which become certain drafts. It is pure Rust.
//!
//! What this crate adds: the token environment built from our own GGUF
//! tokenizer ([`env`]), limits that make a hostile grammar a refused
//! request rather than a stalled verifier ([`GrammarLimits`]), a cache of
//! compiled grammars keyed by their text ([`Grammars`]), and JSON's default
//! layout (below).
//!
//! A JSON schema without its own `x-guidance` options is compiled with
//! fixed separators, `", "` and `": "`, and no other whitespace: the layout
//! of Python's `json.dumps`, which the Qwen models write and read in their
//! tool calls. Fixed separators are what lets the grammar force key names
//! and punctuation (`{"city": "` is certain once `{` is written), so
//! speculation gets them for free; a schema may ask for flexible
//! whitespace with `"x-guidance": {"whitespace_flexible": true}`.

#![forbid(unsafe_code)]

mod cache;
mod constraint;
mod env;
mod spec;

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use specmesh_tokenizer::Tokenizer;

pub use constraint::TokenConstraint;
pub use spec::{Structured, StructuredKind, with_layout};

use crate::cache::Cache;

/// Why a grammar was refused; each message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("the {kind} is {bytes} bytes; at most {max} are accepted")]
    TooLarge {
        kind: StructuredKind,
        bytes: usize,
        max: usize,
    },
    #[error("the {kind} is empty")]
    Empty { kind: StructuredKind },
    #[error("the JSON schema is not JSON: {0}")]
    NotJson(String),
    #[error("the {kind} cannot be compiled: {reason}")]
    Invalid {
        kind: StructuredKind,
        reason: String,
    },
    #[error(
        "the {kind} uses a feature speculation cannot undo (`max_tokens=`, `stop=` or \
         `temperature=` in a Lark lexeme); remove it"
    )]
    NoRollback { kind: StructuredKind },
    #[error("the tokenizer cannot serve structured outputs: {0}")]
    Tokenizer(String),
}

/// Bounds on what a request may ask the grammar engine to do. A schema is
/// untrusted input: its size, the work to compile it and the work per
/// token are all bounded, and a grammar past them is refused (at compile)
/// or fails its request (at a token), never stalls the verifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrammarLimits {
    /// Bytes of a schema, regular expression or grammar.
    pub max_bytes: usize,
    /// Compiled grammars kept for reuse.
    pub cache_entries: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        GrammarLimits {
            max_bytes: 128 * 1024,
            cache_entries: 16,
        }
    }
}

/// The engine's own limits: fuel for compiling (~20 ms of lexer
/// construction), for each mask (~15 ms at worst), and a lexer of at most
/// 20k states (each state 1–2 kB: ~40 MB at worst, not the default 0.5 GB;
/// the 16 cached grammars hold at most ~0.6 GB). Errors name no grammar text (`verbose_errors` off): they go back
/// to callers.
fn parser_limits() -> ParserLimits {
    ParserLimits {
        max_lexer_states: 20_000,
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// A model's grammar compiler: the token environment and a cache of
/// compiled grammars. Cheap to share (`Arc`) across requests.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    limits: GrammarLimits,
    cache: Cache,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A compiled grammar, ready to start constraints from.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// A constraint at the start of the output.
    pub fn start(&self) -> TokenConstraint {
        TokenConstraint::new(self.matcher.clone())
    }
}

impl Grammars {
    /// The compiler for `tokenizer`'s model, whose logits rows are
    /// `n_vocab` wide (ids past the tokenizer's are never allowed).
    pub fn new(
        tokenizer: &Tokenizer,
        n_vocab: usize,
        limits: GrammarLimits,
    ) -> Result<Grammars, GrammarError> {
        let env = env::tok_env(tokenizer, n_vocab)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = parser_limits();
        Ok(Grammars {
            factory: Arc::new(factory),
            cache: Cache::new(limits.cache_entries),
            limits,
        })
    }

    pub fn limits(&self) -> GrammarLimits {
        self.limits
    }

    /// Compiles `spec` (or takes it from the cache): refused when it is
    /// too large, not valid, or beyond the engine's limits.
    pub fn compile(&self, spec: &Structured) -> Result<Grammar, GrammarError> {
        spec.check(self.limits.max_bytes)?;
        let key = spec.cache_key();
        if let Some(matcher) = self.cache.get(key, spec) {
            return Ok(Grammar { matcher });
        }
        let grammar = spec.top_level()?;
        let matcher = self.build(spec.kind(), grammar)?;
        self.cache.put(key, spec.clone(), matcher.clone());
        Ok(Grammar { matcher })
    }

    fn build(&self, kind: StructuredKind, g: TopLevelGrammar) -> Result<Matcher, GrammarError> {
        let parser = self
            .factory
            .create_parser(g)
            .map_err(|e| GrammarError::Invalid {
                kind,
                reason: e.to_string(),
            })?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid { kind, reason: e });
        }
        // Fitting drafted trees needs rollback: a grammar that cannot roll
        // back is refused here rather than failing its first tree. One
        // allowed token is consumed and rolled back to find out.
        let mask = matcher.compute_mask().map_err(|e| GrammarError::Invalid {
            kind,
            reason: e.to_string(),
        })?;
        if let Some(t) = mask.first_bit_set() {
            let t = t as u32;
            if matcher.consume_token(t).is_ok() && matcher.rollback(1).is_err() {
                return Err(GrammarError::NoRollback { kind });
            }
            if matcher.is_error() {
                return Err(GrammarError::Invalid {
                    kind,
                    reason: matcher.get_error().unwrap_or_default(),
                });
            }
        }
        Ok(matcher)
    }
}

#[cfg(test)]
mod tests;
