//! `--log-format json`: one JSON object per line, for log collectors
//! (Loki, Elasticsearch, Cloud Logging) that index fields rather than
//! parse text.
//!
//! A line holds `timestamp` (RFC 3339, UTC), `level`, `target`, the
//! event's fields (`message` among them), the fields of every span the
//! event is in, root first so an inner span's field wins (a request's
//! `request_id`, `tenant`, `session_id`), the innermost span's name as
//! `span`, and `trace_id` / `span_id` of the OpenTelemetry span it belongs
//! to, the ids the trace backend shows, so a log line leads to its trace.
//! tracing-subscriber's own JSON format nests span fields in lists and
//! knows nothing of OpenTelemetry ids; this is that format, flattened, with
//! the ids.

use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TraceContextExt as _;
use serde_json::{Map, Value};
use tracing::dispatcher::WeakDispatch;
use tracing::field::{Field, Visit};
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of `--log-format json`; pair it with
/// [`tracing_subscriber::fmt::format::JsonFields`], which stores each
/// span's fields as the JSON object read back here, and [`attach`] it to
/// the dispatcher it formats for.
///
/// [`attach`]: JsonLines::attach
#[derive(Debug, Clone, Default)]
pub struct JsonLines {
    /// The dispatcher whose OpenTelemetry layer knows the spans' ids.
    /// Weak, since the dispatcher owns this format. (Inside an event the
    /// current dispatcher reads as none: tracing's guard against
    /// re-entrance.)
    dispatch: Arc<OnceLock<WeakDispatch>>,
}

impl JsonLines {
    /// Reads span ids through `dispatch`, the dispatcher this format is in.
    pub fn attach(&self, dispatch: &Dispatch) {
        let _ = self.dispatch.set(dispatch.downgrade());
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::String(timestamp));
        let meta = event.metadata();
        line.insert("level".into(), Value::from(meta.level().as_str()));
        line.insert("target".into(), Value::from(meta.target()));

        // The ids first: reading a span's OpenTelemetry context may lock
        // its extensions, which the field walk below holds.
        let dispatch = self.dispatch.get().and_then(WeakDispatch::upgrade);
        if let Some((trace_id, span_id)) = dispatch.and_then(|d| otel_ids(ctx, &d)) {
            line.insert("trace_id".into(), Value::String(trace_id));
            line.insert("span_id".into(), Value::String(span_id));
        }
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && let Ok(Value::Object(fields)) = serde_json::from_str(fields.as_str())
                {
                    line.extend(fields);
                }
                innermost = Some(span.name());
            }
            if let Some(name) = innermost {
                line.insert("span".into(), Value::from(name));
            }
        }
        event.record(&mut Fields(&mut line));
        writer.write_str(&Value::Object(line).to_string())?;
        writer.write_char('\n')
    }
}

/// One line in the shape of [`JsonLines`]' (`timestamp`, `level`,
/// `target`, `message`, then `fields`), for what the kit writes outside a
/// tracing event: the readiness lines launchers read on stdout.
pub fn json_line<'a>(
    level: &str,
    message: &str,
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut line = Map::new();
    let mut timestamp = String::new();
    // Writing into a String cannot fail.
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    line.insert("timestamp".into(), Value::String(timestamp));
    line.insert("level".into(), Value::from(level));
    line.insert("target".into(), Value::from(module_path!()));
    line.insert("message".into(), Value::from(message));
    for (k, v) in fields {
        line.insert(k.into(), Value::from(v));
    }
    Value::Object(line).to_string()
}

/// The trace and span id (hex) of the innermost span around the event
/// that OpenTelemetry knows (a span filtered out of tracing has none).
fn otel_ids<S, N>(ctx: &FmtContext<'_, S, N>, dispatch: &Dispatch) -> Option<(String, String)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    let ids: Vec<tracing::span::Id> = ctx.event_scope()?.map(|s| s.id()).collect();
    ids.iter().find_map(|id| {
        let cx = tracing_opentelemetry::get_otel_context(id, dispatch)?;
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid()
            .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
    })
}

/// Records an event's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // A struct (`?config`) becomes an object of its fields, so a log
        // collector indexes `config.max_batch` rather than one string.
        self.0.insert(
            field.name().into(),
            super::debug_json::value(&format!("{value:?}")),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        // NaN and infinities have no JSON number: as text.
        let v = serde_json::Number::from_f64(value)
            .map_or_else(|| Value::String(value.to_string()), Value::Number);
        self.0.insert(field.name().into(), v);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::String(value.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    fn lines(buffer: &Buffer) -> Vec<Value> {
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn a_line_carries_its_spans_fields_and_trace() {
        let buffer = Buffer::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let format = JsonLines::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(format.clone())
                    .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .with_writer(buffer.clone()),
            )
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let dispatch = Dispatch::new(subscriber);
        format.attach(&dispatch);
        let mut expected = String::new();
        tracing::dispatcher::with_default(&dispatch, || {
            let request = tracing::info_span!("request", request_id = "r-1", tenant = "acme");
            let _r = request.enter();
            let step = tracing::info_span!("step", session_id = 7u64, tenant = "inner");
            let _s = step.enter();
            expected = request
                .context()
                .span()
                .span_context()
                .trace_id()
                .to_string();
            tracing::info!(tokens = 3u64, ok = true, ratio = 0.5, "committed");
            tracing::warn!(ratio = f64::NAN, "odd");
        });
        let lines = lines(&buffer);
        assert_eq!(lines.len(), 2, "{lines:?}");
        let l = &lines[0];
        assert_eq!(l["message"], "committed");
        assert_eq!(l["level"], "INFO");
        assert_eq!(l["request_id"], "r-1");
        assert_eq!(l["session_id"], 7);
        assert_eq!(l["tenant"], "inner", "the inner span's field wins");
        assert_eq!(l["span"], "step");
        assert_eq!(l["tokens"], 3);
        assert_eq!(l["ok"], true);
        assert_eq!(l["ratio"], 0.5);
        assert_eq!(l["trace_id"], expected.as_str());
        assert_eq!(l["trace_id"].as_str().unwrap().len(), 32);
        assert_eq!(l["span_id"].as_str().unwrap().len(), 16);
        assert!(l["timestamp"].as_str().unwrap().ends_with('Z'), "{l}");
        assert_eq!(lines[1]["ratio"], "NaN");
    }

    #[test]
    fn a_line_outside_any_span_has_no_ids() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines::default())
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .with_writer(buffer.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(port = 80u64, "serving \"quoted\"\nnext");
        });
        let lines = lines(&buffer);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["message"], "serving \"quoted\"\nnext");
        assert!(lines[0].get("trace_id").is_none());
        assert!(lines[0].get("span").is_none());
    }
}
