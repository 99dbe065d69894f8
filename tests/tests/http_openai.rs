//! The OpenAI-compatible HTTP front, driven by the official `openai` Python
//! package (tests/python/openai_client.py) against a running mesh: chat,
//! streaming with usage, completions, a stop string, a seeded sampled
//! request, refusals in OpenAI's error shape, a predicted output, and a
//! stream the client walks away from, whose KV the verifier frees. The
//! greedy answers must equal the gRPC API's for the same requests.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use specmesh_e2e::cluster::{free_addr, verifier_stats};
use specmesh_e2e::deploy::python;
use specmesh_e2e::front::Front;
use specmesh_e2e::mesh::chat_request;
use specmesh_e2e::model_path;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_gets_what_the_grpc_api_gives() {
    let front = Front::start(&[]);
    let (model_id, gateway, verifier) = (&front.model_id, &front.gateway, &front.verifier);
    let seen = front.run_client("openai_client.py");

    // The gRPC API's answers to the same requests.
    let mut grpc = GenerationClient::connect(gateway.url.clone())
        .await
        .unwrap();
    let chat = grpc
        .generate(chat_request("Name three colors of the rainbow.", 32))
        .await
        .unwrap()
        .into_inner();
    let completion = grpc
        .generate(v1::GenerateRequest {
            input: Some(v1::generate_request::Input::Prompt(
                "def fibonacci(n):".into(),
            )),
            max_new_tokens: 24,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    assert_eq!(seen["models"], serde_json::json!([model_id]));
    assert_eq!(seen["chat"]["text"], chat.text.as_str());
    assert_eq!(seen["chat"]["object"], "chat.completion");
    let usage = chat.usage.unwrap();
    assert_eq!(seen["chat"]["usage"]["prompt_tokens"], usage.prompt_tokens);
    assert_eq!(
        seen["chat"]["usage"]["completion_tokens"],
        usage.completion_tokens
    );
    assert_eq!(
        seen["chat"]["usage"]["total_tokens"],
        usage.prompt_tokens + usage.completion_tokens
    );
    // Streaming: the same text, the usage in its own last chunk.
    assert_eq!(seen["stream"]["text"], chat.text.as_str());
    assert_eq!(
        seen["stream"]["usage"]["completion_tokens"],
        usage.completion_tokens
    );
    assert_eq!(
        seen["stream"]["finish_reason"],
        seen["chat"]["finish_reason"]
    );
    assert_eq!(seen["completion"]["text"], completion.text.as_str());
    // A stop string: the answer up to it, finish reason `stop`.
    let stop = seen["stop"]["stop"].as_str().unwrap();
    let cut = &chat.text[..chat
        .text
        .find(stop)
        .expect("the stop string is in the answer")];
    assert_eq!(seen["stop"]["text"], cut);
    assert_eq!(seen["stop"]["finish_reason"], "stop");
    // Sampled with a seed: reproducible.
    assert_eq!(seen["seeded"][0], seen["seeded"][1]);
    assert!(!seen["seeded"][0].as_str().unwrap().is_empty());
    // Refusals in OpenAI's error shape, naming what to fix.
    let error = |name: &str| &seen["errors"][name];
    assert_eq!(error("n")["status"], 400);
    assert_eq!(error("n")["body"]["param"], "n");
    assert_eq!(error("role")["status"], 400);
    assert_eq!(error("model")["status"], 404);
    assert_eq!(error("model")["body"]["code"], "model_not_found");
    assert_eq!(error("context")["status"], 400);
    // The gateway's own refusal names OpenAI's parameter, not the gRPC field.
    assert_eq!(error("context")["body"]["param"], "max_tokens");
    assert!(
        error("context")["body"]["message"]
            .as_str()
            .unwrap()
            .contains("max_new_tokens"),
        "{}",
        error("context")
    );
    // A predicted output: the same text, the prediction's tokens used.
    assert_eq!(seen["prediction"]["text"], chat.text.as_str());
    let details = &seen["prediction"]["usage"]["completion_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64().unwrap() > 0,
        "{details}"
    );

    // The stream the client left: its session ends on the verifier and its
    // KV is freed (the 2000-token answer would run for many seconds).
    assert_eq!(seen["cancelled_after_chunks"], 3);
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let s = verifier_stats(&verifier.url).await.unwrap();
        if s.active_sessions == 0 && s.reserved_bytes == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the abandoned session still runs: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST URL` with a JSON body and an optional bearer key: (status, body).
fn post(url: &str, body: &str, key: Option<&str>) -> (u16, Value) {
    let (status, body, _) = post_with_headers(url, body, key);
    (status, body)
}

/// [`post`], with the response's headers (lower-cased names).
fn post_with_headers(
    url: &str,
    body: &str,
    key: Option<&str>,
) -> (u16, Value, std::collections::HashMap<String, String>) {
    let headers = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new("curl");
    cmd.arg("-D")
        .arg(headers.path())
        .args(["-s", "-w", "\n%{http_code}", "--max-time", "60", "-H"])
        .arg("content-type: application/json")
        .args(["-d", body, url]);
    if let Some(key) = key {
        cmd.arg("-H").arg(format!("authorization: Bearer {key}"));
    }
    let out = cmd.output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("a status line");
    let headers = std::fs::read_to_string(headers.path())
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(body).unwrap(),
        headers,
    )
}

/// With `--api-keys`, the HTTP front authenticates as the gRPC API does:
/// no key or an unknown one is 401 in OpenAI's shape, a tenant's key runs.
#[test]
fn the_http_front_takes_the_gateways_api_keys() {
    let dir = tempfile::tempdir().unwrap();
    let tenant = specmesh_e2e::tenants::new_key("team-a");
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{}\n", tenant.line)).unwrap();
    let http = free_addr();
    let _mesh = specmesh_e2e::tenants::KeyedMesh::start(&keys, false, &["--http-listen", &http]);
    let model_id = model_path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let url = format!("http://{http}/v1/chat/completions");
    let body = serde_json::json!({
        "model": model_id, "temperature": 0, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hi"}],
    })
    .to_string();
    let (status, error, headers) = post_with_headers(&url, &body, None);
    assert_eq!(status, 401, "{error}");
    assert_eq!(error["error"]["type"], "authentication_error");
    // A refusal names its request too, for the gateway's logs.
    assert_eq!(headers["x-request-id"].len(), 36, "{headers:?}");
    let (status, error) = post(&url, &body, Some("sk-not-a-key"));
    assert_eq!(status, 401, "{error}");
    // The key is checked before the body is read: a keyless body that is
    // not even JSON is 401, not a parse error.
    let (status, error) = post(&url, "{not json", None);
    assert_eq!(status, 401, "{error}");
    // Listing the model needs a key too.
    let models = |key: Option<&str>| {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .arg(format!("http://{http}/v1/models"));
        if let Some(key) = key {
            cmd.arg("-H").arg(format!("authorization: Bearer {key}"));
        }
        String::from_utf8(cmd.output().expect("curl").stdout).unwrap()
    };
    assert_eq!(models(None), "401");
    assert_eq!(models(Some(&tenant.key)), "200");
    let (status, ok, headers) = post_with_headers(&url, &body, Some(&tenant.key));
    assert_eq!(status, 200, "{ok}");
    assert_eq!(ok["object"], "chat.completion");
    // The answer names its request as the gRPC API's does; its id is built
    // from the same id.
    let request_id = &headers["x-request-id"];
    assert_eq!(ok["id"], format!("chatcmpl-{request_id}"));
    assert!(ok["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}

/// `specmesh up --http-listen` starts the OpenAI front beside the gRPC API,
/// and `up` names the gateway's process like the others'.
#[test]
fn up_serves_the_openai_front_and_names_the_gateway() {
    let http = free_addr();
    let mesh = specmesh_e2e::mesh::Mesh::start_with_args(&["--http-listen", &http], &[]);
    assert_eq!(
        mesh.http.as_deref(),
        Some(format!("http://{http}").as_str())
    );
    let out = Command::new("curl")
        .args([
            "-sf",
            "--max-time",
            "10",
            &format!("http://{http}/v1/models"),
        ])
        .output()
        .expect("running curl");
    assert!(out.status.success(), "GET /v1/models: {out:?}");
    let models: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(models["object"], "list", "{models}");
    let gateway = mesh.of("specmesh-gateway");
    assert_eq!(gateway.len(), 1, "{:?}", mesh.services);
    assert_eq!(gateway[0].url, mesh.gateway);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", gateway[0].pid)).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("specmesh-gateway"),
        "pid {} is not the gateway",
        gateway[0].pid
    );
    assert!(gateway[0].metrics.is_some(), "{:?}", gateway[0]);
}

/// SIGTERM mid-stream, as a rolling update sends it: the HTTP front's
/// `/health` answers 503 `draining` at once and a new request OpenAI's 503
/// `draining` error, the running streams go on through the grace period
/// (a short one to its end), one that outlives it ends with an error event
/// the official client raises (never a reset), and the gateway exits 0.
#[test]
fn sigterm_mid_stream_drains_the_http_front() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;

    let mut front = Front::start(&["--shutdown-grace-secs", "3"]);
    let (model_id, http) = (front.model_id.clone(), front.http.clone());
    let gateway = &mut front.gateway;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/openai_drain.py");
    let mut client = Command::new(python())
        .args([script, &format!("http://{http}"), &model_id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running the openai client (scripts/python-env.sh installs it)");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let first = lines.next().expect("the client's first line").unwrap();
    assert_eq!(first, "streaming");

    gateway.terminate();
    std::thread::sleep(Duration::from_millis(300));
    let health = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--max-time", "5"])
        .arg(format!("http://{http}/health"))
        .output()
        .expect("curl");
    let health = String::from_utf8_lossy(&health.stdout).into_owned();
    let (body, code) = health.rsplit_once('\n').unwrap();
    assert_eq!(code, "503", "{health}");
    assert_eq!(
        serde_json::from_str::<Value>(body).unwrap()["status"],
        "draining"
    );
    let request = serde_json::json!({
        "model": model_id, "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
    })
    .to_string();
    let (status, refused) = post(
        &format!("http://{http}/v1/chat/completions"),
        &request,
        None,
    );
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["error"]["type"], "server_error");
    assert_eq!(refused["error"]["code"], "draining");

    client
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"signalled\n")
        .unwrap();
    let seen: Value = serde_json::from_str(
        &lines
            .next()
            .expect("the client's report")
            .expect("reading the client"),
    )
    .unwrap();
    assert!(client.wait().unwrap().success());
    let long = &seen["long"];
    assert_eq!(long["error"], "APIError", "a reset is not a drain: {seen}");
    assert_eq!(long["code"], "draining", "{seen}");
    assert!(
        long["chars"].as_u64() > long["chars_at_signal"].as_u64(),
        "the stream went on through the grace period: {seen}"
    );
    assert_eq!(seen["short"]["finish_reason"], "length", "{seen}");
    let exit = gateway
        .wait_exit(Duration::from_secs(30))
        .expect("the gateway exits after its grace period");
    assert!(exit.success(), "{exit:?}");
}

/// The HTTP front's layers: a body over `--max-message-bytes` is 413 and
/// one that stops arriving is 408 after `--http-body-timeout-ms`, both in
/// OpenAI's error shape and naming their request; a caller's own
/// `x-request-id` is replaced by the gateway's.
#[test]
fn the_http_front_bounds_bodies_in_size_and_time() {
    use std::io::{Read, Write};
    let front = Front::start(&[
        "--max-message-bytes",
        "65536",
        "--http-body-timeout-ms",
        "500",
    ]);
    let url = format!("http://{}/v1/chat/completions", front.http);
    let big = serde_json::json!({
        "model": front.model_id, "max_tokens": 8,
        "messages": [{"role": "user", "content": "x".repeat(100_000)}],
    })
    .to_string();
    let (status, error, headers) = post_with_headers(&url, &big, None);
    assert_eq!(status, 413, "{error}");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    assert_eq!(error["error"]["code"], "request_too_large", "{error}");
    assert_eq!(headers["x-request-id"].len(), 36, "{headers:?}");

    // Headers promise 100 bytes; 10 come, then nothing.
    let mut conn = std::net::TcpStream::connect(&front.http).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: 100\r\nconnection: close\r\n\r\n{{\"model\":"
    )
    .unwrap();
    let started = Instant::now();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    let waited = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    let error: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(error["error"]["code"], "timeout", "{error}");

    // The gateway names the request, whatever the caller sent.
    let ok = serde_json::json!({
        "model": front.model_id, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": "Hi"}],
    })
    .to_string();
    let out = Command::new("curl")
        .args(["-s", "-D", "-", "-o", "/dev/null", "--max-time", "60"])
        .args([
            "-H",
            "content-type: application/json",
            "-H",
            "x-request-id: mine",
        ])
        .args(["-d", &ok, &url])
        .output()
        .expect("curl");
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id:"))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no x-request-id: {head}"));
    assert_ne!(id, "mine");
    assert_eq!(id.len(), 36, "{id}");
    assert!(head.starts_with("http/1.1 200"), "{head}");
}
