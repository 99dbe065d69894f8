//! Tool calls: how each model family writes a call, parsed from its output
//! as it streams ([`Splitter`]), and the grammar that makes a model call
//! ([`Family::grammar`]).
//!
//! A family is found by its chat template ([`family_of`]): the template
//! that renders tools into the prompt also shows the model the format it
//! is to answer in, so the template names the family. A template that
//! reads `tools` but matches no family here cannot be served (the calls
//! could not be parsed); a new family is one more entry in [`FAMILIES`].
//!
//! Pure: no I/O; the gateway renders the prompt, compiles the grammar and
//! checks each parsed call against its tool.

#![forbid(unsafe_code)]

mod grammar;
mod split;

use serde_json::Value;

pub use split::{Piece, RawCall, Splitter};

/// A function a request offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// Its arguments' JSON schema (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// OpenAI's shape, which templates are given (`tools` in Jinja):
    /// `{"type": "function", "function": {"name", "description"?,
    /// "parameters"}}`.
    pub fn to_template(&self) -> Value {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::from(self.name.clone()));
        if !self.description.is_empty() {
            function.insert("description".into(), Value::from(self.description.clone()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        serde_json::json!({"type": "function", "function": function})
    }
}

/// What a grammar forces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced<'a> {
    /// At least one call of any tool; several when `parallel`.
    Any { parallel: bool },
    /// Exactly one call of this tool.
    Named(&'a str),
}

/// A model family's call format.
#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    /// For logs and errors.
    pub name: &'static str,
    /// Found in the chat template of a model that writes this format.
    marker: &'static str,
    /// What opens and closes one call; between them, a JSON object
    /// `{"name": ..., "arguments": {...}}` (whitespace around it is
    /// accepted).
    open: &'static str,
    close: &'static str,
    /// What the format puts inside the tags around the object, and
    /// between two calls of one turn (what a forcing grammar writes).
    pad: &'static str,
    separator: &'static str,
}

/// Hermes' format, which Qwen2.5 (and Qwen3, Hermes 2/3) write:
/// `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, calls
/// separated by a newline.
pub const HERMES: Family = Family {
    name: "hermes",
    marker: "<tool_call>",
    open: "<tool_call>",
    close: "</tool_call>",
    pad: "\n",
    separator: "\n",
};

/// Every family, tried in order.
pub const FAMILIES: &[Family] = &[HERMES];

/// The family whose format `template` shows the model.
pub fn family_of(template: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| template.contains(f.marker))
}

impl Family {
    /// A streaming parser of this family's calls.
    pub fn splitter(&'static self) -> Splitter {
        Splitter::new(self)
    }
}

/// Tool names as OpenAI allows them: `[A-Za-z0-9_-]{1,64}` (they are
/// written into grammars and prompts unescaped).
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_found_by_their_template() {
        let qwen = "{%- if tools %}...<tool_call>\\n{\"name\": <function-name>...";
        assert_eq!(family_of(qwen), Some(&HERMES));
        assert_eq!(family_of("{% for message in messages %}"), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("get_weather-2"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("x\""));
        assert!(!valid_name(&"a".repeat(65)));
    }

    #[test]
    fn tools_render_in_openai_shape_in_order() {
        let t = Tool {
            name: "f".into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        };
        assert_eq!(
            t.to_template().to_string(),
            r#"{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}"#
        );
    }
}
