//! Through the real services and a real trace receiver (OTLP/gRPC, see
//! `tests/python/otlp_sink.py`): one Generate is one trace across gateway,
//! verifier and drafter, every parent link resolves inside it, each request
//! gets its own trace, a client's own trace context is continued, and the
//! last spans are flushed when the services stop.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use specmesh_e2e::mesh::Mesh;
use specmesh_proto::v1;

/// Raw text that the model goes on repeating, so the drafters have
/// something to draft from.
const PROMPT: &str = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat.";
const MAX_NEW: u32 = 48;
/// How long a trace may take to arrive whole: spans leave each service
/// every 200 ms (`OTEL_BSP_SCHEDULE_DELAY`), in batches of their own.
const WAIT: Duration = Duration::from_secs(15);

const GATEWAY: &str = "specmesh-gateway";
const VERIFIER: &str = "specmesh-verifier";
const DRAFTER: &str = "specmesh-drafter";

#[derive(Debug, Clone, Deserialize)]
struct Span {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    service: Option<String>,
    attributes: HashMap<String, serde_json::Value>,
    links: Vec<Link>,
}

#[derive(Debug, Clone, Deserialize)]
struct Link {
    span_id: String,
}

impl Span {
    fn is(&self, service: &str, name: &str) -> bool {
        self.service.as_deref() == Some(service) && self.name == name
    }

    fn attr_str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(serde_json::Value::as_str)
    }

    /// tracing-opentelemetry 0.34 exports `u64` and `usize` fields as
    /// strings (OpenTelemetry integers are `i64`); `i64` ones as integers.
    fn attr_u64(&self, key: &str) -> Option<u64> {
        match self.attributes.get(key)? {
            serde_json::Value::String(s) => s.parse().ok(),
            v => v.as_u64(),
        }
    }
}

/// The Python trace receiver; killed when dropped (and it exits by itself
/// when our end of its stdin closes).
struct Sink {
    child: Child,
    grpc_port: u16,
    http_port: u16,
}

impl Sink {
    fn start() -> Sink {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/otlp_sink.py");
        let mut child = Command::new(python())
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} (set SPECMESH_TEST_PYTHON): {e}", python()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "grpc=PORT http=PORT"
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
        let (grpc_port, http_port) = (port("grpc="), port("http="));
        Sink {
            child,
            grpc_port,
            http_port,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// Every span received so far, or those of one trace.
    fn spans(&self, trace_id: Option<&str>) -> Vec<Span> {
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
    async fn trace_of(&self, request_id: &str) -> Vec<Span> {
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

/// `SPECMESH_TEST_PYTHON`: an interpreter with grpcio and
/// opentelemetry-proto (scripts/python-env.sh makes one).
fn python() -> String {
    std::env::var("SPECMESH_TEST_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/specmesh/venv-grpc/bin/python")
    })
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

fn describe(trace: &[Span]) -> String {
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

/// The one span of `trace` named `name` from `service`.
fn one<'a>(trace: &'a [Span], service: &str, name: &str) -> &'a Span {
    let found: Vec<&Span> = trace.iter().filter(|s| s.is(service, name)).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {service}:{name} span in the trace:\n{}",
        describe(trace)
    );
    found[0]
}

fn parent<'a>(trace: &'a [Span], span: &Span) -> &'a Span {
    trace
        .iter()
        .find(|s| s.span_id == span.parent_span_id)
        .unwrap_or_else(|| panic!("the parent of {} is not in the trace", span.name))
}

/// Sends one greedy Generate (speculation automatic), optionally with a
/// client `traceparent`; returns the response and the gateway's request id.
async fn generate(mesh: &Mesh, traceparent: Option<&str>) -> (v1::GenerateResponse, String) {
    let mut request = tonic::Request::new(v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Prompt(PROMPT.into())),
        max_new_tokens: MAX_NEW,
        ..Default::default()
    });
    if let Some(tp) = traceparent {
        request
            .metadata_mut()
            .insert("traceparent", tp.parse().unwrap());
    }
    let response = mesh.client().await.generate(request).await.unwrap();
    let request_id = response
        .metadata()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("the gateway names the request in x-request-id")
        .to_string();
    (response.into_inner(), request_id)
}

/// The shape of one request's trace, checked hop by hop.
fn check_trace(trace: &[Span], request_id: &str, response: &v1::GenerateResponse) {
    let services: HashSet<&str> = trace.iter().filter_map(|s| s.service.as_deref()).collect();
    assert_eq!(
        services,
        HashSet::from([GATEWAY, VERIFIER, DRAFTER]),
        "spans of the trace by service:\n{}",
        describe(trace)
    );

    // gateway: request → verify_stream → (verifier) run → verifier_session
    let request = one(trace, GATEWAY, "request");
    let stream = one(trace, GATEWAY, "verify_stream");
    assert_eq!(parent(trace, stream).span_id, request.span_id);
    assert_eq!(
        parent(trace, one(trace, GATEWAY, "place")).span_id,
        request.span_id
    );
    let run = one(trace, VERIFIER, "run");
    assert_eq!(
        parent(trace, run).span_id,
        stream.span_id,
        "the verifier's run continues the gateway's verify_stream"
    );
    let session = one(trace, VERIFIER, "verifier_session");
    assert_eq!(parent(trace, session).span_id, run.span_id);
    // Without a session_id in the request, the session is named after it.
    assert_eq!(session.attr_str("session_id"), Some(request_id));

    // verifier_session → (drafter) draft_session, for the same session.
    let draft = one(trace, DRAFTER, "draft_session");
    assert_eq!(
        parent(trace, draft).span_id,
        session.span_id,
        "the drafter's session continues the verifier's session"
    );
    assert_eq!(draft.attr_str("session_id"), Some(request_id));

    // verifier_session → prefill, and one verify_step per step, whose sizes
    // add up to what the response reports.
    assert_eq!(
        parent(trace, one(trace, VERIFIER, "prefill")).span_id,
        session.span_id
    );
    let steps: Vec<&Span> = trace
        .iter()
        .filter(|s| s.is(VERIFIER, "verify_step"))
        .collect();
    let stats = response.speculation.unwrap_or_default();
    assert_eq!(
        steps.len(),
        stats.verify_steps as usize,
        "verify_step spans"
    );
    assert!(steps.iter().all(|s| s.parent_span_id == session.span_id));
    let drafted: u64 = steps.iter().filter_map(|s| s.attr_u64("drafted")).sum();
    let accepted: u64 = steps.iter().filter_map(|s| s.attr_u64("accepted")).sum();
    assert_eq!(drafted, u64::from(stats.drafted_tokens));
    assert_eq!(accepted, u64::from(stats.accepted_tokens));
    assert!(
        drafted > 0,
        "nothing was drafted: the test proves less than it says"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_one_trace_across_the_three_services() {
    let sink = Sink::start();
    let endpoint = sink.endpoint();
    let mesh = Mesh::start_with(
        1,
        1,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );

    let (first, first_id) = generate(&mesh, None).await;
    let trace = sink.trace_of(&first_id).await;
    eprintln!("trace of the first request:\n{}", describe(&trace));
    let root = one(&trace, GATEWAY, "request");
    assert!(
        root.parent_span_id.is_empty(),
        "without a client traceparent the gateway starts the trace"
    );
    check_trace(&trace, &first_id, &first);

    // The engine thread verifies steps of many sessions in one forward: its
    // verify_batch spans are their own traces, linked to the steps.
    let steps: HashSet<&str> = trace
        .iter()
        .filter(|s| s.name == "verify_step")
        .map(|s| s.span_id.as_str())
        .collect();
    let all = sink.spans(None);
    assert!(
        all.iter()
            .filter(|s| s.is(VERIFIER, "verify_batch"))
            .any(|b| b.links.iter().any(|l| steps.contains(l.span_id.as_str()))),
        "no verify_batch span links to this request's verify steps"
    );

    let (second, second_id) = generate(&mesh, None).await;
    let again = sink.trace_of(&second_id).await;
    assert_ne!(
        again[0].trace_id, trace[0].trace_id,
        "each request is its own trace"
    );
    check_trace(&again, &second_id, &second);

    // A caller that traces continues its own trace through all three.
    let (client_trace, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (third, third_id) =
        generate(&mesh, Some(&format!("00-{client_trace}-{client_span}-01"))).await;
    let continued = sink.trace_of(&third_id).await;
    assert_eq!(continued[0].trace_id, client_trace);
    assert_eq!(
        one(&continued, GATEWAY, "request").parent_span_id,
        client_span
    );
    check_trace(&continued, &third_id, &third);
}

/// Spans still queued when the services are stopped (SIGTERM) reach the
/// collector before they exit: with a schedule delay far longer than the
/// test, only the flush at shutdown can deliver them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_services_flushes_their_last_spans() {
    let sink = Sink::start();
    let endpoint = sink.endpoint();
    let mesh = Mesh::start_with(
        1,
        1,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    let (response, request_id) = generate(&mesh, None).await;
    assert!(
        sink.spans(None).is_empty(),
        "spans arrived before the shutdown: OTEL_BSP_SCHEDULE_DELAY was not honoured"
    );
    // Returns once `specmesh up` and so every service has exited.
    drop(mesh);
    let trace = sink.trace_of(&request_id).await;
    check_trace(&trace, &request_id, &response);
}
