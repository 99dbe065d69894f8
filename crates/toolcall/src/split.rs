//! Output text → content and calls, as it streams.
//!
//! Text passes through until a family's opening tag; from there on it is
//! held back until the closing tag, then parsed as one call. What could
//! still become an opening tag (`"<tool"` at the end of a chunk) waits for
//! the next chunk, and so does whitespace at the end of the content: the
//! newlines around calls are the format's, not the content's, and are
//! dropped next to a call.
//!
//! A call that does not parse is given back as text (the caller sees what
//! the model wrote); a call left open when the output ends is parsed as far
//! as it got (models often end the turn without the closing tag).

use serde_json::Value;

use crate::Family;

/// A call as the model wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct RawCall {
    pub name: String,
    /// A JSON object.
    pub arguments: Value,
    /// The call's whole text, tags included: what the caller sees instead
    /// when the call is refused (an unknown tool, arguments off schema).
    pub text: String,
}

/// A piece of the output.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Call(RawCall),
}

/// Where the splitter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In content; `after_call`: right after a call (leading whitespace
    /// is dropped).
    Text { after_call: bool },
    /// Inside a call's tags.
    Call,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Splitter {
    family: &'static Family,
    state: State,
    /// Held back: in content, a possible tag start or trailing whitespace;
    /// in a call, the call's text after the opening tag.
    held: String,
    calls: usize,
}

impl Splitter {
    pub(crate) fn new(family: &'static Family) -> Splitter {
        Splitter {
            family,
            state: State::Text { after_call: false },
            held: String::new(),
            calls: 0,
        }
    }

    /// Calls parsed so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Adds output text; what it completes goes to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Text { after_call } => {
                    if after_call {
                        let trimmed = self.held.trim_start();
                        if trimmed.is_empty() {
                            self.held.clear();
                            return;
                        }
                        self.held = trimmed.to_owned();
                        self.state = State::Text { after_call: false };
                    }
                    let open = self.family.open;
                    if let Some(at) = self.held.find(open) {
                        let before = self.held[..at].trim_end();
                        push_text(out, before);
                        self.held.drain(..at + open.len());
                        self.state = State::Call;
                        continue;
                    }
                    // Keep what may still open a call, and trailing
                    // whitespace; release the rest.
                    let keep = self.held.len() - partial_prefix(&self.held, open);
                    let keep = self.held[..keep].trim_end().len();
                    let released: String = self.held.drain(..keep).collect();
                    push_text(out, &released);
                    return;
                }
                State::Call => {
                    let Some(at) = self.held.find(self.family.close) else {
                        return;
                    };
                    let body: String = self.held.drain(..at).collect();
                    self.held.drain(..self.family.close.len());
                    out.push(self.parse(&body, true));
                    self.state = State::Text { after_call: true };
                }
            }
        }
    }

    /// Ends the output: releases what was held back.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Text { .. } if self.calls > 0 => push_text(out, held.trim_end()),
            State::Text { .. } => push_text(out, &held),
            State::Call => out.push(self.parse(&held, false)),
        }
        self.state = State::Text { after_call: true };
    }

    /// One call's text between the tags; `closed`: the closing tag came.
    fn parse(&mut self, body: &str, closed: bool) -> Piece {
        let mut text = format!("{}{body}", self.family.open);
        if closed {
            text.push_str(self.family.close);
        }
        match call(body) {
            Some((name, arguments)) => {
                self.calls += 1;
                Piece::Call(RawCall {
                    name,
                    arguments,
                    text,
                })
            }
            None => Piece::Text(text),
        }
    }
}

/// `{"name": "f", "arguments": {...}}`; arguments given as a string of
/// JSON (some models write that) are read as their object.
fn call(body: &str) -> Option<(String, Value)> {
    let Value::Object(mut map) = serde_json::from_str(body.trim()).ok()? else {
        return None;
    };
    let Value::String(name) = map.remove("name")? else {
        return None;
    };
    let arguments = match map
        .remove("arguments")
        .unwrap_or_else(|| Value::Object(Default::default()))
    {
        Value::String(s) => serde_json::from_str(&s).ok()?,
        other => other,
    };
    arguments.is_object().then_some((name, arguments))
}

fn push_text(out: &mut Vec<Piece>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Text(last)) = out.last_mut() {
        last.push_str(text);
    } else {
        out.push(Piece::Text(text.to_owned()));
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of
/// `tag` (a tag that may still be completed by what comes next).
fn partial_prefix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HERMES;

    /// Pushes `chunks` one by one, then finishes.
    fn split(chunks: &[&str]) -> Vec<Piece> {
        let mut s = HERMES.splitter();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        // Adjacent text pieces from separate pushes, merged.
        let mut merged: Vec<Piece> = Vec::new();
        for p in out {
            match p {
                Piece::Text(t) => push_text(&mut merged, &t),
                call => merged.push(call),
            }
        }
        merged
    }

    fn call_of(name: &str, arguments: Value) -> (String, Value) {
        (name.to_owned(), arguments)
    }

    fn calls(pieces: &[Piece]) -> Vec<(String, Value)> {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Call(c) => Some(call_of(&c.name, c.arguments.clone())),
                Piece::Text(_) => None,
            })
            .collect()
    }

    const ONE: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn plain_text_passes_through_whole() {
        assert_eq!(
            split(&["Hello ", "world\n"]),
            vec![Piece::Text("Hello world\n".into())]
        );
    }

    #[test]
    fn one_call_in_any_chunking_is_one_call() {
        let whole = split(&[ONE]);
        assert_eq!(
            calls(&whole),
            vec![call_of("get_weather", serde_json::json!({"city": "Paris"}))]
        );
        assert_eq!(whole.len(), 1);
        // Every split point, including inside the tags.
        for at in 1..ONE.len() {
            let pieces = split(&[&ONE[..at], &ONE[at..]]);
            assert_eq!(pieces, whole, "split at {at}");
        }
    }

    #[test]
    fn content_before_and_between_calls_loses_only_the_format_s_newlines() {
        let text = format!("Let me check.\n{ONE}\n{ONE}\n");
        let pieces = split(&[&text]);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[0], Piece::Text("Let me check.".into()));
        assert_eq!(calls(&pieces).len(), 2);
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_released() {
        let mut s = HERMES.splitter();
        let mut out = Vec::new();
        s.push("a <tool", &mut out);
        assert_eq!(out, vec![Piece::Text("a".into())]);
        s.push("box> b", &mut out);
        s.finish(&mut out);
        assert_eq!(
            split(&["a <tool", "box> b"]),
            vec![Piece::Text("a <toolbox> b".into())]
        );
    }

    #[test]
    fn a_call_that_does_not_parse_is_text() {
        let bad = "<tool_call>\n{\"name\": 3}\n</tool_call>";
        assert_eq!(split(&[bad]), vec![Piece::Text(bad.into())]);
    }

    #[test]
    fn an_unclosed_call_at_the_end_is_parsed_as_far_as_it_got() {
        let open = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}";
        assert_eq!(
            calls(&split(&[open])),
            vec![call_of("f", serde_json::json!({}))]
        );
        let cut = "<tool_call>\n{\"name\": \"f\", \"argu";
        assert_eq!(split(&[cut]), vec![Piece::Text(cut.into())]);
    }

    #[test]
    fn string_arguments_are_read_as_their_object() {
        let s = "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>";
        assert_eq!(
            calls(&split(&[s])),
            vec![call_of("f", serde_json::json!({"a": 1}))]
        );
    }

    #[test]
    fn trailing_whitespace_of_content_without_calls_is_kept() {
        assert_eq!(split(&["hi\n", "\n"]), vec![Piece::Text("hi\n\n".into())]);
    }
}
