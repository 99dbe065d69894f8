//! `GenerateRequest` → [`ValidGenerateRequest`]: every check a request must
//! pass before it may cost a verifier anything.
//!
//! Everything past this module takes only the `Valid*` types, so bounds are
//! checked once, here. Each failure names the field (as a client writes it,
//! `sampling.top_p`) and the bound it broke, since the message goes back to
//! the caller verbatim as INVALID_ARGUMENT. Cheap checks run first; the
//! tokenizer (chat template + BPE, milliseconds for long prompts) runs on the
//! blocking pool, and the context checks need its result.

use std::sync::Arc;

use specmesh_grammar::{GrammarError, GrammarLimits, Grammars, Structured};
use specmesh_proto::v1::{self, SpeculationMode, generate_request::Input};
use specmesh_sampling::SamplingParams;
use specmesh_tokenizer::{ChatMessage, Tokenizer, TokenizerError};

use crate::auth::{AuthError, Caller};

mod tools;

#[cfg(test)]
pub(crate) use tools::SchemaCompiler;
use tools::ToolRequest;
pub use tools::{ToolError, ValidTools};

/// Most stop strings a request may carry.
pub const MAX_STOP_STRINGS: usize = 8;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// Longest `session_id` / `tenant`, in bytes: the protocol's bound on
/// every hop.
pub use specmesh_proto::limits::MAX_ID_BYTES;
/// Chat roles the templates of the supported models understand.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// Bounds a request is validated against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Prompt plus `max_new_tokens` must fit in this.
    pub max_context: u32,
    /// Largest `max_new_tokens`.
    pub max_new_tokens: u32,
    /// `max_new_tokens` when a request sends 0.
    pub default_max_new_tokens: u32,
    /// Largest `speculation.max_draft_tokens`, and its value when 0.
    pub max_draft_tokens: u32,
}

/// A request every later stage may trust.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidGenerateRequest {
    /// The prompt after templating and tokenization, never empty.
    pub prompt_tokens: Vec<u32>,
    /// At least 1; `prompt_len() + max_new_tokens <= max_context`.
    pub max_new_tokens: u32,
    pub sampling: SamplingParams,
    /// Non-empty strings, at most [`MAX_STOP_STRINGS`].
    pub stop: Vec<String>,
    pub speculation: ValidSpeculation,
    /// The client's multi-turn session, if it named one.
    pub session_id: Option<String>,
    /// This is the session's last turn: its KV cache is freed at the end
    /// (only with a `session_id`).
    pub end_session: bool,
    /// Scope of the drafter's cross-session index ("" = anonymous).
    pub tenant: String,
    /// The caller's predicted output, tokenized (no special tokens parsed,
    /// no BOS); at most the model's context; empty: none.
    pub prediction: Vec<u32>,
    /// Narrows KV reuse within the tenant ("" = the tenant's shared
    /// cache).
    pub cache_salt: String,
    /// The constraint the output follows; it compiled here (the verifier
    /// compiles it again, from its cache when it has seen it).
    pub structured: Option<Structured>,
    /// Alternatives per token's log-probability; `None`: none asked.
    pub logprobs: Option<usize>,
    /// No end of sequence before this many tokens; at most
    /// `max_new_tokens`.
    pub min_new_tokens: u32,
    /// The end-of-sequence token does not end the output.
    pub ignore_eos: bool,
    /// With tools offered: how the output is parsed into calls.
    pub tools: Option<ValidTools>,
}

impl ValidGenerateRequest {
    /// Tokens in the prompt (fits u32: it is below the context length).
    pub fn prompt_len(&self) -> u32 {
        u32::try_from(self.prompt_tokens.len()).unwrap_or(u32::MAX)
    }
}

/// Validated speculation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidSpeculation {
    pub mode: SpeculationMode,
    /// Between 1 and the server's limit.
    pub max_draft_tokens: u32,
}

impl ValidSpeculation {
    /// Whether the request speculates at all.
    pub fn speculates(&self) -> bool {
        self.mode != SpeculationMode::Off
    }

    /// What the drafter drafts with.
    pub fn sources(&self) -> v1::DraftSources {
        match self.mode {
            SpeculationMode::Unspecified | SpeculationMode::Off => v1::DraftSources::Auto,
            SpeculationMode::ModelFree => v1::DraftSources::ModelFree,
            SpeculationMode::DraftModel => v1::DraftSources::DraftModel,
            SpeculationMode::Combined => v1::DraftSources::Combined,
        }
    }
}

/// Why a request was refused. Every variant but `Tokenizer` and
/// `WorkerFailed` is the caller's to fix.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("exactly one of `prompt` or `chat` must be set, got neither")]
    MissingInput,
    #[error("`prompt` must not be empty")]
    EmptyPrompt,
    #[error("`chat.messages` must hold at least one message")]
    EmptyChat,
    #[error(
        "`chat.messages[{index}].role` must be \"system\", \"user\", \"assistant\" or \"tool\", got {role:?}"
    )]
    UnknownRole { index: usize, role: String },
    #[error("`chat` needs a chat template and the model has none: send `prompt` instead")]
    NoChatTemplate,
    #[error("`chat` could not be rendered with the model's chat template: {0}")]
    ChatTemplate(String),
    #[error("the input encodes to no tokens")]
    NoTokens,
    #[error(
        "the prompt is {prompt_tokens} tokens, which leaves no room to generate within the model's context of {max_context} tokens"
    )]
    PromptTooLong {
        prompt_tokens: usize,
        max_context: u32,
    },
    #[error(
        "the prompt ({prompt_tokens} tokens) + `max_new_tokens` ({max_new_tokens}) must be at most the model's context of {max_context} tokens"
    )]
    ContextExceeded {
        prompt_tokens: usize,
        max_new_tokens: u32,
        max_context: u32,
    },
    #[error("`max_new_tokens` must be at most {max}, got {got}")]
    MaxNewTokens { max: u32, got: u32 },
    #[error("`min_new_tokens` must be at most `max_new_tokens` ({max}), got {min}")]
    MinNewTokens { min: u32, max: u32 },
    #[error(
        "`prediction` is {tokens} tokens, over the model's context of {max_context} tokens: predict only the output"
    )]
    PredictionTooLong { tokens: usize, max_context: u32 },
    #[error("`end_session` needs the `session_id` of the session to end")]
    EndWithoutSession,
    /// A field the wire conversion refused (`sampling.*`).
    #[error(transparent)]
    Field(#[from] specmesh_proto::FieldError),
    /// `structured` could not be compiled, or is too large.
    #[error("`structured`: {0}")]
    Structured(#[source] GrammarError),
    /// `chat.tools`, `chat.tool_choice` or a history's tool calls.
    #[error("{0}")]
    Tools(#[from] ToolError),
    #[error(
        "`speculation.mode` must be 0 (unspecified), 1 (off), 2 (model-free), 3 (draft model) or 4 (combined), got {0}"
    )]
    SpeculationMode(i32),
    #[error("`speculation.max_draft_tokens` must be at most {max}, got {got}")]
    MaxDraftTokens { max: u32, got: u32 },
    #[error("`stop` must hold at most {max} strings, got {got}")]
    TooManyStops { max: usize, got: usize },
    #[error("`stop[{index}]` must not be empty")]
    EmptyStop { index: usize },
    #[error("`stop[{index}]` must be at most {max} bytes, got {got}")]
    StopTooLong {
        index: usize,
        max: usize,
        got: usize,
    },
    #[error("`{field}` must be at most {max} bytes, got {got}")]
    IdTooLong {
        field: &'static str,
        max: usize,
        got: usize,
    },
    #[error(
        "`{field}` may only hold A-Z, a-z, 0-9, '.', '_', ':' and '-', got {found:?} at byte {at}"
    )]
    IdCharacter {
        field: &'static str,
        found: char,
        at: usize,
    },
    /// The caller's key acts for another tenant than the request names.
    #[error(transparent)]
    Tenant(#[from] AuthError),
    /// The tokenizer failed on text it should handle: a server-side fault.
    #[error("tokenizing the input failed: {0}")]
    Tokenizer(#[source] TokenizerError),
    /// The blocking tokenizer task panicked or was cancelled.
    #[error("the tokenizer worker failed: {0}")]
    WorkerFailed(String),
}

impl ValidationError {
    /// Whether the fault is the server's (INTERNAL), not the caller's.
    pub fn is_internal(&self) -> bool {
        matches!(self, Self::Tokenizer(_) | Self::WorkerFailed(_))
    }

    /// The request field at fault, as the gRPC API names it (`prompt`,
    /// `sampling.top_p`); `None` for faults of no one field. The HTTP
    /// front maps it to OpenAI's parameter name.
    pub fn field(&self) -> Option<&str> {
        Some(match self {
            Self::MissingInput
            | Self::EmptyPrompt
            | Self::NoTokens
            | Self::PromptTooLong { .. } => "prompt",
            Self::EmptyChat | Self::UnknownRole { .. } => "chat.messages",
            Self::NoChatTemplate | Self::ChatTemplate(_) => "chat",
            Self::ContextExceeded { .. } | Self::MaxNewTokens { .. } => "max_new_tokens",
            Self::MinNewTokens { .. } => "min_new_tokens",
            Self::PredictionTooLong { .. } => "prediction",
            Self::EndWithoutSession => "session_id",
            Self::Field(f) => f.field.as_str(),
            Self::Structured(_) => "structured",
            Self::Tools(t) => t.field(),
            Self::SpeculationMode(_) => "speculation.mode",
            Self::MaxDraftTokens { .. } => "speculation.max_draft_tokens",
            Self::TooManyStops { .. } | Self::EmptyStop { .. } | Self::StopTooLong { .. } => "stop",
            Self::IdTooLong { field, .. } | Self::IdCharacter { field, .. } => field,
            Self::Tenant(_) => "tenant",
            Self::Tokenizer(_) | Self::WorkerFailed(_) => return None,
        })
    }
}

/// Validates requests against the model's tokenizer and the server limits.
#[derive(Debug, Clone)]
pub struct Validator {
    tokenizer: Tokenizer,
    limits: Limits,
    /// Compiles `structured` constraints; `None` when the vocabulary
    /// cannot serve them (it names no end-of-sequence token).
    grammars: Option<Arc<Grammars>>,
    /// The chat template reads `tools`.
    declares_tools: bool,
    /// The tool-call format the chat template shows.
    tool_family: Option<&'static specmesh_toolcall::Family>,
}

/// The input before tokenization.
enum Text {
    Prompt(String),
    /// Messages, and the tools the template is given (OpenAI's shape).
    Chat(Vec<ChatMessage>, Vec<serde_json::Value>),
}

impl Validator {
    pub fn new(tokenizer: Tokenizer, limits: Limits) -> Self {
        let grammars =
            match Grammars::new(&tokenizer, tokenizer.vocab_size(), GrammarLimits::default()) {
                Ok(g) => Some(Arc::new(g)),
                Err(e) => {
                    tracing::warn!(error = %e, "structured outputs are refused");
                    None
                }
            };
        Validator {
            declares_tools: tokenizer.template_declares_tools(),
            tool_family: tokenizer
                .chat_template()
                .and_then(specmesh_toolcall::family_of),
            tokenizer,
            limits,
            grammars,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Validates `request`, tokenizing its input on the blocking pool.
    /// The tenant is `caller`'s (see [`Caller::tenant`]), never another
    /// the request names.
    pub async fn validate(
        &self,
        request: v1::GenerateRequest,
        caller: &Caller,
    ) -> Result<ValidGenerateRequest, ValidationError> {
        let (text, tool_request) = input(request.input)?;
        let sampling = self.sampling(request.sampling.unwrap_or_default())?;
        let speculation = self.speculation(request.speculation.unwrap_or_default())?;
        let stop = stop_strings(request.stop)?;
        let session_id = identifier("session_id", request.session_id)?;
        if request.end_session && session_id.is_none() {
            return Err(ValidationError::EndWithoutSession);
        }
        let tenant = caller.tenant(&identifier("tenant", request.tenant)?.unwrap_or_default())?;
        let cache_salt = identifier("cache_salt", request.cache_salt)?.unwrap_or_default();
        let requested = self.requested_new_tokens(request.max_new_tokens)?;
        let logprobs = specmesh_proto::logprobs_from_wire(request.logprobs, request.top_logprobs)?;
        let structured = specmesh_proto::structured_from_wire(request.structured);
        let (tools, forced) = match tool_request {
            Some(t) => t.resolve(
                self.declares_tools,
                self.tool_family,
                structured.as_ref(),
                self.grammars.as_ref(),
            )?,
            None => (None, None),
        };
        let structured = structured.or(forced);
        let grammars = match (&structured, &self.grammars) {
            (None, _) => None,
            (Some(_), Some(g)) => Some(Arc::clone(g)),
            (Some(_), None) => {
                return Err(ValidationError::Structured(GrammarError::Tokenizer(
                    "its vocabulary names no end-of-sequence token".into(),
                )));
            }
        };

        let tokenizer = self.tokenizer.clone();
        let prediction = request.prediction;
        let spec = structured.clone();
        let (prompt_tokens, prediction) = tokio::task::spawn_blocking(move || {
            // Compiled first: a schema that cannot be is refused before
            // the prompt is tokenized (and it is cached for the verifier's
            // sake only by its own compile).
            if let (Some(spec), Some(g)) = (&spec, &grammars) {
                g.compile(spec).map_err(ValidationError::Structured)?;
            }
            let prompt = tokenize(&tokenizer, text)?;
            // As output text, not as a prompt: special-token look-alikes stay
            // text, no BOS.
            let prediction = tokenizer
                .encode(&prediction, false)
                .map_err(ValidationError::Tokenizer)?;
            Ok::<_, ValidationError>((prompt, prediction))
        })
        .await
        .map_err(|e| ValidationError::WorkerFailed(e.to_string()))??;
        let max_context = self.limits.max_context;
        if prediction.len() > usize::try_from(max_context).unwrap_or(usize::MAX) {
            return Err(ValidationError::PredictionTooLong {
                tokens: prediction.len(),
                max_context,
            });
        }
        let max_new_tokens = self.fit_context(prompt_tokens.len(), requested)?;
        if request.min_new_tokens > max_new_tokens {
            return Err(ValidationError::MinNewTokens {
                min: request.min_new_tokens,
                max: max_new_tokens,
            });
        }
        Ok(ValidGenerateRequest {
            prompt_tokens,
            max_new_tokens,
            sampling,
            stop,
            speculation,
            session_id,
            end_session: request.end_session,
            tenant,
            prediction,
            cache_salt,
            structured,
            logprobs,
            min_new_tokens: request.min_new_tokens,
            ignore_eos: request.ignore_eos,
            tools,
        })
    }

    fn sampling(&self, wire: v1::SamplingParams) -> Result<SamplingParams, ValidationError> {
        let params = SamplingParams::try_from(wire)?;
        specmesh_proto::check_top_k(&params, self.tokenizer.vocab_size())?;
        Ok(params)
    }

    fn speculation(
        &self,
        wire: v1::SpeculationParams,
    ) -> Result<ValidSpeculation, ValidationError> {
        // prost keeps unknown enum values as the raw i32.
        let mode = SpeculationMode::try_from(wire.mode)
            .map_err(|_| ValidationError::SpeculationMode(wire.mode))?;
        let max = self.limits.max_draft_tokens;
        let max_draft_tokens = match wire.max_draft_tokens {
            0 => max,
            n if n > max => return Err(ValidationError::MaxDraftTokens { max, got: n }),
            n => n,
        };
        Ok(ValidSpeculation {
            mode,
            max_draft_tokens,
        })
    }

    /// `max_new_tokens` as asked, or `None` for "the default".
    fn requested_new_tokens(&self, asked: u32) -> Result<Option<u32>, ValidationError> {
        let max = self.limits.max_new_tokens;
        match asked {
            0 => Ok(None),
            n if n > max => Err(ValidationError::MaxNewTokens { max, got: n }),
            n => Ok(Some(n)),
        }
    }

    /// Checks the prompt against the context. An explicit `max_new_tokens`
    /// must fit as asked; the default shrinks to the room left, so a long
    /// prompt without a budget still gets an answer.
    fn fit_context(
        &self,
        prompt_tokens: usize,
        requested: Option<u32>,
    ) -> Result<u32, ValidationError> {
        let max_context = self.limits.max_context;
        let room = usize::try_from(max_context)
            .unwrap_or(usize::MAX)
            .saturating_sub(prompt_tokens);
        if room == 0 {
            return Err(ValidationError::PromptTooLong {
                prompt_tokens,
                max_context,
            });
        }
        let room = u32::try_from(room).unwrap_or(u32::MAX);
        match requested {
            Some(n) if n > room => Err(ValidationError::ContextExceeded {
                prompt_tokens,
                max_new_tokens: n,
                max_context,
            }),
            Some(n) => Ok(n),
            None => Ok(self
                .limits
                .default_max_new_tokens
                .min(self.limits.max_new_tokens)
                .min(room)),
        }
    }
}

/// The input, and a chat's tools.
fn input(input: Option<Input>) -> Result<(Text, Option<ToolRequest>), ValidationError> {
    // A oneof cannot hold both: protobuf keeps the last one on the wire.
    match input {
        None => Err(ValidationError::MissingInput),
        Some(Input::Prompt(p)) if p.is_empty() => Err(ValidationError::EmptyPrompt),
        Some(Input::Prompt(p)) => Ok((Text::Prompt(p), None)),
        Some(Input::Chat(chat)) if chat.messages.is_empty() => Err(ValidationError::EmptyChat),
        Some(Input::Chat(mut chat)) => {
            let tools = ToolRequest::from_wire(&mut chat)?;
            let mut messages = Vec::with_capacity(chat.messages.len());
            for (index, m) in chat.messages.into_iter().enumerate() {
                if !ROLES.contains(&m.role.as_str()) {
                    return Err(ValidationError::UnknownRole {
                        index,
                        role: m.role,
                    });
                }
                messages.push(tools::message(index, m)?);
            }
            Ok((Text::Chat(messages, tools.template_tools()), Some(tools)))
        }
    }
}

fn stop_strings(stop: Vec<String>) -> Result<Vec<String>, ValidationError> {
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ValidationError::TooManyStops {
            max: MAX_STOP_STRINGS,
            got: stop.len(),
        });
    }
    for (index, s) in stop.iter().enumerate() {
        if s.is_empty() {
            return Err(ValidationError::EmptyStop { index });
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(ValidationError::StopTooLong {
                index,
                max: MAX_STOP_BYTES,
                got: s.len(),
            });
        }
    }
    Ok(stop)
}

/// Checks a `session_id` / `tenant`: they travel in logs, traces and cache
/// keys, so they are short and plain. Empty means unset.
fn identifier(field: &'static str, value: String) -> Result<Option<String>, ValidationError> {
    if value.len() > MAX_ID_BYTES {
        return Err(ValidationError::IdTooLong {
            field,
            max: MAX_ID_BYTES,
            got: value.len(),
        });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if let Some((at, found)) = value.char_indices().find(|&(_, c)| !allowed(c)) {
        return Err(ValidationError::IdCharacter { field, found, at });
    }
    Ok((!value.is_empty()).then_some(value))
}

/// Renders and tokenizes the input as `specmesh generate` does: the chat
/// template with the assistant turn opened, then the model's BOS rule.
fn tokenize(tokenizer: &Tokenizer, text: Text) -> Result<Vec<u32>, ValidationError> {
    let rendered = match text {
        Text::Prompt(p) => p,
        Text::Chat(messages, tools) => {
            if !tokenizer.has_chat_template() {
                return Err(ValidationError::NoChatTemplate);
            }
            tokenizer
                .apply_chat_template_with_tools(&messages, &tools, true)
                .map_err(|e| match e {
                    TokenizerError::Template(m) => ValidationError::ChatTemplate(m),
                    other => ValidationError::Tokenizer(other),
                })?
        }
    };
    let ids = tokenizer
        .encode_for_model(&rendered)
        .map_err(ValidationError::Tokenizer)?;
    if ids.is_empty() {
        return Err(ValidationError::NoTokens);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fuzz;
