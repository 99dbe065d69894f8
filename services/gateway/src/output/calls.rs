//! Released text → content and tool calls, for a request that offered
//! tools.
//!
//! The family's [`Splitter`] finds the calls as the text streams. A call
//! a grammar forced is taken as it is; one the model chose (`auto`) is
//! checked first: its tool must be offered and its arguments must follow
//! the tool's schema (compiled with flexible whitespace and run over the
//! arguments' tokens). A call that fails is given back as the text the
//! model wrote, as vLLM's parsers do: the caller sees no call it did not
//! offer.

use std::sync::Arc;

use rand::Rng as _;
use rand::distr::Alphanumeric;
use serde_json::Value;
use specmesh_grammar::{Grammars, Structured};
use specmesh_proto::v1;
use specmesh_tokenizer::Tokenizer;
use specmesh_toolcall::{Piece, RawCall, Splitter, Tool};

use crate::validate::ValidTools;

/// See the module docs.
#[derive(Debug)]
pub struct Calls {
    splitter: Splitter,
    tools: Arc<[Tool]>,
    forced: bool,
    /// Checks `auto` calls' arguments; `None`: by name only.
    schemas: Option<(Tokenizer, Arc<Grammars>)>,
    pieces: Vec<Piece>,
    made: usize,
}

impl Calls {
    pub fn new(tools: &ValidTools, tokenizer: &Tokenizer) -> Calls {
        Calls {
            splitter: tools.family.splitter(),
            tools: Arc::clone(&tools.tools),
            forced: tools.forced,
            schemas: tools.schemas.0.clone().map(|g| (tokenizer.clone(), g)),
            pieces: Vec::new(),
            made: 0,
        }
    }

    /// Calls made so far.
    pub fn made(&self) -> usize {
        self.made
    }

    /// Splits released `text` into `content` and `calls`.
    pub fn push(&mut self, text: &str, content: &mut String, calls: &mut Vec<v1::ToolCall>) {
        let mut pieces = std::mem::take(&mut self.pieces);
        self.splitter.push(text, &mut pieces);
        self.drain(&mut pieces, content, calls);
        self.pieces = pieces;
    }

    /// Releases what the splitter held back.
    pub fn finish(&mut self, content: &mut String, calls: &mut Vec<v1::ToolCall>) {
        let mut pieces = std::mem::take(&mut self.pieces);
        self.splitter.finish(&mut pieces);
        self.drain(&mut pieces, content, calls);
        self.pieces = pieces;
    }

    fn drain(
        &mut self,
        pieces: &mut Vec<Piece>,
        content: &mut String,
        calls: &mut Vec<v1::ToolCall>,
    ) {
        for piece in pieces.drain(..) {
            match piece {
                Piece::Text(t) => content.push_str(&t),
                Piece::Call(c) if self.accepts(&c) => {
                    self.made += 1;
                    calls.push(v1::ToolCall {
                        id: call_id(),
                        name: c.name,
                        arguments: c.arguments.to_string(),
                    });
                }
                Piece::Call(c) => {
                    tracing::debug!(tool = %c.name, "a tool call that does not fit its tool is returned as text");
                    content.push_str(&c.text);
                }
            }
        }
    }

    /// Whether `call` names an offered tool with arguments on its schema.
    fn accepts(&self, call: &RawCall) -> bool {
        let Some(tool) = self.tools.iter().find(|t| t.name == call.name) else {
            return false;
        };
        if self.forced {
            return true;
        }
        let (Some((tokenizer, grammars)), Value::Object(_)) = (&self.schemas, &tool.parameters)
        else {
            return true;
        };
        let schema = flexible(tool.parameters.clone());
        let grammar = match grammars.compile(&Structured::JsonSchema(schema.to_string())) {
            Ok(g) => g,
            // A schema the engine cannot compile cannot be checked.
            Err(e) => {
                tracing::debug!(tool = %tool.name, error = %e, "tool schema not checked");
                return true;
            }
        };
        let Ok(tokens) = tokenizer.encode(&call.arguments.to_string(), false) else {
            return false;
        };
        let mut constraint = grammar.start();
        constraint.resume(&tokens).is_ok() && constraint.is_accepting()
    }
}

/// The schema with any whitespace allowed (unless it states its own
/// layout): a model choosing a call owes no layout.
fn flexible(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": true}),
        );
    }
    schema
}

/// OpenAI's shape of a call id: `call_` and 24 letters and digits.
fn call_id() -> String {
    let suffix: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("call_{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::OutputBuilder;
    use crate::testing::{self, ids};
    use crate::validate::SchemaCompiler;

    fn builder(forced: bool) -> OutputBuilder {
        let tok = testing::tokenizer();
        let tools = ValidTools {
            family: &specmesh_toolcall::HERMES,
            tools: vec![Tool {
                name: "get_weather".into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            }]
            .into(),
            forced,
            schemas: SchemaCompiler(None),
        };
        OutputBuilder::new(&tok, Vec::new()).with_calls(Calls::new(&tools, &tok))
    }

    const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn a_call_is_released_whole_with_its_tokens_and_no_text() {
        let mut b = builder(false);
        let text = format!("Checking.\n{CALL}");
        let all = ids(&text);
        let (head, tail) = all.split_at(20);
        let d = b.push(head, &[]).unwrap();
        assert_eq!(d.text, "Checking.");
        assert!(d.tool_calls.is_empty());
        let d = b.push(tail, &[]).unwrap();
        assert_eq!(d.text, "");
        assert_eq!(d.tool_calls.len(), 1);
        assert_eq!(d.tool_calls[0].name, "get_weather");
        assert_eq!(d.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert!(d.tool_calls[0].id.starts_with("call_") && d.tool_calls[0].id.len() == 29);
        // The tokens go out with the calls: none is lost.
        assert!(b.finish().is_empty());
        assert!(b.called());
        assert_eq!(b.reported(), all.len());
    }

    #[test]
    fn a_call_of_a_tool_not_offered_is_text() {
        let mut b = builder(false);
        let other = CALL.replace("get_weather", "launch");
        let d = b.push(&ids(&other), &[]).unwrap();
        let d2 = b.finish();
        assert_eq!(format!("{}{}", d.text, d2.text), other);
        assert!(!b.called());
    }
}
