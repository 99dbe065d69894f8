//! The grammar that makes a model call: `tool_choice: "required"` or a
//! named function. A Lark grammar (llguidance's dialect) of the family's
//! call format, each tool's arguments a `%json` of its schema with the
//! default layout, so the whole frame (`<tool_call>\n{"name": "`, the key
//! names, the closing braces) is forced and the speculation gets it free.

use serde_json::Value;
use specmesh_grammar::{Structured, with_layout};

use crate::{Family, Forced, Tool};

impl Family {
    /// The Lark grammar forcing `forced` over `tools` (names already
    /// checked with [`crate::valid_name`]); `None` when a named tool is
    /// not among them.
    pub fn grammar(&self, tools: &[Tool], forced: Forced<'_>) -> Option<Structured> {
        let chosen: Vec<(usize, &Tool)> = match forced {
            Forced::Any { .. } => tools.iter().enumerate().collect(),
            Forced::Named(name) => vec![tools.iter().enumerate().find(|(_, t)| t.name == name)?],
        };
        if chosen.is_empty() {
            return None;
        }
        let parallel = matches!(forced, Forced::Any { parallel: true });
        let mut g = String::new();
        if parallel {
            g.push_str(&format!("start: call ({} call)*\n", lit(self.separator)));
        } else {
            g.push_str("start: call\n");
        }
        let alternatives: Vec<String> = chosen.iter().map(|(i, _)| format!("call_{i}")).collect();
        g.push_str(&format!("call: {}\n", alternatives.join(" | ")));
        for (i, tool) in chosen {
            let head = format!(
                "{}{}{{\"name\": \"{}\", \"arguments\": ",
                self.open, self.pad, tool.name
            );
            let tail = format!("}}{}{}", self.pad, self.close);
            g.push_str(&format!(
                "call_{i}: {} args_{i} {}\n",
                lit(&head),
                lit(&tail)
            ));
            g.push_str(&format!(
                "args_{i}: %json {}\n",
                with_layout(arguments_schema(tool))
            ));
        }
        Some(Structured::Lark(g))
    }
}

/// A tool's parameters as the schema its arguments follow: no parameters
/// is an empty object.
fn arguments_schema(tool: &Tool) -> Value {
    match &tool.parameters {
        Value::Null => serde_json::json!({"type": "object", "properties": {}}),
        p => p.clone(),
    }
}

/// A Lark string literal (JSON's syntax).
fn lit(s: &str) -> String {
    Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HERMES;

    fn tools() -> Vec<Tool> {
        vec![
            Tool {
                name: "get_weather".into(),
                description: "Weather".into(),
                parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
            Tool {
                name: "now".into(),
                description: String::new(),
                parameters: Value::Null,
            },
        ]
    }

    #[test]
    fn required_offers_every_tool_and_parallel_repeats() {
        let Some(Structured::Lark(g)) = HERMES.grammar(&tools(), Forced::Any { parallel: true })
        else {
            panic!("no grammar");
        };
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
        assert!(g.contains("call: call_0 | call_1\n"));
        assert!(g.contains(r#"call_0: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " args_0 "}\n</tool_call>""#), "{g}");
        assert!(g.contains(r#""key_separator":": ""#), "{g}");
        let Some(Structured::Lark(single)) =
            HERMES.grammar(&tools(), Forced::Any { parallel: false })
        else {
            panic!("no grammar");
        };
        assert!(single.starts_with("start: call\n"));
    }

    #[test]
    fn a_named_tool_is_the_only_one() {
        let Some(Structured::Lark(g)) = HERMES.grammar(&tools(), Forced::Named("now")) else {
            panic!("no grammar");
        };
        assert!(g.contains("call: call_1\n"));
        assert!(!g.contains("get_weather"));
        assert!(
            g.contains(r#"args_1: %json {"type":"object","properties":{}"#),
            "{g}"
        );
        assert_eq!(HERMES.grammar(&tools(), Forced::Named("nope")), None);
    }
}
