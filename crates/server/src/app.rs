//! The process every service runs: [`main`] parses the flags, starts
//! telemetry, pins the CPUs, validates the config, reads the TLS material,
//! has the service [`Service::build`] itself, serves its metrics, binds and
//! serves until SIGTERM or SIGINT, then drains.
//!
//! A service only says what is its own: its flags and config, which
//! client certificates it asks for, and how it builds its state and its
//! routes from a valid config ([`Built`]). Everything around that is here,
//! once, so the three services start, announce, fail and drain alike (the
//! shape of linkerd2-proxy's `Config::build() -> App`, then `App::spawn()`).
//!
//! Embedders and tests use [`start`] (bound, not yet serving: the real
//! address of port 0, the service's handle) then [`Started::serve`], or
//! [`run`] for both.

use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use prometheus::Registry;
use tokio::net::TcpListener;
use tonic::service::Routes;

use crate::cli::{self, ServerArgs};
use crate::serve::{Drain, ServeConfig};
use crate::tls::{ClientAuth, Security, TlsArgs};
use crate::{AbortOnDrop, shutdown, telemetry};

/// A specmesh service, as the kit runs it.
pub trait Service: Sized + 'static {
    /// Its flags, [`ServerArgs`] flattened in.
    type Args: CommandFactory + FromArgMatches + Send;
    /// Its validated configuration, made from its flags (the error says
    /// what to fix).
    type Config: Debug + Send + TryFrom<Self::Args, Error: Into<anyhow::Error>>;
    /// What an embedder may hold while it serves (the drafter's counters;
    /// `()` when nothing).
    type Handle: Send;

    /// How its command line knows it.
    const CLI: cli::Service;
    /// Client certificates: required where only peer services call,
    /// optional where callers may authenticate by API key.
    const CLIENT_AUTH: ClientAuth;

    /// The flags every service shares.
    fn server_args(args: &Self::Args) -> &ServerArgs;

    /// Where and how it serves: the [`Endpoints`] its config embeds.
    fn endpoints(config: &Self::Config) -> &Endpoints;

    /// Loads what it serves (models, key files) and builds its state and
    /// routes. Runs after the TLS material was read, so a TLS mistake
    /// fails in a second rather than after a model load.
    fn build(
        config: Self::Config,
        security: &Security,
    ) -> impl Future<Output = anyhow::Result<Built<Self::Handle>>> + Send;
}

/// Where a service serves: the part of every config the kit reads, built
/// from the shared flags ([`ServerArgs::endpoints`]) and embedded in each
/// service's `Config` as `endpoints`.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoints {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub health_listen: Option<SocketAddr>,
    pub tls: TlsArgs,
    /// How long running calls get to finish after the shutdown signal.
    pub shutdown_grace: Duration,
}

impl Endpoints {
    /// Serving plaintext gRPC on `listen` alone, draining for `shutdown_grace`.
    pub fn plaintext(listen: SocketAddr, shutdown_grace: Duration) -> Endpoints {
        Endpoints {
            listen,
            metrics_listen: None,
            health_listen: None,
            tls: TlsArgs::plaintext(),
            shutdown_grace,
        }
    }
}

impl ServerArgs {
    /// Where and how the service serves, as these flags say.
    pub fn endpoints(&self) -> Endpoints {
        Endpoints {
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            health_listen: self.health_listen,
            tls: self.tls.clone(),
            shutdown_grace: std::time::Duration::from_secs(self.shutdown_grace_secs),
        }
    }
}

/// Registers a service's collectors with the registry `/metrics` serves.
pub type RegisterMetrics = Box<dyn FnOnce(&Registry) -> anyhow::Result<()> + Send>;

/// A built service, ready to be bound and served.
pub struct Built<H = ()> {
    /// Its gRPC services (health and reflection are added by the kit).
    pub routes: Routes,
    /// The main gRPC service's name, whose health the kit reports.
    pub service_name: &'static str,
    /// What it serves beyond the base protocol, each reported as a health
    /// service of its own (see [`crate::capability`]).
    pub capabilities: Vec<&'static str>,
    /// What the drain counts and ends.
    pub drain: Box<dyn Drain>,
    /// The `model` label of its `/metrics` (what it serves).
    pub metrics_label: String,
    /// Registers its collectors; called only with `--metrics-listen`.
    pub metrics: RegisterMetrics,
    /// After the grace period and [`Drain::close`], how long closing may
    /// take before serving returns anyway.
    pub close_timeout: Duration,
    /// HTTP/2 keepalive (interval, timeout), when not the kit's default.
    pub keepalive: Option<(Duration, Duration)>,
    /// Tasks that run while it serves, stopped with it (a second front,
    /// re-resolving peers).
    pub tasks: Vec<AbortOnDrop>,
    /// What an embedder may hold.
    pub handle: H,
}

impl<H> Debug for Built<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("service_name", &self.service_name)
            .field("metrics_label", &self.metrics_label)
            .field("close_timeout", &self.close_timeout)
            .field("keepalive", &self.keepalive)
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl Built<()> {
    /// `routes` serving `service_name`, with the kit's defaults: no
    /// metrics, nothing to close, no tasks.
    pub fn new(routes: Routes, service_name: &'static str, drain: Box<dyn Drain>) -> Built<()> {
        Built {
            routes,
            service_name,
            capabilities: Vec::new(),
            drain,
            metrics_label: String::new(),
            metrics: Box::new(|_| Ok(())),
            close_timeout: Duration::ZERO,
            keepalive: None,
            tasks: Vec::new(),
            handle: (),
        }
    }
}

impl<H> Built<H> {
    /// The same service with `handle` for its embedder.
    pub fn with_handle<T>(self, handle: T) -> Built<T> {
        Built {
            routes: self.routes,
            service_name: self.service_name,
            capabilities: self.capabilities,
            drain: self.drain,
            metrics_label: self.metrics_label,
            metrics: self.metrics,
            close_timeout: self.close_timeout,
            keepalive: self.keepalive,
            tasks: self.tasks,
            handle,
        }
    }
}

/// A service bound to its address, not yet serving.
pub struct Started<S: Service> {
    listener: TcpListener,
    local_addr: SocketAddr,
    security: Security,
    endpoints: Endpoints,
    built: Built<S::Handle>,
}

impl<S: Service> Debug for Started<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("service", &S::CLI.name)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// The whole process of service `S`: the body of its `main`. Exits 0
/// after a graceful shutdown; 1, with the cause on one line, when it
/// could not start or serve.
pub fn main<S: Service>() -> ExitCode {
    let args: S::Args = cli::parse(&S::CLI);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            let line = format!("{}: starting the async runtime: {e}", S::CLI.binary());
            match S::server_args(&args).log_format {
                telemetry::LogFormat::Text => eprintln!("{line}"),
                telemetry::LogFormat::Json => {
                    eprintln!("{}", telemetry::json_line("ERROR", &line, []))
                }
            }
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let telemetry = telemetry::init(&S::CLI.binary(), S::server_args(&args).log_format);
        let served = async {
            S::server_args(&args).pin()?;
            let config = S::Config::try_from(args).map_err(Into::into)?;
            run::<S>(config, shutdown::signal()).await
        }
        .await;
        let code = crate::exit_code(&S::CLI, served);
        // Flushes the spans before exit.
        drop(telemetry);
        code
    })
}

/// Builds, binds and serves `config` until `shutdown` resolves, then
/// drains (see [`crate::serve`]).
pub async fn run<S: Service>(
    config: S::Config,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    start::<S>(config).await?.serve(shutdown).await
}

/// Logs the effective config, reads the TLS material, builds the service,
/// serves its metrics and binds its address.
pub async fn start<S: Service>(config: S::Config) -> anyhow::Result<Started<S>> {
    // A struct's fields, in JSON lines (see `telemetry::json`).
    tracing::info!(?config, "effective config");
    let endpoints = S::endpoints(&config).clone();
    let security = Security::from_args(&endpoints.tls, S::CLIENT_AUTH)?;
    let mut built = S::build(config, &security).await?;
    if let Some(addr) = endpoints.metrics_listen {
        let registry = crate::metrics::registry(&built.metrics_label);
        let register = std::mem::replace(&mut built.metrics, Box::new(|_| Ok(())));
        register(&registry).context("registering the metrics")?;
        crate::metrics::serve(&S::CLI.binary(), addr, registry).await?;
    }
    let listener = crate::bind(endpoints.listen).await?;
    let local_addr = listener.local_addr().context("reading the bound address")?;
    Ok(Started {
        listener,
        local_addr,
        security,
        endpoints,
        built,
    })
}

impl<S: Service> Started<S> {
    /// The address actually bound (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the service gives its embedder.
    pub fn handle(&self) -> &S::Handle {
        &self.built.handle
    }

    /// Serves until `shutdown` resolves, then drains. Prints `BINARY
    /// listening on ADDR` on stdout once serving: launchers wait for it.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let Started {
            listener,
            security,
            endpoints,
            built,
            ..
        } = self;
        let mut config = ServeConfig::new(
            S::CLI.binary(),
            built.service_name,
            endpoints.shutdown_grace,
            security,
        );
        config.health_listen = endpoints.health_listen;
        config.close_timeout = built.close_timeout;
        config.capabilities = built.capabilities;
        if let Some((interval, timeout)) = built.keepalive {
            config.keepalive_interval = interval;
            config.keepalive_timeout = timeout;
        }
        // Stopped when serving returns.
        let _tasks = built.tasks;
        crate::serve(
            listener,
            built.routes,
            config,
            built.drain.as_ref(),
            shutdown,
        )
        .await
    }
}
