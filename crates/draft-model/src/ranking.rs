//! Token frequency rankings for a cheaper draft head (FR-Spec, Zhao et al.
//! 2025, arXiv 2502.14856): a draft model that scores only its N most
//! frequent tokens skips most of its lm_head, which for a small model with
//! a large vocabulary is a third or more of each forward.
//!
//! A ranking is a text file that `specmesh token-ranking` writes from a
//! corpus it can regenerate (a model's greedy answers to a prompt list,
//! plus any text files); it names the tokenizer it counted with, so a
//! drafter refuses a ranking of another vocabulary:
//!
//! ```text
//! # specmesh token ranking v1
//! # tokenizer-fingerprint 5c1f0e0d9a3b2c71
//! # corpus: 64 prompts, 16384 generated tokens by qwen2.5-coder-0.5b
//! 13 2711
//! 279 1530
//! …
//! ```
//!
//! One `ID COUNT` line per token seen, most frequent first (ties: lower id
//! first). [`TokenRanking::top`] fills a head larger than the tokens seen
//! with the unseen ones in id order: byte-level BPE ids follow merge order,
//! which roughly follows frequency in the tokenizer's own training text.

use std::fmt::Write as _;

const MAGIC: &str = "# specmesh token ranking v1";

/// Rankings that ship with specmesh, by name, made by
/// `tools/ranking/make.sh` (which says how).
const SHIPPED: [(&str, &str); 2] = [
    ("qwen2.5", include_str!("../rankings/qwen2.5.txt")),
    ("smollm2", include_str!("../rankings/smollm2.txt")),
];
const FINGERPRINT: &str = "# tokenizer-fingerprint ";
const CORPUS: &str = "# corpus: ";

/// Why a ranking file was refused; each message says where and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RankingError {
    #[error("not a token ranking: the first line must be `{MAGIC}`")]
    Magic,
    #[error("the ranking names no `{}` line", FINGERPRINT.trim_end())]
    NoFingerprint,
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error(
        "the ranking was counted with tokenizer {ranking:016x}, but the draft model's is \
         {model:016x}: make one for this model with `specmesh token-ranking --model …`"
    )]
    Tokenizer { ranking: u64, model: u64 },
    #[error("the ranking names token {token}, outside the draft model's vocabulary of {vocab}")]
    OutOfVocab { token: u32, vocab: usize },
}

/// Token ids by corpus frequency, most frequent first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRanking {
    /// [`specmesh_tokenizer::Tokenizer::vocab_fingerprint`] of the
    /// tokenizer that counted.
    pub fingerprint: u64,
    /// What was counted, for people.
    pub corpus: String,
    /// (id, count), most frequent first, lower id first on ties.
    pub counts: Vec<(u32, u64)>,
}

impl TokenRanking {
    /// Ranks `counts[id]` (ids with count 0 are left out).
    pub fn from_counts(fingerprint: u64, corpus: String, counts: &[u64]) -> TokenRanking {
        let mut ranked: Vec<(u32, u64)> = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(id, &c)| (id as u32, c))
            .collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        TokenRanking {
            fingerprint,
            corpus,
            counts: ranked,
        }
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut s = format!("{MAGIC}\n{FINGERPRINT}{:016x}\n", self.fingerprint);
        for line in self.corpus.lines() {
            let _ = writeln!(s, "{CORPUS}{line}");
        }
        for (id, count) in &self.counts {
            let _ = writeln!(s, "{id} {count}");
        }
        s
    }

    /// Parses a file written by [`TokenRanking::to_text`].
    pub fn parse(text: &str) -> Result<TokenRanking, RankingError> {
        let mut lines = text.lines().enumerate();
        if lines.next().map(|(_, l)| l.trim_end()) != Some(MAGIC) {
            return Err(RankingError::Magic);
        }
        let mut fingerprint = None;
        let mut corpus = Vec::new();
        let mut counts = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, line) in lines {
            let bad = |reason: String| RankingError::Line {
                line: i + 1,
                reason,
            };
            if let Some(hex) = line.strip_prefix(FINGERPRINT) {
                let v = u64::from_str_radix(hex.trim(), 16)
                    .map_err(|e| bad(format!("tokenizer fingerprint `{hex}`: {e}")))?;
                fingerprint = Some(v);
                continue;
            }
            if let Some(c) = line.strip_prefix(CORPUS) {
                corpus.push(c.to_owned());
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(id), Some(count), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad(format!("expected `ID COUNT`, got `{line}`")));
            };
            let id: u32 = id
                .parse()
                .map_err(|e| bad(format!("token id `{id}`: {e}")))?;
            let count: u64 = count
                .parse()
                .map_err(|e| bad(format!("count `{count}`: {e}")))?;
            if !seen.insert(id) {
                return Err(bad(format!("token {id} is ranked twice")));
            }
            counts.push((id, count));
        }
        Ok(TokenRanking {
            fingerprint: fingerprint.ok_or(RankingError::NoFingerprint)?,
            corpus: corpus.join("\n"),
            counts,
        })
    }

    /// The `n` tokens a head of `n` keeps for a model of `vocab` tokens
    /// and tokenizer `fingerprint`: the ranked ones first, then unseen ids
    /// in increasing order. `n` at or past `vocab` keeps every token.
    pub fn top(&self, n: usize, vocab: usize, fingerprint: u64) -> Result<Vec<u32>, RankingError> {
        if self.fingerprint != fingerprint {
            return Err(RankingError::Tokenizer {
                ranking: self.fingerprint,
                model: fingerprint,
            });
        }
        let n = n.min(vocab);
        let mut taken = vec![false; vocab];
        let mut out = Vec::with_capacity(n);
        for &(id, _) in &self.counts {
            let Some(t) = taken.get_mut(id as usize) else {
                return Err(RankingError::OutOfVocab { token: id, vocab });
            };
            if out.len() < n {
                *t = true;
                out.push(id);
            }
        }
        let mut next = 0u32;
        while out.len() < n {
            if !taken[next as usize] {
                out.push(next);
            }
            next += 1;
        }
        Ok(out)
    }

    /// The shipped ranking for the tokenizer `fingerprint`, with its name.
    pub fn shipped(fingerprint: u64) -> Option<(TokenRanking, &'static str)> {
        SHIPPED.iter().find_map(|(name, text)| {
            let r = TokenRanking::parse(text).expect("shipped rankings parse");
            (r.fingerprint == fingerprint).then_some((r, *name))
        })
    }

    /// Share of the counted tokens that the `n` most frequent cover.
    pub fn coverage(&self, n: usize) -> f64 {
        let total: u64 = self.counts.iter().map(|e| e.1).sum();
        let top: u64 = self.counts.iter().take(n).map(|e| e.1).sum();
        if total == 0 {
            0.0
        } else {
            top as f64 / total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranking() -> TokenRanking {
        TokenRanking::from_counts(0xabc, "test\ntwo lines".into(), &[0, 5, 9, 5, 0, 1])
    }

    #[test]
    fn counts_rank_most_frequent_first_lower_id_on_ties() {
        assert_eq!(ranking().counts, vec![(2, 9), (1, 5), (3, 5), (5, 1)]);
        assert!((ranking().coverage(2) - 14.0 / 20.0).abs() < 1e-12);
    }

    #[test]
    fn the_text_round_trips() {
        let r = ranking();
        let text = r.to_text();
        assert!(text.starts_with(MAGIC));
        assert_eq!(TokenRanking::parse(&text).unwrap(), r);
    }

    #[test]
    fn a_head_takes_ranked_tokens_then_unseen_ids_in_order() {
        let r = ranking();
        assert_eq!(r.top(2, 8, 0xabc).unwrap(), vec![2, 1]);
        assert_eq!(r.top(6, 8, 0xabc).unwrap(), vec![2, 1, 3, 5, 0, 4]);
        assert_eq!(r.top(99, 8, 0xabc).unwrap().len(), 8);
    }

    #[test]
    fn shipped_rankings_parse_and_are_found_by_fingerprint() {
        for (name, text) in SHIPPED {
            let r = TokenRanking::parse(text).unwrap();
            assert!(r.counts.len() > 1000, "{name}: {} tokens", r.counts.len());
            assert_eq!(TokenRanking::shipped(r.fingerprint).unwrap().1, name);
        }
        assert_eq!(TokenRanking::shipped(1), None);
    }

    #[test]
    fn wrong_tokenizers_and_bad_files_are_refused() {
        let r = ranking();
        assert!(matches!(
            r.top(2, 8, 0xdef),
            Err(RankingError::Tokenizer { .. })
        ));
        assert_eq!(
            r.top(2, 4, 0xabc),
            Err(RankingError::OutOfVocab { token: 5, vocab: 4 })
        );
        assert_eq!(TokenRanking::parse("hello"), Err(RankingError::Magic));
        assert_eq!(
            TokenRanking::parse(&format!("{MAGIC}\n1 2\n")),
            Err(RankingError::NoFingerprint)
        );
        let twice = format!("{MAGIC}\n{FINGERPRINT}0abc\n1 2\n1 3\n");
        assert!(
            TokenRanking::parse(&twice)
                .unwrap_err()
                .to_string()
                .contains("line 4: token 1 is ranked twice")
        );
        let junk = format!("{MAGIC}\n{FINGERPRINT}0abc\n1 x\n");
        assert!(
            TokenRanking::parse(&junk)
                .unwrap_err()
                .to_string()
                .starts_with("line 3: count `x`")
        );
    }
}
