//! What a request asks the output to follow.

use llguidance::api::TopLevelGrammar;
use serde_json::Value;

use crate::GrammarError;

/// Which kind of constraint, for messages and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StructuredKind {
    JsonObject,
    JsonSchema,
    Regex,
    Lark,
}

impl StructuredKind {
    pub fn name(self) -> &'static str {
        match self {
            StructuredKind::JsonObject => "json_object",
            StructuredKind::JsonSchema => "json_schema",
            StructuredKind::Regex => "regex",
            StructuredKind::Lark => "lark",
        }
    }
}

impl std::fmt::Display for StructuredKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StructuredKind::JsonObject => "JSON object constraint",
            StructuredKind::JsonSchema => "JSON schema",
            StructuredKind::Regex => "regular expression",
            StructuredKind::Lark => "Lark grammar",
        })
    }
}

/// A constraint on the output as a request states it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Structured {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON schema, as JSON text.
    JsonSchema(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

impl Structured {
    pub fn kind(&self) -> StructuredKind {
        match self {
            Structured::JsonObject => StructuredKind::JsonObject,
            Structured::JsonSchema(_) => StructuredKind::JsonSchema,
            Structured::Regex(_) => StructuredKind::Regex,
            Structured::Lark(_) => StructuredKind::Lark,
        }
    }

    /// The schema, expression or grammar text (empty for a JSON object).
    pub fn text(&self) -> &str {
        match self {
            Structured::JsonObject => "",
            Structured::JsonSchema(t) | Structured::Regex(t) | Structured::Lark(t) => t,
        }
    }

    pub(crate) fn check(&self, max_bytes: usize) -> Result<(), GrammarError> {
        let kind = self.kind();
        let bytes = self.text().len();
        if bytes > max_bytes {
            return Err(GrammarError::TooLarge {
                kind,
                bytes,
                max: max_bytes,
            });
        }
        if kind != StructuredKind::JsonObject && self.text().trim().is_empty() {
            return Err(GrammarError::Empty { kind });
        }
        Ok(())
    }

    pub(crate) fn cache_key(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }

    pub(crate) fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            Structured::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                serde_json::json!({"type": "object"}),
            )),
            Structured::JsonSchema(text) => {
                let schema: Value =
                    serde_json::from_str(text).map_err(|e| GrammarError::NotJson(e.to_string()))?;
                TopLevelGrammar::from_json_schema(with_layout(schema))
            }
            Structured::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Structured::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// The schema with the default layout (see the crate docs) unless it
/// states its own: what a JSON schema is compiled with, also inside a
/// Lark grammar's `%json { ... }`.
pub fn with_layout(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".into(),
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}
