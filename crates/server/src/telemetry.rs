//! Tracing: `tracing` spans, bridged to OpenTelemetry so every span has a
//! trace id and the W3C `traceparent` travels in gRPC metadata on every hop.
//! Exporting (OTLP) only has to be added to the provider built here.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Keeps the tracer provider alive; dropping it flushes spans.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Installs logging (stderr, filter from `SPECMESH_LOG`, default `info`) and
/// the OpenTelemetry bridge for `service`.
pub fn init(service: &'static str) -> Telemetry {
    let provider = SdkTracerProvider::builder()
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    let tracer = provider.tracer(service);
    let filter = EnvFilter::try_from_env("SPECMESH_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours only on a terminal: log collectors get plain text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init();
    Telemetry { provider }
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
    let cx = TraceContextPropagator::new().extract(&MetadataExtractor(request.metadata()));
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
