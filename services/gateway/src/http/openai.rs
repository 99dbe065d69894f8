//! OpenAI's request and response shapes, and their conversion to and from
//! the gRPC API's. Pure: no I/O, unit-tested.
//!
//! A parameter we do not implement is refused by name (400) rather than
//! ignored, unless it is sent with the value that means "off" (`n: 1`,
//! `echo: false`, a zero penalty, no `functions`): a caller must not
//! believe it got what it asked for. Two extension parameters carry what the gRPC API
//! has and OpenAI's lacks: `speculation` (the `SpeculationMode`, by name)
//! and `tenant` (the scope of the drafter's cross-session index).

use serde::Deserialize;
use serde_json::{Map, Value};
use specmesh_proto::v1;

mod response;
pub mod tools;

pub use response::{Speculation, Usage, choice_logprobs, finish_reason, vllm_metrics};

/// A request the front refuses: 400 with OpenAI's error shape, naming the
/// parameter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct BadRequest {
    pub message: String,
    pub param: Option<String>,
}

impl BadRequest {
    fn new(param: &str, message: impl Into<String>) -> BadRequest {
        BadRequest {
            message: message.into(),
            param: Some(param.to_owned()),
        }
    }
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Message content: text, or parts of which only text is supported.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Map<String, Value>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant's calls.
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// A tool message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `prediction: {"type": "content", "content": ...}`.
#[derive(Debug, Clone, Deserialize)]
pub struct Prediction {
    #[serde(rename = "type")]
    pub kind: String,
    pub content: Content,
}

/// What both endpoints share.
#[derive(Debug, Clone, Deserialize)]
pub struct Common {
    pub model: String,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub user: Option<String>,
    pub prediction: Option<Prediction>,
    /// Ours: `"off"`, `"auto"` (the default), `"model-free"`,
    /// `"draft-model"` or `"combined"`.
    pub speculation: Option<Value>,
    /// Ours: the gRPC API's `tenant`.
    pub tenant: Option<Value>,
    /// vLLM's: narrows KV reuse within the tenant (the gRPC API's).
    pub cache_salt: Option<Value>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`.
    pub response_format: Option<Value>,
    /// Chat: a boolean; completions: the legacy count of alternatives.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
    /// vLLM's: no end of sequence before this many tokens.
    pub min_tokens: Option<u32>,
    /// vLLM's: generate to `max_tokens` whatever the model says.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Everything else, checked by [`unsupported`].
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    #[serde(flatten)]
    pub common: Common,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    #[serde(flatten)]
    pub common: Common,
}

/// An optional string parameter of ours (`tenant`, `cache_salt`): absent
/// or null is empty; its bounds are the gRPC API's, checked there.
fn optional_string(name: &'static str, value: Option<&Value>) -> Result<String, BadRequest> {
    match value.filter(|v| !v.is_null()) {
        None => Ok(String::new()),
        Some(Value::String(t)) => Ok(t.clone()),
        Some(other) => Err(BadRequest::new(
            name,
            format!("`{name}` must be a string, got {other}"),
        )),
    }
}

/// Parameters accepted with the value that turns them off, and ignored
/// ones that only label a request.
fn unsupported(rest: &Map<String, Value>) -> Result<(), BadRequest> {
    for (key, value) in rest {
        let off = match key.as_str() {
            "n" | "best_of" => value.is_null() || value == &Value::from(1),
            "echo" => value.is_null() || value == &Value::Bool(false),
            "presence_penalty" | "frequency_penalty" => {
                value.is_null() || value.as_f64() == Some(0.0)
            }
            "tools" | "functions" | "logit_bias" => {
                value.is_null()
                    || value.as_array().is_some_and(Vec::is_empty)
                    || value.as_object().is_some_and(Map::is_empty)
            }
            // Completions have no tools; chat's are its own fields.
            "tool_choice" | "function_call" => value.is_null() || value == "none",
            "parallel_tool_calls" => value.is_null() || value.is_boolean(),
            "suffix" => value.is_null(),
            // Labels: nothing to do.
            "metadata" | "store" | "service_tier" => true,
            _ => false,
        };
        if !off {
            return Err(BadRequest::new(
                key,
                format!("`{key}` is not supported by this server (value {value})"),
            ));
        }
    }
    Ok(())
}

fn text_of(content: &Content, param: &str) -> Result<String, BadRequest> {
    match content {
        Content::Text(t) => Ok(t.clone()),
        Content::Parts(parts) => {
            let mut out = String::new();
            for (i, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push_str(t),
                    (kind, _) => {
                        return Err(BadRequest::new(
                            &format!("{param}[{i}]"),
                            format!(
                                "only text content parts are supported, got {}",
                                kind.unwrap_or("a part without a type")
                            ),
                        ));
                    }
                }
            }
            Ok(out)
        }
    }
}

/// `speculation`, by the gRPC API's names without the prefix; `None`
/// when absent (the gRPC default, automatic).
fn speculation(value: Option<&Value>) -> Result<Option<v1::SpeculationParams>, BadRequest> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let mode = match value.as_str() {
        Some("auto") => v1::SpeculationMode::Unspecified,
        Some("off") => v1::SpeculationMode::Off,
        Some("model-free") => v1::SpeculationMode::ModelFree,
        Some("draft-model") => v1::SpeculationMode::DraftModel,
        Some("combined") => v1::SpeculationMode::Combined,
        _ => {
            return Err(BadRequest::new(
                "speculation",
                format!(
                    "`speculation` must be \"off\", \"auto\", \"model-free\", \"draft-model\" or \"combined\", got {value}"
                ),
            ));
        }
    };
    Ok(Some(v1::SpeculationParams {
        mode: mode as i32,
        max_draft_tokens: 0,
    }))
}

/// A random sampler seed for sampled requests that name none: OpenAI's
/// requests without a seed are not reproducible, ours are by default.
fn fresh_seed() -> u64 {
    rand::random()
}

/// `response_format` as the gRPC API's `structured`: `None` for text.
fn response_format(value: Option<&Value>) -> Result<Option<v1::Structured>, BadRequest> {
    use v1::structured::Kind;
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = match value.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Kind::JsonObject(true),
        Some("json_schema") => {
            let schema = value
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .ok_or_else(|| {
                    BadRequest::new(
                        "response_format.json_schema.schema",
                        "`response_format.json_schema.schema` is required with \
                         `type: \"json_schema\"`",
                    )
                })?;
            // Re-serialised in the caller's key order (`preserve_order`):
            // properties come out in that order.
            Kind::JsonSchema(schema.to_string())
        }
        _ => {
            return Err(BadRequest::new(
                "response_format.type",
                format!(
                    "`response_format.type` must be \"text\", \"json_object\" or \
                     \"json_schema\", got {}",
                    value.get("type").unwrap_or(&Value::Null)
                ),
            ));
        }
    };
    Ok(Some(v1::Structured { kind: Some(kind) }))
}

/// `logprobs` and `top_logprobs` as the gRPC API's (`logprobs`,
/// `top_logprobs`): chat's boolean and count, or completions' legacy
/// count of alternatives (0 to 5, the token's own always included).
fn logprobs(
    on: Option<&Value>,
    top: Option<&Value>,
    chat: bool,
) -> Result<(bool, u32), BadRequest> {
    let on = on.filter(|v| !v.is_null());
    let top = top.filter(|v| !v.is_null());
    if !chat {
        if let Some(t) = top {
            return Err(BadRequest::new(
                "top_logprobs",
                format!("`top_logprobs` is for chat completions; send `logprobs: N` here, got {t}"),
            ));
        }
        return match on {
            None => Ok((false, 0)),
            Some(v) => match v.as_u64() {
                Some(n) if n <= 5 => Ok((true, n as u32)),
                _ => Err(BadRequest::new(
                    "logprobs",
                    format!("`logprobs` must be an integer from 0 to 5, got {v}"),
                )),
            },
        };
    }
    let on = match on {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(BadRequest::new(
                "logprobs",
                format!("`logprobs` must be a boolean, got {v}"),
            ));
        }
    };
    let top = match top {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n <= u64::from(specmesh_proto::MAX_TOP_LOGPROBS) => n as u32,
            _ => {
                return Err(BadRequest::new(
                    "top_logprobs",
                    format!("`top_logprobs` must be an integer from 0 to 20, got {v}"),
                ));
            }
        },
    };
    if top > 0 && !on {
        return Err(BadRequest::new(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        ));
    }
    Ok((on, top))
}

impl Common {
    /// The shared fields as a `GenerateRequest` around `input`; `chat`:
    /// the request is a chat completion.
    fn to_wire(
        &self,
        input: v1::generate_request::Input,
        chat: bool,
    ) -> Result<v1::GenerateRequest, BadRequest> {
        unsupported(&self.rest)?;
        if self.stream_options.is_some() && !self.stream {
            return Err(BadRequest::new(
                "stream_options",
                "`stream_options` needs `stream: true`",
            ));
        }
        let max_new_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(0), _) | (None, Some(0)) => {
                return Err(BadRequest::new("max_tokens", "must be at least 1"));
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => 0,
        };
        // OpenAI's default temperature is 1; 0 is greedy.
        let temperature = self.temperature.unwrap_or(1.0);
        let seed = match self.seed {
            Some(s) => s,
            None if temperature > 0.0 => fresh_seed(),
            None => 0,
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let prediction = match &self.prediction {
            None => String::new(),
            Some(p) if p.kind == "content" => text_of(&p.content, "prediction.content")?,
            Some(p) => {
                return Err(BadRequest::new(
                    "prediction.type",
                    format!("must be \"content\", got {:?}", p.kind),
                ));
            }
        };
        let tenant = optional_string("tenant", self.tenant.as_ref())?;
        let cache_salt = optional_string("cache_salt", self.cache_salt.as_ref())?;
        let structured = response_format(self.response_format.as_ref())?;
        let (logprobs, top_logprobs) =
            logprobs(self.logprobs.as_ref(), self.top_logprobs.as_ref(), chat)?;
        Ok(v1::GenerateRequest {
            input: Some(input),
            max_new_tokens,
            sampling: Some(v1::SamplingParams {
                temperature,
                top_p: self.top_p.unwrap_or(1.0),
                top_k: 0,
                seed,
            }),
            stop,
            speculation: speculation(self.speculation.as_ref())?,
            tenant,
            prediction,
            cache_salt,
            structured,
            logprobs,
            top_logprobs,
            min_new_tokens: self.min_tokens.unwrap_or(0),
            ignore_eos: self.ignore_eos,
            ..Default::default()
        })
    }
}

impl ChatRequest {
    pub fn to_wire(&self) -> Result<v1::GenerateRequest, BadRequest> {
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            // OpenAI's newer name for the system role.
            let role = match m.role.as_str() {
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                other => {
                    return Err(BadRequest::new(
                        &format!("messages[{i}].role"),
                        format!(
                            "must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\", got {other:?}"
                        ),
                    ));
                }
            };
            let content = match &m.content {
                Some(c) => text_of(c, &format!("messages[{i}].content"))?,
                None => String::new(),
            };
            messages.push(v1::ChatMessage {
                role: role.to_owned(),
                content,
                tool_calls: tools::history_calls(m.tool_calls.as_ref(), i)?,
                tool_call_id: m.tool_call_id.clone().unwrap_or_default(),
                name: m.name.clone().unwrap_or_default(),
            });
        }
        let chat = v1::Chat {
            messages,
            tools: tools::tools(self.tools.as_ref())?,
            tool_choice: tools::tool_choice(self.tool_choice.as_ref())?,
            parallel_tool_calls: tools::parallel(self.parallel_tool_calls.as_ref())?,
        };
        self.common
            .to_wire(v1::generate_request::Input::Chat(chat), true)
    }
}

impl CompletionRequest {
    pub fn to_wire(&self) -> Result<v1::GenerateRequest, BadRequest> {
        let prompt = match &self.prompt {
            Value::String(s) => s.clone(),
            Value::Array(a) if a.len() == 1 && a[0].is_string() => {
                a[0].as_str().unwrap_or_default().to_owned()
            }
            _ => {
                return Err(BadRequest::new(
                    "prompt",
                    "must be one string (several prompts or token arrays are not supported)",
                ));
            }
        };
        self.common
            .to_wire(v1::generate_request::Input::Prompt(prompt), false)
    }
}

/// OpenAI's name for a gRPC API field that validation refused (the
/// error's `param`); `chat`: the request was a chat completion. `None` for
/// a field OpenAI's API does not have.
pub fn param(field: &str, chat: bool) -> Option<String> {
    let name = match field {
        "prompt" | "chat" | "chat.messages" if chat => "messages",
        "prompt" => "prompt",
        "max_new_tokens" => "max_tokens",
        "prediction" | "stop" | "tenant" | "top_logprobs" => field,
        "structured" => "response_format",
        "chat.tools" => "tools",
        "chat.tool_choice" => "tool_choice",
        "min_new_tokens" => "min_tokens",
        "speculation.mode" | "speculation.max_draft_tokens" => "speculation",
        f => match f.strip_prefix("sampling.")? {
            p @ ("temperature" | "top_p" | "seed") => p,
            _ => return None,
        },
    };
    Some(name.to_owned())
}

#[cfg(test)]
mod tests;
