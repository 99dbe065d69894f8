//! The service kit: what the three services share, so none of them
//! re-implements it. [`app`]: the process (`main::<S>()`: flags,
//! telemetry, build, metrics, bind, serve, drain); [`cli`]: the common flags and the environment rule;
//! [`serve`]: bind, health, reflection, keepalive, the "listening on" line
//! and the graceful drain; [`client`]: channels to a peer service;
//! [`shutdown`]: the signals; [`telemetry`]: tracing with trace-context
//! propagation; [`affinity`]: `--cpus`; [`metrics`]: Prometheus `/metrics`;
//! [`tls`]: mutual TLS with certificate rotation; [`reload`]: files read
//! again while serving; [`discovery`]: peer lists, static and from DNS;
//! [`backoff`]: the wait between tries to reach a peer; [`capability`]:
//! what a member serves beyond the base protocol.

#![forbid(unsafe_code)]

pub mod affinity;
pub mod app;
pub mod backoff;
pub mod capability;
pub mod cli;
pub mod client;
pub mod discovery;
pub mod metrics;
pub mod model_file;
pub mod reload;
pub mod serve;
pub mod shutdown;
pub mod telemetry;
pub mod tls;

pub use app::{Built, Endpoints, Service, Started, main, run, start};
pub use cli::ServerArgs;
pub use client::Dialer;
pub use serve::{Drain, NoDrain, ServeConfig, bind, serve};
pub use telemetry::LogFormat;
pub use tls::{ClientAuth, Security, TlsArgs};

/// The end of a service's `main`: 0 after a graceful shutdown; 1, with
/// the whole cause chain on one line (for logs and for humans), when it
/// could not start or serve.
pub fn exit_code(service: &cli::Service, served: anyhow::Result<()>) -> std::process::ExitCode {
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            let binary = service.binary();
            tracing::error!(error = format!("{error:#}"), "{binary} failed");
            // In JSON mode the log line above is the whole story: a plain
            // line would break a pipeline parsing JSON.
            if telemetry::log_format() == telemetry::LogFormat::Text {
                eprintln!("{binary}: {error:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// What a service tells its launcher on stdout once it is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Serving gRPC: `BINARY listening on ADDR`.
    Listening,
    /// Serving Prometheus `/metrics`: `BINARY metrics on URL`.
    Metrics,
    /// Serving the HTTP API: `BINARY http on URL`.
    Http,
}

impl Ready {
    /// The event's name in a JSON line, and the words of a text line.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Ready::Listening => ("listening", "listening on"),
            Ready::Metrics => ("metrics", "metrics on"),
            Ready::Http => ("http", "http on"),
        }
    }
}

/// Tells launchers on stdout that `binary` is ready at `at` (they wait for
/// lines such as `specmesh-gateway listening on ADDR`). With
/// `--log-format json` the line is a JSON object like every log line,
/// whose `message` is that text and whose `event`, `service` and `at`
/// fields say the same as fields. A closed stdout must not stop the
/// server, so errors are ignored.
pub fn tell_launcher(binary: &str, ready: Ready, at: &str) {
    use std::io::Write;
    let (event, words) = ready.words();
    let text = format!("{binary} {words} {at}");
    let line = match telemetry::log_format() {
        telemetry::LogFormat::Text => text,
        telemetry::LogFormat::Json => telemetry::json_line(
            "INFO",
            &text,
            [("event", event), ("service", binary), ("at", at)],
        ),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A background task that stops with its owner.
#[derive(Debug)]
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Bytes of a message carrying `tokens` token ids plus `rest` bytes of
/// other fields: a token is a varint of at most 5 bytes. Services size
/// their message limits with it from their own bounds, so the largest
/// valid message fits and a larger one is refused before it is decoded.
pub const fn message_bytes(tokens: usize, rest: usize) -> usize {
    tokens.saturating_mul(5).saturating_add(rest)
}

/// Server reflection in both versions (grpcurl 1.8 speaks only `v1alpha`,
/// newer clients `v1`) for `service` alone: it describes the proto file
/// that defines it and that file's imports, plus health, so no client needs
/// our proto files, and a public port (the gateway's) does not describe
/// the mesh's internal services.
pub(crate) fn reflection(
    service: &str,
) -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let files = files_of(specmesh_proto::FILE_DESCRIPTOR_SET, service)?;
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_file_descriptor_set(files.clone())
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// The files of the encoded set `encoded` that `service` (its full name,
/// `specmesh.v1.Generation`) needs: the one defining it and its imports.
fn files_of(encoded: &[u8], service: &str) -> anyhow::Result<prost_types::FileDescriptorSet> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(encoded)?;
    let defines = |f: &prost_types::FileDescriptorProto| {
        f.service
            .iter()
            .any(|s| format!("{}.{}", f.package(), s.name()) == service)
    };
    let Some(root) = set.file.iter().find(|f| defines(f)) else {
        anyhow::bail!("no proto file defines the service {service}");
    };
    let mut wanted = vec![root.name().to_string()];
    let mut i = 0;
    while i < wanted.len() {
        if let Some(f) = set.file.iter().find(|f| f.name() == wanted[i]) {
            for dep in &f.dependency {
                if !wanted.contains(dep) {
                    wanted.push(dep.clone());
                }
            }
        }
        i += 1;
    }
    Ok(prost_types::FileDescriptorSet {
        file: set
            .file
            .into_iter()
            .filter(|f| wanted.iter().any(|w| w == f.name()))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_describes_a_service_and_its_imports_only() {
        let names = |service: &str| -> Vec<String> {
            let set = files_of(specmesh_proto::FILE_DESCRIPTOR_SET, service).unwrap();
            let mut n: Vec<String> = set.file.iter().map(|f| f.name().to_string()).collect();
            n.sort();
            n
        };
        assert_eq!(
            names("specmesh.v1.Generation"),
            ["specmesh/v1/common.proto", "specmesh/v1/gateway.proto"]
        );
        assert!(!names("specmesh.v1.Verifier").contains(&"specmesh/v1/gateway.proto".to_string()));
        assert!(files_of(specmesh_proto::FILE_DESCRIPTOR_SET, "specmesh.v1.Nope").is_err());
    }
}
