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
    /// Over turns 2 and later (`None` with one turn a conversation).
    pub ttft_later_p50_ms: Option<f64>,
    pub ttft_later_p99_ms: Option<f64>,
    pub ttft_later_mean_ms: Option<f64>,
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
        ttft_later_p50_ms: (!later.is_empty()).then(|| percentile(later.clone(), 0.5)),
        ttft_later_p99_ms: (!later.is_empty()).then(|| percentile(later.clone(), 0.99)),
        ttft_later_mean_ms: (!later.is_empty())
            .then(|| later.iter().sum::<f64>() / later.len() as f64),
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
            r.ttft_later_p50_ms
                .map_or("—".into(), |v| format!("{v:.0}")),
            r.ttft_later_p99_ms
                .map_or("—".into(), |v| format!("{v:.0}")),
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
    /// `None` with one turn a conversation.
    pub ttft_later_p50_ratio: Option<f64>,
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
        // A pass that lost conversations did less work: no ratio.
        for r in at().filter(|r| !r.peer && r.failed_conversations == 0) {
            out.push(Versus {
                concurrency: c,
                repeat: rep,
                target: r.target.clone(),
                peer: best.target.clone(),
                ttft_later_p50_ratio: r
                    .ttft_later_p50_ms
                    .zip(best.ttft_later_p50_ms)
                    .map(|(ours, theirs)| ours / theirs.max(1e-9)),
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
            x.ttft_later_p50_ratio
                .map_or("—".into(), |v| format!("{v:.2}x")),
            format!("{:.2}x", x.total_ratio),
        ]);
    }
    t
}

/// What [`identity`] found.
#[derive(Debug, Default, PartialEq)]
pub struct Identity {
    /// Our turns that differ from the first of our passes that answered
    /// the same turn.
    pub mismatches: Vec<String>,
    /// Our turns compared with another pass's.
    pub compared_turns: usize,
    /// llama.cpp's conversations answered whole that equal ours on every
    /// turn, and those it answered whole.
    pub peer_equal: usize,
    pub peer_whole: usize,
}

/// Greedy answers must not depend on the API, the session, the
/// concurrency or the repetition: every turn of our passes is compared
/// with the same turn of our first pass that answered it. A conversation
/// is compared up to its first difference only (after it the histories
/// differ). llama.cpp's conversations of all `turns` are compared with
/// ours too, for the record (its numerics differ).
pub fn identity(passes: &[Pass], turns: usize) -> Identity {
    let mut reference: BTreeMap<(usize, usize), (&str, &str)> = BTreeMap::new();
    for p in passes.iter().filter(|p| !p.peer) {
        for t in &p.turns {
            reference
                .entry((t.conversation, t.turn))
                .or_insert((t.text.as_str(), p.target.as_str()));
        }
    }
    let first_of = |target: &str, c: usize, turn: usize| {
        reference
            .get(&(c, turn))
            .is_some_and(|&(_, from)| from == target)
    };
    let mut out = Identity::default();
    for p in passes {
        // Per conversation: still equal, and turns seen.
        let mut conversations: BTreeMap<usize, (bool, usize)> = BTreeMap::new();
        for t in &p.turns {
            let (same, seen) = conversations.entry(t.conversation).or_insert((true, 0));
            *seen += 1;
            if !*same {
                continue;
            }
            let Some(&(text, from)) = reference.get(&(t.conversation, t.turn)) else {
                continue;
            };
            if !p.peer && !first_of(&p.target, t.conversation, t.turn) {
                out.compared_turns += 1;
            }
            if text != t.text {
                *same = false;
                if !p.peer {
                    out.mismatches.push(format!(
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
            let whole = conversations.values().filter(|(_, seen)| *seen == turns);
            let whole: Vec<bool> = whole.map(|(same, _)| *same).collect();
            out.peer_whole += whole.len();
            out.peer_equal += whole.iter().filter(|&&s| s).count();
        }
    }
    out
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
        assert!((r.ttft_later_p50_ms.unwrap() - 500.0).abs() < 1e-9);
        assert!((r.ttft_later_mean_ms.unwrap() - 400.0).abs() < 1e-9);
        assert_eq!(r.cached_tokens, Some(160));
        assert!((r.cached_share.unwrap() - 160.0 / 300.0).abs() < 1e-12);
        assert!((r.output_tokens_per_second - 3.0).abs() < 1e-12);
        let mut silent = p;
        for t in &mut silent.turns {
            t.cached_tokens = None;
        }
        assert_eq!(row(&silent).cached_share, None);
        // One turn a conversation: no later turns, no numbers for them.
        let one = pass("ours", false, 1.0, vec![turn(0, 0, 2.0, "a")]);
        assert_eq!(row(&one).ttft_later_p50_ms, None);
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
        assert!((v[0].ttft_later_p50_ratio.unwrap() - 0.25).abs() < 1e-12);
        // A pass of ours that lost a conversation gets no ratio.
        let mut lost = rows.clone();
        lost[0].failed_conversations = 1;
        assert!(versus(&lost).is_empty());
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
                    turn(1, 1, 1.0, "y"),
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
                    turn(1, 1, 1.0, "y"),
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
                    turn(1, 1, 1.0, "y"),
                ],
            ),
        ];
        let id = identity(&passes, 2);
        assert_eq!(id.mismatches.len(), 1, "{:?}", id.mismatches);
        assert!(
            id.mismatches[0].contains("turn 2: HTTP"),
            "{:?}",
            id.mismatches
        );
        // HTTP's four turns were compared with gRPC's (the first pass).
        assert_eq!(id.compared_turns, 4);
        // The peer's first conversation differs at its first turn, its
        // second equals ours; a conversation it did not finish is not
        // counted.
        assert_eq!((id.peer_equal, id.peer_whole), (1, 2));
        let mut short = passes;
        short[2].turns.pop();
        let id = identity(&short, 2);
        assert_eq!((id.peer_equal, id.peer_whole), (0, 1));
    }
}
