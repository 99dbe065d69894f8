//! Tracing: `tracing` spans, bridged to OpenTelemetry so every span has a
//! trace id and the W3C `traceparent` travels in gRPC metadata on every hop.
//! With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) set, spans
//! are exported over OTLP: gRPC or HTTP/protobuf, plaintext or TLS
//! ([`export`]). Logs go to stderr as text or, with `--log-format json`, as
//! JSON lines carrying each line's trace id ([`json`]).

mod debug_json;
mod export;
mod json;

pub use json::{JsonLines, json_line};

use std::sync::OnceLock;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The variables that turn exporting on, the signal-specific one first (it
/// wins, as in the OpenTelemetry spec, and as the exporter resolves it).
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Crates that run inside the exporter itself: a span of theirs, exported,
/// would make another export, and so on forever.
const EXPORTER_CRATES: [&str; 7] = [
    "h2",
    "hyper",
    "hyper_util",
    "reqwest",
    "tonic",
    "tower",
    "opentelemetry",
];

/// Keeps the tracer provider alive; dropping it flushes spans.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // Bounded by the SDK (5 s), so a collector that is gone cannot
        // hold up the exit past a shutdown grace period.
        let _ = self.provider.shutdown();
    }
}

/// How log lines are written (`--log-format`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line with the request's fields and trace id.
    Json,
}

/// The format [`init`] installed: what [`crate::tell_launcher`] and the
/// kit's own lines follow.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// How this process writes its lines: as [`init`] was told, text before.
pub fn log_format() -> LogFormat {
    FORMAT.get().copied().unwrap_or_default()
}

/// Where spans go, decided before logging exists and logged after.
enum Export {
    Off,
    To(String, export::Protocol),
    Failed(String, export::ExportError),
}

/// Installs logging (stderr in `format`, filter from `SPECMESH_LOG`,
/// default `info`) and the OpenTelemetry bridge for `service` (filter from
/// `SPECMESH_TRACE`, default `info`). Must run inside a Tokio runtime: the
/// OTLP/gRPC exporter's channel lives on it.
pub fn init(service: &str, format: LogFormat) -> Telemetry {
    let _ = FORMAT.set(format);
    let mut builder = SdkTracerProvider::builder().with_resource(
        opentelemetry_sdk::Resource::builder()
            .with_service_name(service.to_string())
            .build(),
    );
    let export = match otlp_endpoint() {
        None => Export::Off,
        // The batch processor exports from its own thread and drops spans
        // when its queue is full, so a slow or absent collector never
        // blocks a request. (The simple processor, exporting inline, hung
        // the first handler that ended a span.)
        Some(endpoint) => {
            match export::protocol().and_then(|p| Ok((p, export::exporter(&endpoint, p)?))) {
                Ok((protocol, exporter)) => {
                    builder = builder.with_batch_exporter(exporter);
                    Export::To(endpoint, protocol)
                }
                Err(e) => Export::Failed(endpoint, e),
            }
        }
    };
    let provider = builder.build();
    let tracer = provider.tracer(service.to_string());
    let log_filter =
        EnvFilter::try_from_env("SPECMESH_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let json_lines = JsonLines::default();
    let (text, json) = match format {
        LogFormat::Text => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    // Colours only on a terminal: log collectors get plain text.
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_target(false)
                    .with_filter(log_filter),
            ),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .event_format(json_lines.clone())
                    .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .with_writer(std::io::stderr)
                    .with_filter(log_filter),
            ),
        ),
    };
    let dispatch: tracing::Dispatch = tracing_subscriber::registry()
        .with(text)
        .with(json)
        // A filter of its own: quieter logs must not switch spans off, or
        // no trace context would be left to propagate.
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(trace_filter()),
        )
        .into();
    json_lines.attach(&dispatch);
    let _ = dispatch.try_init();
    match export {
        Export::Off => {}
        Export::To(endpoint, protocol) => {
            tracing::info!(%endpoint, service, protocol = protocol.name(), "exporting spans");
        }
        Export::Failed(endpoint, error) => {
            tracing::warn!(%endpoint, error = %error, "not exporting spans: invalid OTLP exporter settings");
        }
    }
    Telemetry { provider }
}

/// The collector's URL when exporting is asked for; an empty variable
/// counts as unset.
fn otlp_endpoint() -> Option<String> {
    ENDPOINT_VARS
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
}

fn trace_filter() -> EnvFilter {
    let filter =
        EnvFilter::try_from_env("SPECMESH_TRACE").unwrap_or_else(|_| EnvFilter::new("info"));
    EXPORTER_CRATES.iter().fold(filter, |f, krate| {
        // A crate name followed by `=off` is always a valid directive.
        f.add_directive(format!("{krate}=off").parse().unwrap())
    })
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Puts the current span's trace context into an outgoing request.
pub fn inject<T>(request: &mut tonic::Request<T>) {
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new()
        .inject_context(&cx, &mut MetadataInjector(request.metadata_mut()));
}

/// Makes `span` a child of the trace context an incoming request carries.
pub fn adopt<T>(span: &tracing::Span, request: &tonic::Request<T>) {
    adopt_metadata(span, request.metadata());
}

/// Makes `span` a child of the trace context `metadata` carries (gRPC
/// metadata, or HTTP headers through `MetadataMap::from_headers`).
pub fn adopt_metadata(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let cx = TraceContextPropagator::new().extract(&MetadataExtractor(metadata));
    let _ = span.set_parent(cx);
}

/// The trace id of the current span, for logs and responses (hex, or empty).
pub fn current_trace_id() -> String {
    use opentelemetry::trace::TraceContextExt;
    let cx = tracing::Span::current().context();
    let id = cx.span().span_context().trace_id();
    if id == opentelemetry::trace::TraceId::INVALID {
        String::new()
    } else {
        id.to_string()
    }
}
