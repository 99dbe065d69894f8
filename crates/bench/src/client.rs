//! The two transports a pass sends its requests over, timed the same way:
//! the gateway's gRPC stream (`GenerateStream`), or its OpenAI-compatible
//! HTTP front (`POST /v1/chat/completions` with `stream: true` and
//! `stream_options.include_usage`, read as server-sent events). Over gRPC a
//! chunk carries token ids, compared as such; over HTTP a chunk carries
//! text, and the usage chunk the token count.

mod http;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use crate::grpc::{self, Connection};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    Auto,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Auto => "auto",
        }
    }
}

/// As its name.
impl serde::Serialize for Mode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
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
    pub output: Output,
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
    pub async fn connect(transport: Transport, connection: Connection) -> Result<Client> {
        Ok(match transport {
            Transport::Grpc => Client::Grpc {
                client: connection.client().await?,
                connection: Arc::new(connection),
            },
            Transport::Http => Client::Http(Arc::new(Http::connect(&connection).await?)),
        })
    }

    /// One greedy chat generation of `prompt`; `tenant` empty: the caller's.
    pub async fn send(
        &self,
        prompt: &str,
        mode: Mode,
        max_new: u32,
        tenant: &str,
    ) -> Result<Completion> {
        match self {
            Client::Grpc { client, connection } => {
                let wire = match mode {
                    Mode::Off => v1::SpeculationMode::Off,
                    Mode::Auto => v1::SpeculationMode::Unspecified,
                };
                let request = grpc::chat_request(prompt, max_new, wire, tenant);
                let s = grpc::stream(&mut client.clone(), connection.request(request)?).await?;
                let chunks: Vec<Instant> = s.chunks.iter().map(|c| c.0).collect();
                let n = s.tokens.len();
                Ok(Completion::timed(
                    s.sent,
                    &chunks,
                    s.ended,
                    n,
                    Output::Tokens(s.tokens),
                ))
            }
            Client::Http(http) => http.chat(prompt, mode, max_new, tenant).await,
        }
    }
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
        );
        assert!((c.ttft - 0.1).abs() < 1e-9);
        assert!((c.e2el - 0.2).abs() < 1e-9);
        assert_eq!(c.itl.len(), 2);
        assert!((c.itl[1] - 0.06).abs() < 1e-9);
    }
}
