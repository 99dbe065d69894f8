//! Drafting across vocabularies: a draft model whose tokenizer is not the
//! target's drafts through text (the approach of Timor et al., ICML 2025,
//! and of Hugging Face's universal assisted generation).
//!
//! The context arrives as target ids. [`TextMap`] keeps, per session, the
//! context's bytes (each target token's bytes appended as it is
//! committed) and the draft model's tokens for them; each step re-encodes
//! only the last few draft tokens and what was committed since, so a
//! step's work does not grow with the context. The draft model drafts a
//! tree in its own vocabulary; every root-to-leaf path becomes text,
//! which the target's tokenizer encodes into a chain of target ids, and
//! the chains are merged into one target tree. A path's last target token
//! may be cut short by the end of the draft's text (the draft stopped
//! inside a word the target spells as one token): it is dropped, unless
//! the path ended on a special token (`<|im_end|>`). So the draft model
//! drafts [`EXTRA_LEVELS`] deeper than the target tree may reach.
//!
//! Verification stays in the target's vocabulary, so greedy output is the
//! target's by construction. The trees carry no draft distributions (the
//! draft model drafts greedily here): under sampling the verifier accepts
//! them as deterministic proposals, which is lossless without q.
//!
//! [`TextBridge::new`] refuses pairs that cannot work: a draft model
//! without a chat template (it would not read the target's conversation
//! markers as its own), or a tokenizer whose tokens do not give back the
//! text they encoded (a SentencePiece encoder that prepends a space, for
//! one).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use specmesh_draft::{DraftContext, Drafter, Feedback};
use specmesh_tokenizer::{ChatMessage, Tokenizer};
use specmesh_tree::{TokenTree, TreeBuilder, TreeLimits};

use crate::drafter::{DrafterStats, ModelDrafter};

/// Draft tokens re-encoded from the end of the mapped text at each step:
/// a byte-level BPE merges within a pre-tokenized word, and the tail of
/// the text may still change its tokens as text is appended.
const REENCODE_TAIL: usize = 8;

/// Levels a tree drafted through text runs beyond the depth asked: one
/// more draft model forward per tree, which the drafter's policy prices.
pub const EXTRA_LEVELS: usize = 1;

/// Why a draft model cannot draft through text for a target; the drafter
/// refuses to start with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BridgeError {
    #[error(
        "the draft model {draft} has no chat template, so it cannot read the conversations of \
         the target {target} as its own: use an instruct (chat) draft model"
    )]
    NoChatTemplate { draft: String, target: String },
    #[error(
        "the tokenizer of {side} model {name} does not give back the text it encodes \
         ({detail}), so the draft model {draft} cannot draft through text for the target \
         {target}: use a draft model with the target's tokenizer, or one with a byte-level \
         tokenizer"
    )]
    RoundTrip {
        side: &'static str,
        name: String,
        detail: String,
        draft: String,
        target: String,
    },
}

/// The two tokenizers of a cross-vocabulary pair, checked to round-trip.
#[derive(Clone)]
pub struct TextBridge {
    target: Tokenizer,
    draft: Tokenizer,
    /// Whether the draft model reads the target's conversation markers as
    /// its own special tokens (both ChatML, say).
    shared_markers: bool,
}

impl fmt::Debug for TextBridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextBridge")
            .field("target_vocab", &self.target.vocab_size())
            .field("draft_vocab", &self.draft.vocab_size())
            .field("shared_markers", &self.shared_markers)
            .finish()
    }
}

/// Concatenated bytes of `ids`, `None` at an unknown id.
fn bytes_of(tok: &Tokenizer, ids: &[u32]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for &id in ids {
        out.extend_from_slice(tok.token_bytes(id)?);
    }
    Some(out)
}

/// Bytes of the longest prefix of `bytes` that is whole UTF-8 characters.
fn whole_chars(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).expect("valid up to there"),
    }
}

impl TextBridge {
    /// Checks the pair (`target_name` and `draft_name` for messages) on a
    /// conversation in the target's own chat template: code, punctuation
    /// and multi-byte characters must come back byte for byte from either
    /// tokenizer, also for a continuation encoded on its own.
    pub fn new(
        target: Tokenizer,
        draft: Tokenizer,
        target_name: &str,
        draft_name: &str,
    ) -> Result<TextBridge, BridgeError> {
        if !draft.has_chat_template() {
            return Err(BridgeError::NoChatTemplate {
                draft: draft_name.into(),
                target: target_name.into(),
            });
        }
        let probe = vec![
            ChatMessage::new(
                "user",
                "Fix it: naïve café — 数据 🙂\n```py\ndef f(x):\n\treturn x*2\n```",
            ),
            ChatMessage::new(
                "assistant",
                "Sure!\n\n```python\ndef f(x: int) -> int:\n    return 2 * x\n```",
            ),
        ];
        let conversation = target
            .apply_chat_template(&probe, true)
            .unwrap_or_else(|_| "user: hello, naïve café 🙂\nassistant:".into());
        let round_trip = |tok: &Tokenizer, side: &'static str, name: &str, text: &str| {
            let fail = |detail: String| BridgeError::RoundTrip {
                side,
                name: name.into(),
                detail,
                draft: draft_name.into(),
                target: target_name.into(),
            };
            let ids = tok
                .encode(text, true)
                .map_err(|e| fail(format!("encoding failed: {e}")))?;
            let back = bytes_of(tok, &ids).ok_or_else(|| fail("an unknown id".into()))?;
            if back != text.as_bytes() {
                return Err(fail(format!(
                    "{:?} came back as {:?}",
                    text,
                    String::from_utf8_lossy(&back)
                )));
            }
            Ok(())
        };
        for text in [conversation.as_str(), "def f(x):\n    return x", "x"] {
            round_trip(&target, "the target", target_name, text)?;
            round_trip(&draft, "the draft", draft_name, text)?;
        }
        let shared_markers = ["<|im_start|>", "<|im_end|>"].iter().all(|m| {
            let special = |tok: &Tokenizer| tok.token_id(m).is_some_and(|id| tok.is_special(id));
            !conversation.contains(m) || (special(&target) && special(&draft))
        });
        Ok(TextBridge {
            target,
            draft,
            shared_markers,
        })
    }

    /// Whether both models read the conversation markers as special tokens.
    pub fn shared_markers(&self) -> bool {
        self.shared_markers
    }

    pub fn target(&self) -> &Tokenizer {
        &self.target
    }

    pub fn draft(&self) -> &Tokenizer {
        &self.draft
    }

    /// The target tree for `draft` (a tree in the draft's vocabulary whose
    /// root is the last draft token of the context): each path's text
    /// encoded by the target, paths merged, likeliest first, within
    /// `limits`. Returns the tree and the target tokens dropped at the
    /// paths' ends.
    pub fn to_target(&self, draft: &TokenTree, root: u32, limits: TreeLimits) -> (TokenTree, u64) {
        let Ok(mut b) = TreeBuilder::new(root, limits) else {
            return (root_only(root, limits), 0);
        };
        let mut leaves: Vec<usize> = draft.leaves().filter(|&l| l != 0).collect();
        leaves.sort_by(|&a, &b| draft.score(b).total_cmp(&draft.score(a)).then(a.cmp(&b)));
        let mut lost = 0;
        let mut bytes = Vec::new();
        // Per draft node of the path: where its text ends, and its score.
        let mut ends: Vec<(usize, f32)> = Vec::new();
        'paths: for leaf in leaves {
            bytes.clear();
            ends.clear();
            for node in draft.path_to(leaf).into_iter().skip(1) {
                let Some(piece) = self.draft.token_bytes(draft.token(node)) else {
                    continue 'paths;
                };
                bytes.extend_from_slice(piece);
                ends.push((bytes.len(), draft.score(node)));
            }
            let text = whole_chars(&bytes);
            let Ok(ids) = self.target.encode(text, true) else {
                continue;
            };
            let closed = self.draft.is_special(draft.token(leaf));
            let keep = if closed || ids.is_empty() {
                ids.len()
            } else {
                lost += 1;
                ids.len() - 1
            };
            let (mut parent, mut end) = (0, 0);
            for &id in &ids[..keep] {
                end += self.target.token_bytes(id).map_or(0, <[u8]>::len);
                // The score of the draft node whose text completes this token.
                let score = ends
                    .iter()
                    .find(|(e, _)| *e >= end)
                    .map_or(0.0, |&(_, s)| s);
                parent = match b.child_with(parent, id) {
                    Some(c) => c,
                    None => match b.push(parent, id, score) {
                        Ok(c) => c,
                        // Full, too deep, or an id past the target's
                        // logits: this path stops here.
                        Err(_) => continue 'paths,
                    },
                };
            }
        }
        (b.build(), lost)
    }
}

fn root_only(root: u32, limits: TreeLimits) -> TokenTree {
    TokenTree::placeholder(Some(root), limits)
}

/// One session's context as text and as draft tokens; see the module docs.
#[derive(Debug, Default, Clone)]
pub struct TextMap {
    /// Target ids mapped so far, and where each one's bytes end.
    target: Vec<u32>,
    target_ends: Vec<usize>,
    bytes: Vec<u8>,
    /// The draft's tokens for the whole characters of `bytes`, and where
    /// each one's bytes end.
    draft: Vec<u32>,
    draft_ends: Vec<usize>,
}

impl TextMap {
    /// Brings the map to `tokens` (target ids); returns whether the draft
    /// tokens cover the text exactly (`false` while the text ends inside a
    /// UTF-8 character, or on an id the target's tokenizer does not know).
    pub fn sync(&mut self, bridge: &TextBridge, tokens: &[u32]) -> bool {
        let common = self
            .target
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.target.len() {
            // The context changed under us (another start): cut back.
            self.target.truncate(common);
            self.target_ends.truncate(common);
            self.bytes
                .truncate(self.target_ends.last().copied().unwrap_or(0));
        }
        for &t in &tokens[common..] {
            let Some(piece) = bridge.target.token_bytes(t) else {
                *self = TextMap::default();
                return false;
            };
            self.bytes.extend_from_slice(piece);
            self.target.push(t);
            self.target_ends.push(self.bytes.len());
        }
        // Draft tokens past the text, and the last few before its end, are
        // encoded again.
        let kept = self.draft_ends.partition_point(|&e| e <= self.bytes.len());
        let keep = kept.saturating_sub(REENCODE_TAIL);
        self.draft.truncate(keep);
        self.draft_ends.truncate(keep);
        let from = self.draft_ends.last().copied().unwrap_or(0);
        let text = whole_chars(&self.bytes[from..]);
        let Ok(ids) = bridge.draft.encode(text, true) else {
            *self = TextMap::default();
            return false;
        };
        let mut end = from;
        for id in ids {
            end += bridge.draft.token_bytes(id).map_or(0, <[u8]>::len);
            self.draft.push(id);
            self.draft_ends.push(end);
        }
        if end != from + text.len() {
            // Checked at start; never trust it blindly.
            *self = TextMap::default();
            return false;
        }
        !self.draft.is_empty() && end == self.bytes.len()
    }

    /// The draft model's tokens for the context.
    pub fn draft_tokens(&self) -> &[u32] {
        &self.draft
    }

    /// Draft tokens within the first `target_len` target tokens' text.
    pub fn draft_len_of(&self, target_len: usize) -> usize {
        let end = match target_len {
            0 => 0,
            n => self
                .target_ends
                .get(n - 1)
                .copied()
                .unwrap_or(self.bytes.len()),
        };
        self.draft_ends.partition_point(|&e| e <= end)
    }
}

/// A [`ModelDrafter`] in its own vocabulary, drafting target trees through
/// text; see the module docs.
#[derive(Debug)]
pub struct CrossVocabDrafter {
    inner: ModelDrafter,
    bridge: Arc<TextBridge>,
    map: TextMap,
    draft_vocab: u32,
    stats: DrafterStats,
}

impl CrossVocabDrafter {
    /// `inner` drafts greedily in the draft model's vocabulary.
    pub fn new(inner: ModelDrafter, bridge: Arc<TextBridge>) -> CrossVocabDrafter {
        let draft_vocab = inner.model().config().vocab_size as u32;
        CrossVocabDrafter {
            inner,
            bridge,
            map: TextMap::default(),
            draft_vocab,
            stats: DrafterStats::default(),
        }
    }

    /// The draft model's counters, with the text bridge's.
    pub fn stats(&self) -> DrafterStats {
        DrafterStats {
            retokenize_nanos: self.stats.retokenize_nanos,
            boundary_lost: self.stats.boundary_lost,
            ..self.inner.stats()
        }
    }

    /// Draft tokens whose K/V the draft model holds.
    pub fn cached_len(&self) -> usize {
        self.inner.cached_len()
    }

    /// See [`ModelDrafter::cancel_handle`].
    pub fn cancel_handle(&self) -> crate::Cancel {
        self.inner.cancel_handle()
    }
}

impl Drafter for CrossVocabDrafter {
    fn name(&self) -> &'static str {
        "model"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let root = ctx.root();
        let limits = ctx.limits;
        if limits.max_nodes <= 1 || limits.max_depth == 0 {
            return root_only(root, limits);
        }
        let t0 = Instant::now();
        let ready = self.map.sync(&self.bridge, ctx.tokens);
        let mut spent = t0.elapsed();
        if !ready {
            self.stats.retokenize_nanos += spent.as_nanos() as u64;
            return root_only(root, limits);
        }
        // One level deeper than asked: each path's last target token is
        // dropped (see the module docs), so a tree of the depth asked
        // would reach one level less, and a one-level budget nothing.
        let dctx = DraftContext {
            tokens: self.map.draft_tokens(),
            prompt_len: self.map.draft_len_of(ctx.prompt_len),
            limits: TreeLimits::new(
                limits.max_nodes + EXTRA_LEVELS,
                limits.max_depth + EXTRA_LEVELS,
                self.draft_vocab,
            ),
        };
        let drafted = self.inner.propose(&dctx);
        let t1 = Instant::now();
        let (tree, lost) = self.bridge.to_target(&drafted, root, limits);
        spent += t1.elapsed();
        self.stats.retokenize_nanos += spent.as_nanos() as u64;
        self.stats.boundary_lost += lost;
        tree
    }

    fn observe(&mut self, _feedback: &Feedback<'_>) {
        // The draft cache follows the context on the next propose.
    }
}
