//! The conversations, built from the dev sets: what an agent or a coding
//! assistant sends turn after turn. Every conversation opens with the same
//! system prompt (an agent's tool descriptions), then its user turns: a
//! long document with a question (Spec-Bench `rag`), a short follow-up (an
//! MT-bench second turn), another document to summarize (Spec-Bench
//! `summarization`), another follow-up, and a code file to edit
//! (`code_dev.jsonl`'s `code-edit`). Conversation `i` takes the `i`-th of
//! each kind, cycling, so conversations differ but for their system prompt.

use anyhow::{Result, bail};

use crate::specbench::Question;

/// The shared system prompt: tool descriptions, as agent frameworks send
/// them on every call (about 450 tokens).
pub const SYSTEM_PROMPT: &str = r#"You are a careful assistant for a software team. Answer the user's request directly and concisely. When a tool would help, you may call one by answering with a JSON object {"tool": NAME, "arguments": {...}} and nothing else.

Tools:
- search_docs: full-text search over the team's internal documentation.
  arguments: {"query": string (required), "max_results": integer 1-20 (default 5), "space": one of "eng", "ops", "product" (optional)}
- read_file: returns the contents of a file of the repository.
  arguments: {"path": string (required, relative to the repository root), "start_line": integer (optional), "end_line": integer (optional)}
- write_file: replaces the contents of a file; the user reviews every change before it is applied.
  arguments: {"path": string (required), "content": string (required)}
- run_tests: runs the test suite, or one test file, and returns the failures with their output.
  arguments: {"target": string (optional: a file or a test name), "timeout_seconds": integer 1-1800 (default 600)}
- create_ticket: opens an issue in the tracker.
  arguments: {"title": string (required, at most 120 characters), "body": string (required, Markdown), "labels": array of strings (optional), "assignee": string (optional)}
- get_metrics: reads a time series from the monitoring system.
  arguments: {"query": string (required, PromQL), "range_minutes": integer 1-10080 (default 60), "step_seconds": integer (default 60)}

Rules: never invent a file's contents, read it first; quote numbers with their units; say so when you are unsure; keep code answers in one fenced code block."#;

/// The longest document a conversation carries, in characters: Spec-Bench
/// `summarization` holds articles of up to 6,800, which alone would make
/// a turn of the 1.5B on two cores a minute of prefill.
const MAX_DOCUMENT_CHARS: usize = 3500;

/// The user turns of a conversation, in order.
pub const TURN_KINDS: [&str; 5] = [
    "document + question",
    "follow-up",
    "document to summarize",
    "follow-up",
    "code to edit",
];

/// One conversation: its user turns, each sent with the whole history
/// before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    pub id: usize,
    pub user_turns: Vec<String>,
}

/// `n` conversations of `turns` user turns (1..=5) from the Spec-Bench
/// dev set `spec` and the code dev set `code`.
pub fn conversations(
    spec: &[Question],
    code: &[Question],
    n: usize,
    turns: usize,
) -> Result<Vec<Conversation>> {
    if !(1..=TURN_KINDS.len()).contains(&turns) {
        bail!(
            "`--turns {turns}`: a conversation has 1 to {} user turns",
            TURN_KINDS.len()
        );
    }
    let of = |set: &[Question], category: &str| -> Vec<String> {
        set.iter()
            .filter(|q| q.category == category)
            .map(|q| q.prompt().to_owned())
            .collect()
    };
    let short = |docs: Vec<String>| -> Vec<String> {
        docs.into_iter()
            .filter(|d| d.chars().count() <= MAX_DOCUMENT_CHARS)
            .collect()
    };
    let documents = short(of(spec, "rag"));
    let summaries = short(of(spec, "summarization"));
    // MT-bench's second turns refer to the answer before them: follow-ups.
    let follow_ups: Vec<String> = spec
        .iter()
        .filter_map(|q| q.turns.get(1).cloned())
        .collect();
    let edits = of(code, "code-edit");
    // Each kind of material is needed from the turn that first uses it.
    for (first_turn, what, set, from) in [
        (
            0,
            "`rag` questions (of at most 3,500 characters)",
            &documents,
            "the Spec-Bench file",
        ),
        (
            1,
            "two-turn (MT-bench) questions",
            &follow_ups,
            "the Spec-Bench file",
        ),
        (
            2,
            "`summarization` questions (of at most 3,500 characters)",
            &summaries,
            "the Spec-Bench file",
        ),
        (4, "`code-edit` questions", &edits, "the code file"),
    ] {
        if turns > first_turn && set.is_empty() {
            bail!("{from} has no {what}, which the conversations are built from");
        }
    }
    let pick = |set: &[String], i: usize| set[i % set.len()].clone();
    Ok((0..n)
        .map(|i| {
            // Built lazily: a set a shorter conversation does not reach
            // may be empty.
            let all: [&dyn Fn() -> String; 5] = [
                &|| pick(&documents, i),
                &|| pick(&follow_ups, 2 * i),
                &|| {
                    format!(
                        "Summarize this article in three sentences.\n\n{}",
                        pick(&summaries, i)
                    )
                },
                &|| pick(&follow_ups, 2 * i + 1),
                &|| pick(&edits, i),
            ];
            Conversation {
                id: i,
                user_turns: all.iter().take(turns).map(|f| f()).collect(),
            }
        })
        .collect())
}

/// The context, in tokens, that holds the longest of `conversations` with
/// its answers of up to `max_new` tokens: what each of llama-server's slots
/// needs. Counted from characters at two per token, generous for English
/// and code (both run nearer four), plus room for the chat template's
/// markers; rounded up to a multiple of 1,024.
pub fn context_bound(conversations: &[Conversation], max_new: u32) -> usize {
    const TEMPLATE_PER_MESSAGE: usize = 16;
    let longest = conversations
        .iter()
        .map(|c| {
            let text: usize = c.user_turns.iter().map(|t| t.len()).sum();
            let messages = 1 + 2 * c.user_turns.len();
            (SYSTEM_PROMPT.len() + text) / 2
                + c.user_turns.len() * max_new as usize
                + messages * TEMPLATE_PER_MESSAGE
        })
        .max()
        .unwrap_or(0);
    longest.div_ceil(1024).max(1) * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(category: &str, turns: &[&str]) -> Question {
        Question {
            question_id: serde_json::json!(category),
            category: category.into(),
            turns: turns.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    fn sets() -> (Vec<Question>, Vec<Question>) {
        let long = "x".repeat(MAX_DOCUMENT_CHARS + 1);
        let spec = vec![
            q("rag", &["doc A? "]),
            q("rag", &["doc B? "]),
            q("summarization", &[&long]),
            q("summarization", &["article 1"]),
            q("writing", &["write", "shorter please"]),
            q("math", &["solve", "and now for 3?"]),
            q("qa", &["one turn only"]),
        ];
        let code = vec![q("code-complete", &["def f"]), q("code-edit", &["edit f"])];
        (spec, code)
    }

    #[test]
    fn a_conversation_has_its_turns_in_order_and_conversations_differ() {
        let (spec, code) = sets();
        let cs = conversations(&spec, &code, 2, 5).unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(
            cs[0].user_turns,
            [
                "doc A? ",
                "shorter please",
                "Summarize this article in three sentences.\n\narticle 1",
                "and now for 3?",
                "edit f"
            ]
        );
        // The next conversation takes the next document; the long article
        // is never used.
        assert_eq!(cs[1].user_turns[0], "doc B? ");
        assert!(cs.iter().all(|c| !c.user_turns[2].contains("xxx")));
        let short = conversations(&spec, &code, 1, 2).unwrap();
        assert_eq!(short[0].user_turns.len(), 2);
    }

    #[test]
    fn the_context_bound_holds_the_whole_conversation() {
        let (spec, code) = sets();
        let cs = conversations(&spec, &code, 2, 5).unwrap();
        let bound = context_bound(&cs, 100);
        let text: usize = cs[0].user_turns.iter().map(|t| t.len()).sum();
        assert!(bound >= (SYSTEM_PROMPT.len() + text) / 2 + 5 * 100);
        assert_eq!(bound % 1024, 0);
        assert!(context_bound(&cs, 1000) > bound);
    }

    #[test]
    fn only_the_turns_asked_for_need_their_material() {
        let (spec, _) = sets();
        // Two turns take a document and a follow-up: no code needed.
        let cs = conversations(&spec, &[], 1, 2).unwrap();
        assert_eq!(cs[0].user_turns.len(), 2);
    }

    #[test]
    fn missing_material_and_bad_turn_counts_are_refused() {
        let (spec, code) = sets();
        assert!(conversations(&spec, &code, 1, 0).is_err());
        assert!(conversations(&spec, &code, 1, 6).is_err());
        let e = conversations(&spec, &[], 1, 5).unwrap_err();
        assert!(e.to_string().contains("code-edit"), "{e}");
        let no_rag: Vec<Question> = spec
            .iter()
            .filter(|q| q.category != "rag")
            .cloned()
            .collect();
        assert!(
            conversations(&no_rag, &code, 1, 5)
                .unwrap_err()
                .to_string()
                .contains("rag")
        );
    }
}
