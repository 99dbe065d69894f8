//! The HTTP transport: streamed chat completions from an OpenAI-compatible
//! front (the gateway's, or llama-server's: [`Dialect`]), read as
//! server-sent events. It is hyper's
//! HTTP/1.1 connection (the one tonic and axum already build on), over
//! rustls when there is a CA to trust, with the idle connections kept for
//! the next request, as a pooling client would.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use hyper::body::{Body, Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use specmesh_harness::grpc::Connection;

use super::{Ask, Completion, Mode, Output};

/// Whose front it is: what a request may carry beyond OpenAI's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// specmesh's gateway: `speculation` and `tenant` in the body.
    Specmesh,
    /// llama.cpp's `llama-server`: its own greedy settings (`top_k: 1`,
    /// `seed`) and its prompt cache asked for explicitly (`cache_prompt`,
    /// its default); it has no speculation mode per request nor tenants.
    LlamaServer,
}

/// The HTTP front: where it is, how to talk to it, and the idle connections.
pub struct Http {
    /// `host:port`, to dial.
    addr: String,
    /// The `Host` header.
    authority: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    bearer: Option<HeaderValue>,
    /// The served model's id, as `/v1/models` lists it.
    model: String,
    dialect: Dialect,
    idle: Mutex<Vec<SendRequest<String>>>,
}

impl Http {
    pub(super) async fn connect(connection: &Connection, dialect: Dialect) -> Result<Http> {
        let url = &connection.url;
        let uri: Uri = url
            .parse()
            .with_context(|| format!("`{url}` is not a URL"))?;
        let tls = match (uri.scheme_str(), &connection.tls_ca) {
            (Some("http" | "https"), Some(_)) => true,
            (Some("http"), None) => false,
            (Some("https"), None) => bail!(
                "`{url}` is https: pass --tls-ca FILE, the CA that signed the gateway's certificate"
            ),
            _ => bail!("`{url}`: the URL must start with http:// or https://"),
        };
        let host = uri
            .host()
            .with_context(|| format!("`{url}` names no host"))?;
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let tls = if tls {
            let name = connection
                .tls_name
                .clone()
                .unwrap_or_else(|| host.to_owned());
            let name = ServerName::try_from(name.clone())
                .with_context(|| format!("`{name}` is not a server name for TLS"))?;
            Some((tls_connector(&connection.ca_pem()?)?, name))
        } else {
            None
        };
        let bearer = connection
            .bearer()
            .map(|b| {
                HeaderValue::try_from(b)
                    .context("the API key holds characters a header cannot carry")
            })
            .transpose()?;
        let mut http = Http {
            authority: addr.clone(),
            addr,
            tls,
            bearer,
            model: String::new(),
            dialect,
            idle: Mutex::new(Vec::new()),
        };
        http.model = http.served_model().await?;
        Ok(http)
    }

    /// The first model `GET /v1/models` lists.
    async fn served_model(&self) -> Result<String> {
        let (mut body, sender) = self.call(Method::GET, "/v1/models", String::new()).await?;
        let models: Value = serde_json::from_slice(&read_all(&mut body).await?)
            .context("`GET /v1/models` answered something other than JSON")?;
        self.keep(sender);
        models["data"][0]["id"]
            .as_str()
            .map(str::to_owned)
            .context("`GET /v1/models` lists no model")
    }

    /// The streamed request body of `ask` in this front's dialect.
    fn body(&self, ask: &Ask<'_>) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": ask.messages,
            "max_completion_tokens": ask.max_new,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        self.dialect_fields(&mut body, ask.mode, ask.tenant);
        body
    }

    /// What a greedy request carries beyond OpenAI's fields in this front's
    /// dialect.
    fn dialect_fields(&self, body: &mut Value, mode: Mode, tenant: &str) {
        match self.dialect {
            Dialect::Specmesh => {
                body["speculation"] = json!(mode.name());
                if !tenant.is_empty() {
                    body["tenant"] = json!(tenant);
                }
            }
            Dialect::LlamaServer => {
                body["top_k"] = json!(1);
                body["seed"] = json!(0);
                body["cache_prompt"] = json!(true);
            }
        }
    }

    /// One greedy chat completion, not streamed, of `body` (the caller's
    /// OpenAI fields: messages, tools, response_format, max_tokens) in this
    /// front's dialect: the response and the seconds it took.
    pub(super) async fn complete(&self, mut body: Value, mode: Mode) -> Result<(Value, f64)> {
        body["model"] = json!(self.model);
        body["temperature"] = json!(0);
        self.dialect_fields(&mut body, mode, "");
        let sent = Instant::now();
        let (mut response, sender) = self
            .call(Method::POST, "/v1/chat/completions", body.to_string())
            .await?;
        let bytes = read_all(&mut response).await?;
        let seconds = sent.elapsed().as_secs_f64();
        self.keep(sender);
        let v = serde_json::from_slice(&bytes)
            .with_context(|| format!("a chat completion from {} that is not JSON", self.addr))?;
        Ok((v, seconds))
    }

    pub(super) async fn chat(&self, ask: &Ask<'_>) -> Result<Completion> {
        let body = self.body(ask);
        let sent = Instant::now();
        let (mut response, sender) = self
            .call(Method::POST, "/v1/chat/completions", body.to_string())
            .await?;
        let (mut events, mut chunks, mut text) = (Sse::default(), Vec::new(), String::new());
        let (mut tokens, mut done) = (None, false);
        let (mut prompt_tokens, mut cached_tokens) = (None, None);
        while let Some(bytes) = next_data(&mut response).await? {
            let now = Instant::now();
            for data in events.push(&bytes) {
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let event: Value = serde_json::from_str(&data)
                    .with_context(|| format!("an event that is not JSON: {data}"))?;
                if let Some(e) = event.get("error") {
                    bail!(
                        "the stream from {} failed: {}",
                        self.addr,
                        e["message"].as_str().unwrap_or("?")
                    );
                }
                if let Some(t) = event["choices"][0]["delta"]["content"].as_str()
                    && !t.is_empty()
                {
                    chunks.push(now);
                    text.push_str(t);
                }
                let usage = &event["usage"];
                if let Some(n) = usage["completion_tokens"].as_u64() {
                    tokens = Some(n as usize);
                    prompt_tokens = usage["prompt_tokens"].as_u64().map(|n| n as usize);
                    cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .map(|n| n as usize);
                }
            }
        }
        let ended = Instant::now();
        self.keep(sender);
        if !done {
            bail!("the stream ended without `data: [DONE]`");
        }
        let tokens =
            tokens.context("the stream carried no usage chunk (`stream_options.include_usage`)")?;
        let mut c = Completion::timed(
            sent,
            &chunks,
            ended,
            tokens,
            Output::Text(text.clone()),
            text,
        );
        c.prompt_tokens = prompt_tokens;
        c.cached_tokens = cached_tokens;
        Ok(c)
    }

    /// Sends one request on an idle connection or a new one; a status other
    /// than 200 is the server's error. The caller reads the body to its
    /// end, then hands the connection back with [`Http::keep`].
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: String,
    ) -> Result<(Incoming, SendRequest<String>)> {
        let request = |body: String| {
            let mut request = Request::builder()
                .method(method.clone())
                .uri(path)
                .header(HOST, &self.authority)
                .header(CONTENT_TYPE, "application/json");
            if let Some(b) = &self.bearer {
                request = request.header(AUTHORIZATION, b);
            }
            request.body(body)
        };
        let sending = || format!("sending {path} to {}", self.addr);
        let mut reply = None;
        if let Some(mut idle) = self.idle_connection().await {
            match idle.send_request(request(body.clone())?).await {
                Ok(response) => reply = Some((response, idle)),
                // A kept connection the server closed meanwhile (llama-server
                // closes one after a stream ends): the request did not get
                // there, and goes again on a new connection.
                Err(e) if e.is_canceled() || e.is_closed() || e.is_incomplete_message() => {}
                Err(e) => return Err(e).with_context(sending),
            }
        }
        let (response, sender) = match reply {
            Some(r) => r,
            None => {
                let mut sender = self.new_connection().await?;
                let response = sender
                    .send_request(request(body)?)
                    .await
                    .with_context(sending)?;
                (response, sender)
            }
        };
        let status = response.status();
        let mut body = response.into_body();
        if status != StatusCode::OK {
            let text = read_all(&mut body).await.unwrap_or_default();
            let error: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
            let message = error["error"]["message"].as_str().map_or_else(
                || String::from_utf8_lossy(&text).into_owned(),
                str::to_owned,
            );
            bail!("{} answered HTTP {status} to {path}: {message}", self.addr);
        }
        Ok((body, sender))
    }

    /// A kept connection that still looks open, if any.
    async fn idle_connection(&self) -> Option<SendRequest<String>> {
        while let Some(mut idle) = self.take_idle() {
            if idle.ready().await.is_ok() {
                return Some(idle);
            }
        }
        None
    }

    async fn new_connection(&self) -> Result<SendRequest<String>> {
        let tcp = TcpStream::connect(&self.addr)
            .await
            .with_context(|| format!("connecting to the HTTP front at {}", self.addr))?;
        tcp.set_nodelay(true)?;
        match &self.tls {
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .with_context(|| format!("the TLS handshake with {}", self.addr))?;
                handshake(tls).await
            }
            None => handshake(tcp).await,
        }
    }

    fn take_idle(&self) -> Option<SendRequest<String>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn keep(&self, sender: SendRequest<String>) {
        if !sender.is_closed() {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sender);
        }
    }
}

async fn handshake<T>(io: T) -> Result<SendRequest<String>>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .context("the HTTP/1.1 handshake")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Trusting the CA certificates of `pem`, offering HTTP/1.1 by ALPN.
fn tls_connector(pem: &[u8]) -> Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots
            .add(cert.context("`--tls-ca` is not a PEM certificate file")?)
            .context("`--tls-ca` holds an unusable CA certificate")?;
    }
    if roots.is_empty() {
        bail!("`--tls-ca` holds no certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The next data frame of `body`; `None` at its end.
async fn next_data(body: &mut Incoming) -> Result<Option<Bytes>> {
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        if let Ok(data) = frame.context("reading the answer")?.into_data() {
            return Ok(Some(data));
        }
    }
    Ok(None)
}

async fn read_all(body: &mut Incoming) -> Result<Vec<u8>> {
    let mut all = Vec::new();
    while let Some(data) = next_data(body).await? {
        all.extend_from_slice(&data);
    }
    Ok(all)
}

/// Server-sent events split out of the bytes as they arrive.
#[derive(Debug, Default)]
struct Sse {
    /// Bytes of the events not yet complete: kept as bytes, since a read
    /// may end inside a character.
    pending: Vec<u8>,
}

impl Sse {
    /// The `data` of every event `bytes` completes (an event ends at a
    /// blank line; comments and other fields are skipped).
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        // A carriage return is one byte in UTF-8, never part of another
        // character: dropping it turns CRLF line ends into LF.
        self.pending.extend(bytes.iter().filter(|&&b| b != b'\r'));
        let mut out = Vec::new();
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let raw: Vec<u8> = self.pending.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&raw);
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_at_blank_lines_across_reads() {
        let mut sse = Sse::default();
        assert!(sse.push(b": keep-alive\n\ndata: {\"a\"").is_empty());
        assert_eq!(
            sse.push(b": 1}\n\ndata: [DONE]\r\n\r\n"),
            ["{\"a\": 1}", "[DONE]"]
        );
        assert!(sse.push(b"data: x\n").is_empty(), "not ended yet");
        assert_eq!(sse.push(b"data: y\n\n"), ["x\ny"]);
    }

    #[test]
    fn a_character_split_across_reads_arrives_whole() {
        let mut sse = Sse::default();
        let event = "data: caf\u{e9} \u{1f600}\n\n".as_bytes();
        // Split inside the two-byte é and the four-byte emoji.
        let (a, rest) = event.split_at(10);
        let (b, c) = rest.split_at(4);
        assert!(sse.push(a).is_empty());
        assert!(sse.push(b).is_empty());
        assert_eq!(sse.push(c), ["caf\u{e9} \u{1f600}"]);
    }
}
