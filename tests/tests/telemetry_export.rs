//! What an SRE's log and trace pipeline gets, through the real services and
//! a real trace receiver (`tests/python/otlp_sink.py`): `--log-format json`
//! writes JSON lines that carry the request's id and the trace id the
//! receiver got for it, and spans reach a collector over gRPC with mutual
//! TLS and over HTTP/protobuf with TLS, configured by the OpenTelemetry
//! specification's environment variables.

use std::path::Path;

use serde_json::Value;
use specmesh_e2e::cluster::{COST_CURVE, free_addr};
use specmesh_e2e::mesh::Mesh;
use specmesh_e2e::model_path;
use specmesh_e2e::otlp::{GATEWAY, Sink, Span, describe};
use specmesh_e2e::pki::{Ca, TlsFiles};
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;

const PROMPT: &str = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat.";

/// One greedy Generate through the gateway at `url`; its request id.
async fn generate(url: &str) -> String {
    let mut client = GenerationClient::connect(url.to_string()).await.unwrap();
    let response = client
        .generate(v1::GenerateRequest {
            input: Some(v1::generate_request::Input::Prompt(PROMPT.into())),
            max_new_tokens: 24,
            ..Default::default()
        })
        .await
        .unwrap();
    response
        .metadata()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("the gateway names the request in x-request-id")
        .to_string()
}

/// Every line of a JSON log, parsed; a line that is not a JSON object
/// fails the test.
fn json_lines(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap();
    text.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v @ Value::Object(_)) => v,
            _ => panic!("{}: not a JSON object: {l:?}", log.display()),
        })
        .collect()
}

/// The trace id of the gateway's `request` span of a trace.
fn trace_id(trace: &[Span]) -> String {
    trace
        .iter()
        .find(|s| s.is(GATEWAY, "request"))
        .unwrap_or_else(|| panic!("no gateway request span:\n{}", describe(trace)))
        .trace_id
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_carry_the_trace_the_collector_received() {
    let sink = Sink::start();
    let endpoint = sink.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ("SPECMESH_LOG", "info"),
    ];
    let json = ["--log-format", "json"];
    let log = |name: &str| dir.path().join(format!("{name}.log"));
    let drafter = Service::start_logged("specmesh-drafter", &json, &env, &log("drafter"));
    let model = model_path().display().to_string();
    let verifier = Service::start_logged(
        "specmesh-verifier",
        &[
            "--model",
            &model,
            "--threads",
            "1",
            "--cost-curve",
            COST_CURVE,
            "--drafters",
            &drafter.url,
            "--log-format",
            "json",
        ],
        &env,
        &log("verifier"),
    );
    let http = free_addr();
    let gateway = Service::start_logged(
        "specmesh-gateway",
        &[
            "--model",
            &model,
            "--verifiers",
            &verifier.url,
            "--drafters",
            &drafter.url,
            "--http-listen",
            &http,
            "--log-format",
            "json",
        ],
        &env,
        &log("gateway"),
    );

    let request_id = generate(&gateway.url).await;
    let trace = sink.trace_of(&request_id).await;
    let trace_id = trace_id(&trace);
    // And one call of the HTTP front, whose answer its layers log.
    let out = std::process::Command::new("curl")
        .args(["-s", "-D", "-", "-o", "/dev/null", "--max-time", "10"])
        .arg(format!("http://{http}/v1/models"))
        .output()
        .expect("curl");
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    let http_id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no x-request-id: {head}"));

    // Every line of all three logs is a JSON object with a level and a
    // message; the gateway's lines about this request name it and its trace.
    for name in ["gateway", "verifier", "drafter"] {
        for line in json_lines(&log(name)) {
            assert!(line["level"].is_string(), "{name}: {line}");
            assert!(line["timestamp"].is_string(), "{name}: {line}");
        }
        // The effective config as fields, not one string.
        let config = json_lines(&log(name))
            .into_iter()
            .find(|l| l["message"] == "effective config")
            .unwrap_or_else(|| panic!("{name} logged no effective config"));
        assert!(
            config["config"]["endpoints"]["listen"].is_string(),
            "{name}: {config}"
        );
        assert_eq!(config["config"]["endpoints"]["metrics_listen"], Value::Null);
    }
    assert_eq!(
        json_lines(&log("verifier"))
            .into_iter()
            .find_map(|l| l["config"]["max_batch"].as_u64()),
        Some(16),
        "the verifier's --max-batch (its default) as a number"
    );
    // So is every line on stdout, the readiness lines launchers read
    // included, as events with fields.
    for (name, service) in [
        ("specmesh-gateway", &gateway),
        ("specmesh-verifier", &verifier),
        ("specmesh-drafter", &drafter),
    ] {
        let lines: Vec<Value> = service
            .stdout_lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
            .collect();
        let ready = lines
            .iter()
            .find(|l| l["event"] == "listening")
            .unwrap_or_else(|| panic!("{name}: no listening event on stdout: {lines:?}"));
        assert_eq!(ready["service"], name, "{ready}");
        assert_eq!(
            format!("http://{}", ready["at"].as_str().unwrap()),
            service.url,
            "{ready}"
        );
        assert_eq!(ready["level"], "INFO", "{ready}");
    }
    assert!(
        gateway
            .stdout_lines()
            .iter()
            .any(|l| l.contains(r#""event":"http""#)),
        "the gateway's HTTP front is announced too"
    );
    let about: Vec<Value> = json_lines(&log("gateway"))
        .into_iter()
        .filter(|l| l["request_id"] == request_id.as_str())
        .collect();
    assert!(
        !about.is_empty(),
        "no gateway log line names request {request_id}:\n{}",
        std::fs::read_to_string(log("gateway")).unwrap()
    );
    for line in &about {
        assert_eq!(
            line["trace_id"], trace_id,
            "a log line of the request carries another trace id than the collector got: {line}"
        );
        assert!(line["message"].is_string(), "{line}");
    }
    // The HTTP front logs each answer in the request's span.
    let answered = json_lines(&log("gateway"))
        .into_iter()
        .find(|l| l["message"] == "answered" && l["request_id"] == http_id.as_str())
        .unwrap_or_else(|| {
            panic!(
                "no access log line for {http_id}:\n{}",
                std::fs::read_to_string(log("gateway")).unwrap()
            )
        });
    assert_eq!(answered["status"], 200, "{answered}");
    assert_eq!(answered["path"], "/v1/models", "{answered}");
    assert_eq!(answered["method"], "GET", "{answered}");
    assert_eq!(
        answered["trace_id"].as_str().map(str::len),
        Some(32),
        "{answered}"
    );
    // The drafter's lines about the session (named after the request:
    // started, ended) carry the same trace: the trace context crossed two
    // hops, gateway to verifier to drafter.
    let session: Vec<Value> = json_lines(&log("drafter"))
        .into_iter()
        .filter(|l| l["session_id"] == request_id.as_str())
        .collect();
    assert!(
        session.len() >= 2,
        "the drafter logs a session's start and end; for {request_id}:\n{}",
        std::fs::read_to_string(log("drafter")).unwrap()
    );
    assert!(
        session.iter().all(|l| l["trace_id"] == trace_id),
        "{session:?}"
    );
}

/// A CA, the receiver's certificate (for 127.0.0.1) and a client
/// certificate, in `dir`.
fn pki(dir: &Path) -> (TlsFiles, TlsFiles) {
    let ca = Ca::new("otlp test CA");
    let server = TlsFiles::write(&dir.join("server"), &ca.issue(&["127.0.0.1"]), &ca.pem());
    let client = TlsFiles::write(&dir.join("client"), &ca.issue(&["specmesh"]), &ca.pem());
    (server, client)
}

/// Starts a mesh exporting with `env`, sends one request and waits for
/// its whole trace (a span of each of the three services, every parent).
async fn one_trace_through(sink: &Sink, env: &[(&str, &str)]) {
    let mut env = env.to_vec();
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "200"));
    let mesh = Mesh::start_with(1, 1, &env);
    let request_id = generate(&mesh.gateway).await;
    let trace = sink.trace_of(&request_id).await;
    assert!(!trace_id(&trace).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_collector_over_grpc_with_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = pki(dir.path());
    let sink = Sink::start_tls(&server, Some(&server.ca));
    let endpoint = sink.grpc_endpoint("https");
    let (ca, cert, key) = (
        client.ca.display().to_string(),
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    one_trace_through(
        &sink,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_collector_over_http_protobuf_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = pki(dir.path());
    let sink = Sink::start_tls(&server, None);
    let endpoint = sink.http_endpoint("https");
    let ca = server.ca.display().to_string();
    one_trace_through(
        &sink,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
        ],
    )
    .await;
}
