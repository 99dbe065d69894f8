//! The transports the serving benchmarks send chat requests over, timed the
//! same way: the gateway's gRPC stream (`GenerateStream`), an
//! OpenAI-compatible HTTP front (`POST /v1/chat/completions` with `stream:
//! true` and `stream_options.include_usage`, read as server-sent events):
//! the gateway's, or llama.cpp's own `llama-server`'s. Over gRPC a chunk
//! carries token ids, compared as such; over HTTP a chunk carries text, and
//! the usage chunk the token counts.

mod http;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use specmesh_harness::grpc::{self, Connection};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

pub use http::Dialect;
use http::Http;

/// `--transport`: how `--up` is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// The gRPC API.
    Grpc,
    /// The OpenAI-compatible HTTP front.
    Http,
}

/// Speculation for a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Off,
    Auto,
    /// The drafters' draft model alone (`--draft-model`).
    DraftModel,
}

impl Mode {
    /// As the OpenAI front's `speculation` field takes it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Auto => "auto",
            Mode::DraftModel => "draft-model",
        }
    }
}

/// As its name.
impl serde::Serialize for Mode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

impl Message {
    pub fn new(role: &'static str, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// One greedy chat request.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The whole chat so far, ending with the user's turn.
    pub messages: &'a [Message],
    pub mode: Mode,
    pub max_new: u32,
    /// The request's tenant; empty: the caller's own (its key's).
    pub tenant: &'a str,
    /// The gRPC API's `session_id` (and, on the session's last turn,
    /// `end_session`); ignored over HTTP, which has none.
    pub session: Option<(&'a str, bool)>,
}

/// What a request generated, as the transport gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Tokens(Vec<u32>),
    Text(String),
}

/// One completed request, timed from the moment it was sent.
#[derive(Debug, Clone)]
pub struct Completion {
    /// Seconds to the first chunk of output.
    pub ttft: f64,
    /// Seconds to the end of the stream.
    pub e2el: f64,
    /// Seconds between consecutive chunks of output.
    pub itl: Vec<f64>,
    pub output_tokens: usize,
    /// What identity is checked on: token ids over gRPC, text over HTTP.
    pub output: Output,
    /// The generated text (what a conversation sends back as the
    /// assistant's turn).
    pub text: String,
    /// The prompt's tokens, as the server counted them.
    pub prompt_tokens: Option<usize>,
    /// Of those, the ones the server said it took from a cache.
    pub cached_tokens: Option<usize>,
    /// What speculation did, as the gateway reported it (gRPC only).
    pub speculation: Option<Speculated>,
}

/// One request's speculation, as the gateway's `SpeculationStats` reports
/// it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Speculated {
    /// Verify forwards the request's tokens took.
    pub steps: u32,
    /// Seconds its steps waited for the drafter's trees.
    pub tree_wait: f64,
}

impl Completion {
    /// From when the request was sent, when each chunk of output arrived,
    /// and when the stream ended.
    fn timed(
        sent: Instant,
        chunks: &[Instant],
        ended: Instant,
        tokens: usize,
        output: Output,
        text: String,
    ) -> Completion {
        let first = chunks.first().copied().unwrap_or(ended);
        Completion {
            ttft: (first - sent).as_secs_f64(),
            e2el: (ended - sent).as_secs_f64(),
            itl: chunks
                .windows(2)
                .map(|w| (w[1] - w[0]).as_secs_f64())
                .collect(),
            output_tokens: tokens,
            output,
            text,
            prompt_tokens: None,
            cached_tokens: None,
            speculation: None,
        }
    }
}

/// A client of one transport; cheap to clone, one per request task.
#[derive(Clone)]
pub enum Client {
    Grpc {
        client: GenerationClient<Channel>,
        connection: Arc<Connection>,
    },
    Http(Arc<Http>),
}

impl Client {
    /// A client of specmesh's gateway.
    pub async fn connect(transport: Transport, connection: Connection) -> Result<Client> {
        Ok(match transport {
            Transport::Grpc => Client::Grpc {
                client: connection.client().await?,
                connection: Arc::new(connection),
            },
            Transport::Http => Client::Http(Arc::new(
                Http::connect(&connection, Dialect::Specmesh).await?,
            )),
        })
    }

    /// A client of llama.cpp's `llama-server` at `url` (its OpenAI front).
    pub async fn llama_server(url: &str) -> Result<Client> {
        let connection = Connection::plain(url.to_owned());
        Ok(Client::Http(Arc::new(
            Http::connect(&connection, Dialect::LlamaServer).await?,
        )))
    }

    /// One greedy chat generation of one user message; `tenant` empty: the
    /// caller's.
    pub async fn send(
        &self,
        prompt: &str,
        mode: Mode,
        max_new: u32,
        tenant: &str,
    ) -> Result<Completion> {
        let messages = [Message::new("user", prompt)];
        self.chat(&Ask {
            messages: &messages,
            mode,
            max_new,
            tenant,
            session: None,
        })
        .await
    }

    /// One greedy chat completion of `body`, not streamed, over the OpenAI
    /// front: the response and its seconds.
    pub async fn complete(
        &self,
        body: serde_json::Value,
        mode: Mode,
    ) -> Result<(serde_json::Value, f64)> {
        match self {
            Client::Http(http) => http.complete(body, mode).await,
            Client::Grpc { .. } => {
                anyhow::bail!("this workload runs over the OpenAI front (--http URL or --up)")
            }
        }
    }

    /// One greedy chat generation.
    pub async fn chat(&self, ask: &Ask<'_>) -> Result<Completion> {
        match self {
            Client::Grpc { client, connection } => {
                let s =
                    grpc::stream(&mut client.clone(), connection.request(request(ask))?).await?;
                let chunks: Vec<Instant> = s.chunks.iter().map(|c| c.0).collect();
                let n = s.tokens.len();
                let mut c = Completion::timed(
                    s.sent,
                    &chunks,
                    s.ended,
                    n,
                    Output::Tokens(s.tokens),
                    s.text,
                );
                if let Some(u) = s.usage {
                    c.prompt_tokens = Some(u.prompt_tokens as usize);
                    c.cached_tokens = Some(u.cached_tokens as usize);
                }
                c.speculation = (s.speculation.verify_steps > 0).then_some(Speculated {
                    steps: s.speculation.verify_steps,
                    tree_wait: s.speculation.tree_wait_seconds,
                });
                Ok(c)
            }
            Client::Http(http) => http.chat(ask).await,
        }
    }
}

/// The gRPC request of `ask`.
fn request(ask: &Ask<'_>) -> v1::GenerateRequest {
    let mode = match ask.mode {
        Mode::Off => v1::SpeculationMode::Off,
        Mode::Auto => v1::SpeculationMode::Unspecified,
        Mode::DraftModel => v1::SpeculationMode::DraftModel,
    };
    let messages = ask.messages.iter().map(|m| (m.role, m.content.as_str()));
    let mut request = grpc::chat_request(messages, ask.max_new, mode, ask.tenant);
    if let Some((session_id, end_session)) = ask.session {
        request.session_id = session_id.into();
        request.end_session = end_session;
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_is_timed_from_sending() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let c = Completion::timed(
            t0,
            &[at(100), at(130), at(190)],
            at(200),
            5,
            Output::Tokens(vec![]),
            String::new(),
        );
        assert!((c.ttft - 0.1).abs() < 1e-9);
        assert!((c.e2el - 0.2).abs() < 1e-9);
        assert_eq!(c.itl.len(), 2);
        assert!((c.itl[1] - 0.06).abs() < 1e-9);
    }

    #[test]
    fn a_grpc_request_carries_the_whole_chat_and_the_session() {
        let messages = [
            Message::new("system", "tools"),
            Message::new("user", "a"),
            Message::new("assistant", "b"),
            Message::new("user", "c"),
        ];
        let ask = Ask {
            messages: &messages,
            mode: Mode::Off,
            max_new: 7,
            tenant: "t",
            session: Some(("s1", true)),
        };
        let r = request(&ask);
        let Some(v1::generate_request::Input::Chat(chat)) = r.input else {
            panic!("a chat request");
        };
        let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!((r.session_id.as_str(), r.end_session), ("s1", true));
        assert_eq!(r.speculation.unwrap().mode, v1::SpeculationMode::Off as i32);
        let none = request(&Ask {
            session: None,
            ..ask
        });
        assert!(none.session_id.is_empty() && !none.end_session);
    }
}
