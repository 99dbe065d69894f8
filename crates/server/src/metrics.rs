//! Prometheus metrics: `--metrics-listen ADDR` serves `GET /metrics` in the
//! text exposition format from the service's registry. Metrics are defined
//! and encoded by the `prometheus` crate and served by `axum`; nothing here
//! formats the exposition by hand.
//!
//! Every metric carries the constant label `model_name` (vLLM's label, so
//! dashboards written for vLLM's schema read ours with the prefix changed),
//! and every name starts with `specmesh_`. Not `specmesh:` as vLLM's
//! `vllm:`: Prometheus reserves colons for recording rules, and
//! `promtool check metrics` refuses them in an exposition.

use std::net::SocketAddr;

use anyhow::Context;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;

/// A registry whose metrics all carry `model_name`.
pub fn registry(model_name: &str) -> Registry {
    let labels = [("model_name".to_string(), model_name.to_string())].into();
    Registry::new_custom(None, Some(labels)).expect("a constant label with a valid name")
}

/// Binds `addr`, then serves `registry` on `/metrics` in the background
/// for the life of the process. Prints `BINARY metrics on
/// http://ADDR/metrics` on stdout (launchers read it) and logs it.
pub async fn serve(
    binary: &str,
    addr: SocketAddr,
    registry: Registry,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener {addr}"))?;
    let bound = listener
        .local_addr()
        .context("reading the metrics address")?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move { exposition(&registry) }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    });
    let url = format!("http://{bound}/metrics");
    tracing::info!(%url, "serving metrics");
    crate::tell_launcher(binary, crate::Ready::Metrics, &url);
    Ok(bound)
}

/// The registry's metrics in the text format.
fn exposition(registry: &Registry) -> impl IntoResponse + use<> {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, encoder.format_type().to_string())],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".to_string())],
            format!("encoding the metrics: {e}").into_bytes(),
        ),
    }
}

/// Moves `counter` up to `total`: a service's own running count (an
/// atomic it keeps anyway), read when Prometheus scrapes.
pub fn catch_up(counter: &prometheus::IntCounter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

/// Registers `metric` with `registry`: names are fixed at compile time, so
/// a clash is a bug.
pub fn register<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_registry_is_served_with_its_model_label() {
        let registry = registry("smollm2-135m");
        let c = register(
            &registry,
            prometheus::IntCounter::new("specmesh_things_total", "Things.").unwrap(),
        );
        c.inc_by(3);
        let addr = serve("specmesh-test", "127.0.0.1:0".parse().unwrap(), registry)
            .await
            .unwrap();
        let body = http_get(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            body.contains("specmesh_things_total{model_name=\"smollm2-135m\"} 3"),
            "{body}"
        );
        assert!(http_get(addr, "/other").await.starts_with("HTTP/1.1 404"));
    }

    async fn http_get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }
}
