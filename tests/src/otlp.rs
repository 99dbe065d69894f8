//! The trace receiver of the tests (`tests/python/otlp_sink.py`, OTLP over
//! gRPC and HTTP/protobuf, plaintext or TLS) and what the tests read from
//! it: spans, and one request's whole trace across the three services.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::deploy::python;
use crate::pki::TlsFiles;

/// How long a trace may take to arrive whole: spans leave each service
/// every 200 ms (`OTEL_BSP_SCHEDULE_DELAY`), in batches of their own.
pub const WAIT: Duration = Duration::from_secs(15);

pub const GATEWAY: &str = "specmesh-gateway";
pub const VERIFIER: &str = "specmesh-verifier";
pub const DRAFTER: &str = "specmesh-drafter";

#[derive(Debug, Clone, Deserialize)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub service: Option<String>,
    pub attributes: HashMap<String, serde_json::Value>,
    pub links: Vec<Link>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Link {
    pub span_id: String,
}

impl Span {
    pub fn is(&self, service: &str, name: &str) -> bool {
        self.service.as_deref() == Some(service) && self.name == name
    }

    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(serde_json::Value::as_str)
    }

    /// tracing-opentelemetry 0.34 exports `u64` and `usize` fields as
    /// strings (OpenTelemetry integers are `i64`); `i64` ones as integers.
    pub fn attr_u64(&self, key: &str) -> Option<u64> {
        match self.attributes.get(key)? {
            serde_json::Value::String(s) => s.parse().ok(),
            v => v.as_u64(),
        }
    }
}

/// The Python trace receiver; killed when dropped (and it exits by itself
/// when our end of its stdin closes).
#[derive(Debug)]
pub struct Sink {
    child: Child,
    grpc_port: u16,
    http_port: u16,
    ingest_port: u16,
}

impl Sink {
    /// A receiver in plaintext.
    pub fn start() -> Sink {
        Sink::start_with(&[])
    }

    /// A receiver serving TLS with `server` (naming 127.0.0.1), and asking
    /// callers for a certificate signed by `client_ca` when given.
    pub fn start_tls(server: &TlsFiles, client_ca: Option<&Path>) -> Sink {
        let mut args = vec![
            "--tls".to_string(),
            server.cert.display().to_string(),
            server.key.display().to_string(),
        ];
        if let Some(ca) = client_ca {
            args.extend(["--client-ca".to_string(), ca.display().to_string()]);
        }
        Sink::start_with(&args)
    }

    fn start_with(args: &[String]) -> Sink {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/otlp_sink.py");
        let mut child = Command::new(python())
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} (set SPECMESH_TEST_PYTHON): {e}", python()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "grpc=PORT http=PORT ingest=PORT"
        let port = |key: &str| -> u16 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| {
                    panic!(
                        "otlp_sink.py printed no ports: {line:?} (is opentelemetry-proto \
                         installed? scripts/python-env.sh installs it)"
                    )
                })
        };
        Sink {
            grpc_port: port("grpc="),
            http_port: port("http="),
            ingest_port: port("ingest="),
            child,
        }
    }

    /// Its OTLP/gRPC endpoint (`scheme`: `http` or `https`).
    pub fn grpc_endpoint(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.grpc_port)
    }

    /// Its OTLP/gRPC endpoint, plaintext.
    pub fn endpoint(&self) -> String {
        self.grpc_endpoint("http")
    }

    /// Its OTLP/HTTP endpoint (the exporter appends `/v1/traces`).
    pub fn http_endpoint(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.ingest_port)
    }

    /// Every span received so far, or those of one trace.
    pub fn spans(&self, trace_id: Option<&str>) -> Vec<Span> {
        let query = trace_id.map_or(String::new(), |t| format!("?trace_id={t}"));
        let mut conn = TcpStream::connect(("127.0.0.1", self.http_port)).unwrap();
        // HTTP/1.0: the server closes the connection after the answer.
        write!(conn, "GET /spans{query} HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.0 200"), "sink answered {head}");
        serde_json::from_str(body).unwrap()
    }

    /// The trace whose gateway `request` span has `request_id`, once it
    /// holds a span of each of the three services and every parent it names
    /// (a trace's spans arrive in several batches, from three processes).
    pub async fn trace_of(&self, request_id: &str) -> Vec<Span> {
        let started = Instant::now();
        loop {
            let all = self.spans(None);
            let root = all
                .iter()
                .find(|s| s.is(GATEWAY, "request") && s.attr_str("request_id") == Some(request_id));
            let trace = root.map(|r| self.spans(Some(&r.trace_id)));
            if let Some(trace) = &trace
                && missing(trace).is_empty()
            {
                return trace.clone();
            }
            if started.elapsed() > WAIT {
                match trace {
                    None => panic!(
                        "the gateway's request span for {request_id} never arrived \
                         ({} spans did, within {WAIT:?}):\n{}",
                        all.len(),
                        describe(&all)
                    ),
                    Some(trace) => panic!(
                        "the trace of request {request_id} is incomplete after {WAIT:?}: \
                         missing {:?}; its spans:\n{}",
                        missing(&trace),
                        describe(&trace)
                    ),
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the trace still lacks: one span of each service, and every parent
/// a span names (but the caller's, for the gateway's `request`).
fn missing(trace: &[Span]) -> Vec<String> {
    let ids: HashSet<&str> = trace.iter().map(|s| s.span_id.as_str()).collect();
    let mut missing: Vec<String> = [
        (GATEWAY, "request"),
        (VERIFIER, "verifier_session"),
        (DRAFTER, "draft_session"),
    ]
    .iter()
    .filter(|(service, name)| !trace.iter().any(|s| s.is(service, name)))
    .map(|(service, name)| format!("{service}:{name}"))
    .collect();
    missing.extend(
        trace
            .iter()
            .filter(|s| {
                !s.parent_span_id.is_empty()
                    && !ids.contains(s.parent_span_id.as_str())
                    && !s.is(GATEWAY, "request")
            })
            .map(|s| format!("the parent of {}", s.name)),
    );
    missing
}

pub fn describe(trace: &[Span]) -> String {
    trace
        .iter()
        .map(|s| {
            let mut attrs: Vec<String> = s
                .attributes
                .iter()
                .filter(|(k, _)| !k.starts_with("code.") && !k.starts_with("thread."))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            attrs.sort();
            format!(
                "  {} {}:{} parent={:?} {}\n",
                s.span_id,
                s.service.as_deref().unwrap_or("?"),
                s.name,
                s.parent_span_id,
                attrs.join(" ")
            )
        })
        .collect()
}
