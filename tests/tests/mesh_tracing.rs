//! Through the real services and a real trace receiver (OTLP/gRPC, see
//! `tests/python/otlp_sink.py`): one Generate is one trace across gateway,
//! verifier and drafter, every parent link resolves inside it, each request
//! gets its own trace, a client's own trace context is continued, and the
//! last spans are flushed when the services stop.

use std::collections::HashSet;

use specmesh_e2e::mesh::Mesh;
use specmesh_e2e::otlp::{DRAFTER, GATEWAY, Sink, Span, VERIFIER, describe};
use specmesh_proto::v1;

/// Raw text that the model goes on repeating, so the drafters have
/// something to draft from.
const PROMPT: &str = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat.";
const MAX_NEW: u32 = 48;
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
    let stats = response.speculation.clone().unwrap_or_default();
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
            // Every request's trace must show drafted steps. Where this
            // machine's kernels make the model stop repeating early, the
            // first session measures little acceptance and, learning from
            // it, the later ones rightly start with speculation off (their
            // probes then find nothing to draft): right for serving, but
            // this test is about traces, so each session starts afresh.
            ("SPECMESH_DRAFTER_LEARN_ACROSS_SESSIONS", "false"),
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
