//! `chat.tools`, `chat.tool_choice` and a history's tool calls: checked,
//! and turned into what the chat template renders, the grammar a forced
//! call follows, and what the output is parsed with.

use std::sync::Arc;

use serde_json::Value;
use specmesh_grammar::{Grammars, Structured};
use specmesh_proto::v1::{self, ToolChoiceMode, tool_choice::Choice};
use specmesh_tokenizer::{ChatMessage, ToolCall};
use specmesh_toolcall::{Family, Forced, Tool, valid_name};

/// Most tools a request may offer.
pub const MAX_TOOLS: usize = 128;

/// Why a request's tools were refused.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(
        "the model's chat template declares no tools, so it cannot be offered any: send the request without `tools` (or with `tool_choice` none)"
    )]
    NotDeclared,
    #[error(
        "the model's chat template shows a tool-call format this server cannot parse (it knows: {known})"
    )]
    UnknownFormat { known: String },
    #[error("at most {max} tools, got {got}")]
    TooMany { max: usize, got: usize },
    #[error(
        "`tools[{index}].name` must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-', got {name:?}"
    )]
    Name { index: usize, name: String },
    #[error("`tools[{index}].name` {name:?} is offered twice")]
    Duplicate { index: usize, name: String },
    #[error("`tools[{index}].parameters` must be a JSON schema object: {reason}")]
    Parameters { index: usize, reason: String },
    #[error("`tool_choice` names {name:?}, which is not among the tools")]
    UnknownChoice { name: String },
    #[error("`tool_choice` must be 0 (auto), 1 (none) or 2 (required), got {0}")]
    ChoiceMode(i32),
    #[error("`tool_choice` asks for a call but no tools are offered")]
    NoTools,
    #[error(
        "`tool_choice` forces a call, whose format `structured` would contradict: send one of them"
    )]
    WithStructured,
    #[error("`messages[{index}].tool_calls[{call}].arguments` must be a JSON object, got {got:?}")]
    Arguments {
        index: usize,
        call: usize,
        got: String,
    },
    #[error("`messages[{index}].tool_calls` are an assistant's: the message's role is {role:?}")]
    CallsOutsideAssistant { index: usize, role: String },
}

impl ToolError {
    /// The request field at fault, as the gRPC API names it.
    pub fn field(&self) -> &'static str {
        match self {
            Self::NotDeclared
            | Self::UnknownFormat { .. }
            | Self::TooMany { .. }
            | Self::Name { .. }
            | Self::Duplicate { .. }
            | Self::Parameters { .. } => "chat.tools",
            Self::UnknownChoice { .. }
            | Self::ChoiceMode(_)
            | Self::NoTools
            | Self::WithStructured => "chat.tool_choice",
            Self::Arguments { .. } | Self::CallsOutsideAssistant { .. } => "chat.messages",
        }
    }
}

/// What a chat asks of tools, before the model is consulted.
#[derive(Debug, Clone)]
pub(super) struct ToolRequest {
    tools: Vec<Tool>,
    choice: Choice,
    parallel: bool,
}

/// The tools of a valid request: how its output is parsed into calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTools {
    pub family: &'static Family,
    /// What a call of `auto` is checked against (by name, then schema).
    pub tools: Arc<[Tool]>,
    /// A grammar forces the calls (`required`, a named tool): they need
    /// no checking.
    pub forced: bool,
    /// Compiles the schemas `auto` calls are checked with.
    pub schemas: SchemaCompiler,
}

/// The gateway's grammar compiler, if the vocabulary has one; equal to
/// any other (it is the server's, not the request's).
#[derive(Debug, Clone)]
pub struct SchemaCompiler(pub Option<Arc<Grammars>>);

impl PartialEq for SchemaCompiler {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl ToolRequest {
    /// The tools and choice of a wire `Chat`.
    pub(super) fn from_wire(chat: &mut v1::Chat) -> Result<ToolRequest, ToolError> {
        let wire = std::mem::take(&mut chat.tools);
        if wire.len() > MAX_TOOLS {
            return Err(ToolError::TooMany {
                max: MAX_TOOLS,
                got: wire.len(),
            });
        }
        let mut tools: Vec<Tool> = Vec::with_capacity(wire.len());
        for (index, t) in wire.into_iter().enumerate() {
            if !valid_name(&t.name) {
                return Err(ToolError::Name {
                    index,
                    name: t.name,
                });
            }
            if tools.iter().any(|o| o.name == t.name) {
                return Err(ToolError::Duplicate {
                    index,
                    name: t.name,
                });
            }
            let parameters = if t.parameters.trim().is_empty() {
                Value::Null
            } else {
                match serde_json::from_str::<Value>(&t.parameters) {
                    Ok(v @ Value::Object(_)) => v,
                    Ok(other) => {
                        return Err(ToolError::Parameters {
                            index,
                            reason: format!("got {}", kind(&other)),
                        });
                    }
                    Err(e) => {
                        return Err(ToolError::Parameters {
                            index,
                            reason: e.to_string(),
                        });
                    }
                }
            };
            tools.push(Tool {
                name: t.name,
                description: t.description,
                parameters,
            });
        }
        let choice = chat
            .tool_choice
            .take()
            .and_then(|c| c.choice)
            .unwrap_or(Choice::Mode(ToolChoiceMode::Auto as i32));
        match &choice {
            Choice::Mode(m) => {
                let mode = ToolChoiceMode::try_from(*m).map_err(|_| ToolError::ChoiceMode(*m))?;
                if mode == ToolChoiceMode::Required && tools.is_empty() {
                    return Err(ToolError::NoTools);
                }
            }
            Choice::Function(name) => {
                if !tools.iter().any(|t| &t.name == name) {
                    return Err(if tools.is_empty() {
                        ToolError::NoTools
                    } else {
                        ToolError::UnknownChoice { name: name.clone() }
                    });
                }
            }
        }
        Ok(ToolRequest {
            tools,
            choice,
            parallel: chat.parallel_tool_calls.unwrap_or(true),
        })
    }

    /// Whether the model is shown tools at all (`none` hides them).
    fn offered(&self) -> bool {
        !self.tools.is_empty() && self.choice != Choice::Mode(ToolChoiceMode::None as i32)
    }

    /// The tools as the template is given them (none when hidden).
    pub(super) fn template_tools(&self) -> Vec<Value> {
        if !self.offered() {
            return Vec::new();
        }
        self.tools.iter().map(Tool::to_template).collect()
    }

    /// Checks the request against the model (`family`: the format its
    /// template shows; `declared`: the template reads `tools`) and
    /// `structured`; returns how to parse the output and the grammar a
    /// forced call follows.
    pub(super) fn resolve(
        self,
        declared: bool,
        family: Option<&'static Family>,
        structured: Option<&Structured>,
        schemas: Option<&Arc<Grammars>>,
    ) -> Result<(Option<ValidTools>, Option<Structured>), ToolError> {
        if !self.offered() {
            return Ok((None, None));
        }
        if !declared {
            return Err(ToolError::NotDeclared);
        }
        let family = family.ok_or_else(|| ToolError::UnknownFormat {
            known: specmesh_toolcall::FAMILIES
                .iter()
                .map(|f| f.name)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        let forced = match &self.choice {
            Choice::Function(name) => Some(Forced::Named(name)),
            Choice::Mode(m) if *m == ToolChoiceMode::Required as i32 => Some(Forced::Any {
                parallel: self.parallel,
            }),
            Choice::Mode(_) => None,
        };
        let grammar = match forced {
            None => None,
            Some(_) if structured.is_some() => return Err(ToolError::WithStructured),
            // The choice was checked against the tools: a grammar exists.
            Some(f) => family.grammar(&self.tools, f),
        };
        Ok((
            Some(ValidTools {
                family,
                forced: grammar.is_some(),
                tools: self.tools.into(),
                schemas: SchemaCompiler(schemas.cloned()),
            }),
            grammar,
        ))
    }
}

/// A wire message's tool calls as the template's, their arguments parsed
/// from JSON text into the object templates expect.
pub(super) fn history_calls(index: usize, m: &v1::ChatMessage) -> Result<Vec<ToolCall>, ToolError> {
    if m.tool_calls.is_empty() {
        return Ok(Vec::new());
    }
    if m.role != "assistant" {
        return Err(ToolError::CallsOutsideAssistant {
            index,
            role: m.role.clone(),
        });
    }
    m.tool_calls
        .iter()
        .enumerate()
        .map(|(call, c)| {
            let arguments = if c.arguments.trim().is_empty() {
                Value::Object(Default::default())
            } else {
                match serde_json::from_str::<Value>(&c.arguments) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => {
                        return Err(ToolError::Arguments {
                            index,
                            call,
                            got: c.arguments.chars().take(64).collect(),
                        });
                    }
                }
            };
            Ok(ToolCall::function(c.id.clone(), c.name.clone(), arguments))
        })
        .collect()
}

/// A wire message as the template's.
pub(super) fn message(index: usize, m: v1::ChatMessage) -> Result<ChatMessage, ToolError> {
    let tool_calls = history_calls(index, &m)?;
    let mut out = ChatMessage::new(m.role, m.content);
    out.tool_calls = tool_calls;
    out.tool_call_id = Some(m.tool_call_id).filter(|s| !s.is_empty());
    out.name = Some(m.name).filter(|s| !s.is_empty());
    Ok(out)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
