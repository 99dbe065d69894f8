//! What a conversation pass adds up to: time to first token on the first
//! turn and on the later ones (whose prompts are mostly the history a
//! prefix cache can serve), the whole pass's time, and the share of prompt
//! tokens the server said it took from a cache; then ours against the
//! fastest llama.cpp configuration, and the identity of every greedy
//! answer across our targets.

use std::collections::BTreeMap;

use serde::Serialize;

use super::drive::Pass;
use crate::percentile::percentile;
use crate::table::Table;

/// One pass's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub target: String,
    pub peer: bool,
    pub concurrency: usize,
    pub repeat: usize,
    pub conversations: usize,
    pub turns: usize,
    pub failed_conversations: usize,
    pub ttft_first_turn_p50_ms: f64,
    /// Over turns 2 and later.
    pub ttft_later_p50_ms: f64,
    pub ttft_later_p99_ms: f64,
    pub ttft_later_mean_ms: f64,
    /// The pass, first request to last answer.
    pub total_seconds: f64,
    pub prompt_tokens: usize,
    /// `None` when the server reported no cache counts.
    pub cached_tokens: Option<usize>,
    pub cached_share: Option<f64>,
    pub output_tokens_per_second: f64,
}

pub fn row(p: &Pass) -> Row {
    let ms = |v: Vec<f64>| v.into_iter().map(|s| s * 1e3).collect::<Vec<_>>();
    let first = ms(p
        .turns
        .iter()
        .filter(|t| t.turn == 0)
        .map(|t| t.ttft_seconds)
        .collect());
    let later = ms(p
        .turns
        .iter()
        .filter(|t| t.turn > 0)
        .map(|t| t.ttft_seconds)
        .collect());
    let prompt_tokens = p.turns.iter().filter_map(|t| t.prompt_tokens).sum();
    let reported: Vec<usize> = p.turns.iter().filter_map(|t| t.cached_tokens).collect();
    let cached_tokens = (!reported.is_empty()).then(|| reported.iter().sum::<usize>());
    let output: usize = p.turns.iter().map(|t| t.output_tokens).sum();
    let conversations: std::collections::BTreeSet<usize> =
        p.turns.iter().map(|t| t.conversation).collect();
    Row {
        target: p.target.clone(),
        peer: p.peer,
        concurrency: p.concurrency,
        repeat: p.repeat,
        conversations: conversations.len(),
        turns: p.turns.len(),
        failed_conversations: p.failures.len(),
        ttft_first_turn_p50_ms: percentile(first, 0.5),
        ttft_later_p50_ms: percentile(later.clone(), 0.5),
        ttft_later_p99_ms: percentile(later.clone(), 0.99),
        ttft_later_mean_ms: later.iter().sum::<f64>() / later.len().max(1) as f64,
        total_seconds: p.duration_seconds,
        prompt_tokens,
        cached_tokens,
        cached_share: cached_tokens
            .filter(|_| prompt_tokens > 0)
            .map(|c| c as f64 / prompt_tokens as f64),
        output_tokens_per_second: output as f64 / p.duration_seconds.max(1e-9),
    }
}

/// A row per pass.
pub fn table(rows: &[Row]) -> Table {
    let mut t = Table::new(&[
        "target",
        "conc.",
        "rep.",
        "turns",
        "TTFT turn 1 p50 ms",
        "TTFT turns 2+ p50 ms",
        "p99 ms",
        "total s",
        "prompt tokens",
        "cached",
        "out tok/s",
    ]);
    for r in rows {
        t.row(vec![
            r.target.clone(),
            r.concurrency.to_string(),
            r.repeat.to_string(),
            if r.failed_conversations > 0 {
                format!("{} ({} conv. failed)", r.turns, r.failed_conversations)
            } else {
                r.turns.to_string()
            },
            format!("{:.0}", r.ttft_first_turn_p50_ms),
            format!("{:.0}", r.ttft_later_p50_ms),
            format!("{:.0}", r.ttft_later_p99_ms),
            format!("{:.1}", r.total_seconds),
            r.prompt_tokens.to_string(),
            r.cached_share
                .map_or("—".into(), |s| format!("{:.1}%", s * 100.0)),
            format!("{:.1}", r.output_tokens_per_second),
        ]);
    }
    t
}

/// Ours against llama.cpp, by concurrency and repetition: each of our
/// targets' TTFT on turns 2+ (p50) and total time as a multiple of the
/// fastest llama.cpp configuration's (below 1: ours is faster).
#[derive(Debug, Clone, Serialize)]
pub struct Versus {
    pub concurrency: usize,
    pub repeat: usize,
    pub target: String,
    pub peer: String,
    pub ttft_later_p50_ratio: f64,
    pub total_ratio: f64,
}

pub fn versus(rows: &[Row]) -> Vec<Versus> {
    let mut out = Vec::new();
    let mut keys: Vec<(usize, usize)> = rows.iter().map(|r| (r.concurrency, r.repeat)).collect();
    keys.sort_unstable();
    keys.dedup();
    for (c, rep) in keys {
        let at = || {
            rows.iter()
                .filter(move |r| r.concurrency == c && r.repeat == rep)
        };
        let Some(best) = at()
            .filter(|r| r.peer && r.failed_conversations == 0)
            .min_by(|a, b| a.total_seconds.total_cmp(&b.total_seconds))
        else {
            continue;
        };
        for r in at().filter(|r| !r.peer) {
            out.push(Versus {
                concurrency: c,
                repeat: rep,
                target: r.target.clone(),
                peer: best.target.clone(),
                ttft_later_p50_ratio: r.ttft_later_p50_ms / best.ttft_later_p50_ms.max(1e-9),
                total_ratio: r.total_seconds / best.total_seconds.max(1e-9),
            });
        }
    }
    out
}

pub fn versus_table(v: &[Versus]) -> Table {
    let mut t = Table::new(&[
        "target",
        "conc.",
        "rep.",
        "against",
        "TTFT turns 2+ p50, ours ÷ theirs",
        "total, ours ÷ theirs",
    ]);
    for x in v {
        t.row(vec![
            x.target.clone(),
            x.concurrency.to_string(),
            x.repeat.to_string(),
            x.peer.clone(),
            format!("{:.2}x", x.ttft_later_p50_ratio),
            format!("{:.2}x", x.total_ratio),
        ]);
    }
    t
}

/// Greedy answers must not depend on the API, the session, the
/// concurrency or the repetition: every turn of our passes is compared
/// with the same turn of our first pass that answered it. A conversation
/// is compared up to its first difference only (after it the histories
/// differ). Returns the differences, and llama.cpp's conversations that
/// equal ours on every turn, out of those compared.
pub fn identity(passes: &[Pass]) -> (Vec<String>, (usize, usize)) {
    let mut reference: BTreeMap<(usize, usize), (&str, &str)> = BTreeMap::new();
    for p in passes.iter().filter(|p| !p.peer) {
        for t in &p.turns {
            reference
                .entry((t.conversation, t.turn))
                .or_insert((t.text.as_str(), p.target.as_str()));
        }
    }
    let (mut mismatches, mut agree, mut compared) = (Vec::new(), 0, 0);
    for p in passes {
        let mut conversations: BTreeMap<usize, bool> = BTreeMap::new();
        for t in &p.turns {
            let same = conversations.entry(t.conversation).or_insert(true);
            if !*same {
                continue;
            }
            let Some(&(text, from)) = reference.get(&(t.conversation, t.turn)) else {
                continue;
            };
            if text != t.text {
                *same = false;
                if !p.peer {
                    mismatches.push(format!(
                        "conversation {}, turn {}: {} at concurrency {} (repeat {}) differs from {}",
                        t.conversation,
                        t.turn + 1,
                        p.target,
                        p.concurrency,
                        p.repeat,
                        from
                    ));
                }
            }
        }
        if p.peer {
            compared += conversations.len();
            agree += conversations.values().filter(|&&s| s).count();
        }
    }
    (mismatches, (agree, compared))
}

#[cfg(test)]
mod tests {
    use super::super::drive::TurnRecord;
    use super::*;

    fn turn(conversation: usize, turn: usize, ttft: f64, text: &str) -> TurnRecord {
        TurnRecord {
            conversation,
            turn,
            prompt_tokens: Some(100),
            cached_tokens: Some(if turn == 0 { 0 } else { 80 }),
            ttft_seconds: ttft,
            e2el_seconds: ttft + 1.0,
            output_tokens: 10,
            text: text.into(),
        }
    }

    fn pass(target: &str, peer: bool, duration: f64, turns: Vec<TurnRecord>) -> Pass {
        Pass {
            target: target.into(),
            peer,
            concurrency: 1,
            repeat: 1,
            duration_seconds: duration,
            turns,
            failures: Vec::new(),
        }
    }

    #[test]
    fn first_and_later_turns_are_apart_and_the_cache_share_is_of_all_prompt_tokens() {
        let p = pass(
            "ours",
            false,
            10.0,
            vec![
                turn(0, 0, 2.0, "a"),
                turn(0, 1, 0.5, "b"),
                turn(0, 2, 0.3, "c"),
            ],
        );
        let r = row(&p);
        assert_eq!((r.turns, r.conversations), (3, 1));
        assert!((r.ttft_first_turn_p50_ms - 2000.0).abs() < 1e-9);
        // Nearest rank of [300, 500] at 0.5 is index round(0.5) = 1.
        assert!((r.ttft_later_p50_ms - 500.0).abs() < 1e-9);
        assert!((r.ttft_later_mean_ms - 400.0).abs() < 1e-9);
        assert_eq!(r.cached_tokens, Some(160));
        assert!((r.cached_share.unwrap() - 160.0 / 300.0).abs() < 1e-12);
        assert!((r.output_tokens_per_second - 3.0).abs() < 1e-12);
        let mut silent = p;
        for t in &mut silent.turns {
            t.cached_tokens = None;
        }
        assert_eq!(row(&silent).cached_share, None);
    }

    #[test]
    fn ours_is_compared_with_the_fastest_peer() {
        let rows: Vec<Row> = [
            pass(
                "ours",
                false,
                10.0,
                vec![turn(0, 0, 1.0, "a"), turn(0, 1, 0.2, "b")],
            ),
            pass(
                "llama.cpp",
                true,
                20.0,
                vec![turn(0, 0, 1.0, "a"), turn(0, 1, 0.4, "b")],
            ),
            pass(
                "llama.cpp ngram-mod",
                true,
                16.0,
                vec![turn(0, 0, 1.0, "a"), turn(0, 1, 0.8, "b")],
            ),
        ]
        .iter()
        .map(row)
        .collect();
        let v = versus(&rows);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].peer, "llama.cpp ngram-mod");
        assert!((v[0].total_ratio - 10.0 / 16.0).abs() < 1e-12);
        assert!((v[0].ttft_later_p50_ratio - 0.25).abs() < 1e-12);
    }

    #[test]
    fn a_changed_answer_is_a_mismatch_for_ours_and_a_disagreement_for_the_peer() {
        let passes = [
            pass(
                "gRPC",
                false,
                1.0,
                vec![
                    turn(0, 0, 1.0, "a"),
                    turn(0, 1, 1.0, "b"),
                    turn(1, 0, 1.0, "x"),
                ],
            ),
            pass(
                "HTTP",
                false,
                1.0,
                vec![
                    turn(0, 0, 1.0, "a"),
                    turn(0, 1, 1.0, "B"),
                    turn(1, 0, 1.0, "x"),
                ],
            ),
            pass(
                "llama.cpp",
                true,
                1.0,
                vec![
                    turn(0, 0, 1.0, "z"),
                    turn(0, 1, 1.0, "b"),
                    turn(1, 0, 1.0, "x"),
                ],
            ),
        ];
        let (mismatches, (agree, compared)) = identity(&passes);
        assert_eq!(mismatches.len(), 1, "{mismatches:?}");
        assert!(mismatches[0].contains("turn 2: HTTP"), "{mismatches:?}");
        assert_eq!((agree, compared), (1, 2));
    }
}
