//! The gateway's gRPC API as a client uses it: dialing (plaintext or TLS
//! trusting a CA file, with an API key on every request), the chat request
//! the benchmarks send, and one streamed generation timed chunk by chunk.
//! `specmesh generate --gateway`, `specmesh bench` and `specmesh
//! bench-serve` share it.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

/// Where the gateway is and how to reach it.
#[derive(Debug, Clone)]
pub struct Connection {
    pub url: String,
    pub api_key: Option<String>,
    /// TLS, trusting this CA.
    pub tls_ca: Option<PathBuf>,
    /// The name the gateway's certificate carries (default: the URL's host).
    pub tls_name: Option<String>,
}

impl Connection {
    /// `url` over plaintext, without an API key.
    pub fn plain(url: String) -> Connection {
        Connection {
            url,
            api_key: None,
            tls_ca: None,
            tls_name: None,
        }
    }

    /// A channel to the gateway; over TLS when there is a CA to trust.
    pub async fn channel(&self) -> Result<Channel> {
        let url = &self.url;
        let Some(ca) = &self.tls_ca else {
            return Channel::from_shared(url.clone())
                .with_context(|| format!("`{url}` is not a URL"))?
                .connect()
                .await
                .with_context(|| format!("connecting to the gateway at {url}"));
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(self.ca_pem()?));
        if let Some(name) = &self.tls_name {
            tls = tls.domain_name(name.clone());
        }
        Channel::from_shared(url.replacen("http://", "https://", 1))
            .with_context(|| format!("`{url}` is not a URL"))?
            .tls_config(tls)
            .context("the TLS configuration")?
            .connect()
            .await
            .with_context(|| {
                format!(
                    "connecting to the gateway at {url} over TLS (CA {})",
                    ca.display()
                )
            })
    }

    /// The gRPC client on [`Connection::channel`], taking responses of any
    /// size the gateway sends.
    pub async fn client(&self) -> Result<GenerationClient<Channel>> {
        Ok(GenerationClient::new(self.channel().await?).max_decoding_message_size(64 << 20))
    }

    /// The contents (PEM) of the CA file `tls_ca`.
    pub fn ca_pem(&self) -> Result<Vec<u8>> {
        let ca = self.tls_ca.as_ref().context("no `--tls-ca` given")?;
        std::fs::read(ca).with_context(|| format!("reading `{}`", ca.display()))
    }

    /// The `authorization` value for the API key, if any.
    pub fn bearer(&self) -> Option<String> {
        self.api_key.as_ref().map(|key| format!("Bearer {key}"))
    }

    /// `message` as a request carrying the API key, if any.
    pub fn request<T>(&self, message: T) -> Result<tonic::Request<T>> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = self.bearer() {
            let value = value
                .parse()
                .context("the API key holds characters metadata cannot carry")?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// A greedy chat generation of `messages` (`(role, content)` in order):
/// the request every benchmark sends. `tenant` scopes the drafter's
/// cross-session index, so passes that must not draft from each other's
/// answers use different ones (empty: the caller's own, e.g. its API
/// key's).
pub fn chat_request<'a>(
    messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    max_new_tokens: u32,
    mode: v1::SpeculationMode,
    tenant: &str,
) -> v1::GenerateRequest {
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages: messages
                .into_iter()
                .map(|(role, content)| v1::ChatMessage {
                    role: role.into(),
                    content: content.into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
        max_new_tokens,
        speculation: Some(v1::SpeculationParams {
            mode: mode as i32,
            max_draft_tokens: 0,
        }),
        tenant: tenant.into(),
        ..Default::default()
    }
}

/// One streamed generation as the client saw it.
#[derive(Debug, Clone)]
pub struct Streamed {
    /// When the request was sent.
    pub sent: Instant,
    /// When each chunk carrying tokens arrived, and how many it carried.
    pub chunks: Vec<(Instant, usize)>,
    /// When the stream ended.
    pub ended: Instant,
    pub tokens: Vec<u32>,
    /// The text of every chunk.
    pub text: String,
    /// The last chunk's usage (`None` when the stream sent none).
    pub usage: Option<v1::Usage>,
    /// The last chunk's statistics (zero when the stream sent none).
    pub speculation: v1::SpeculationStats,
}

/// Streams `request`, timing every chunk that carries tokens.
pub async fn stream(
    client: &mut GenerationClient<Channel>,
    request: tonic::Request<v1::GenerateRequest>,
) -> Result<Streamed> {
    let sent = Instant::now();
    let mut stream = client
        .generate_stream(request)
        .await
        .map_err(status)?
        .into_inner();
    let (mut chunks, mut tokens, mut text) = (Vec::new(), Vec::new(), String::new());
    let (mut usage, mut speculation) = (None, v1::SpeculationStats::default());
    while let Some(chunk) = stream.message().await.map_err(status)? {
        if !chunk.token_ids.is_empty() {
            chunks.push((Instant::now(), chunk.token_ids.len()));
            tokens.extend_from_slice(&chunk.token_ids);
        }
        text.push_str(&chunk.text);
        if chunk.usage.is_some() {
            usage = chunk.usage;
        }
        if let Some(s) = chunk.speculation {
            speculation = s;
        }
    }
    Ok(Streamed {
        sent,
        chunks,
        ended: Instant::now(),
        tokens,
        text,
        usage,
        speculation,
    })
}

/// A gRPC error as the gateway's answer.
pub fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("the gateway answered {:?}: {}", s.code(), s.message())
}
