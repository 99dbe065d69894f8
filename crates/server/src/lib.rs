//! The service kit: what the three services share, so none of them
//! re-implements it. [`app`]: the process (`main::<S>()`: flags,
//! telemetry, build, metrics, bind, serve, drain); [`cli`]: the common flags and the environment rule;
//! [`serve`]: bind, health, reflection, keepalive, the "listening on" line
//! and the graceful drain; [`client`]: channels to a peer service;
//! [`shutdown`]: the signals; [`telemetry`]: tracing with trace-context
//! propagation; [`affinity`]: `--cpus`; [`metrics`]: Prometheus `/metrics`;
//! [`tls`]: mutual TLS with certificate rotation; [`reload`]: files read
//! again while serving; [`discovery`]: peer lists, static and from DNS;
//! [`backoff`]: the wait between tries to reach a peer.

#![forbid(unsafe_code)]

pub mod affinity;
pub mod app;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod discovery;
pub mod metrics;
pub mod reload;
pub mod serve;
pub mod shutdown;
pub mod telemetry;
pub mod tls;

pub use app::{Built, Endpoints, Service, Started, main, run, start};
pub use cli::ServerArgs;
pub use client::Dialer;
pub use serve::{Drain, NoDrain, ServeConfig, bind, serve};
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
            eprintln!("{binary}: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints `line` on stdout for launchers to read (they wait for lines
/// such as `specmesh-gateway listening on ADDR`). A closed stdout must not
/// stop the server, so errors are ignored.
pub fn tell_launcher(line: &str) {
    use std::io::Write;
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

/// Server reflection in both versions: grpcurl 1.8 speaks only `v1alpha`,
/// newer clients `v1`. Describes the specmesh and health protos, so no
/// client needs our proto files.
pub(crate) fn reflection() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(specmesh_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}
