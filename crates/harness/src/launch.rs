//! Starting the services as child processes on loopback and stopping them:
//! what `specmesh up` does, and what `specmesh bench --up` and
//! `specmesh bench-serve --up` run against. What it starts is a
//! [`Layout`](crate::layout::Layout).
//!
//! The only unsafe code of the crate: the launched service gets a parent-death
//! signal, and is stopped with SIGTERM before SIGKILL.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::layout::Layout;
use crate::link::DelayProxy;

/// A running service process.
#[derive(Debug)]
pub struct Service {
    pub name: &'static str,
    pub addr: String,
    /// `http://ADDR/metrics` when the service serves metrics.
    pub metrics: Option<String>,
    /// The gateway's OpenAI-compatible front, `http://ADDR`, when it serves one.
    pub http: Option<String>,
    child: Child,
}

/// What a child gets when its launcher dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLauncherDeath {
    /// SIGTERM: our services shut down cleanly on it.
    Terminate,
    /// SIGKILL: for processes that may not exit on SIGTERM (llama-server
    /// closes its connections on SIGTERM, then can wait on a busy slot).
    Kill,
}

/// On Linux, the process `cmd` starts gets `signal` when its launcher
/// dies, even a killed one, so no orphan keeps a port or a model in memory
/// (the services here, and the benchmarks' llama-server).
///
/// Linux ties this to the *thread* that spawns the child, not the process:
/// spawn from threads that live as long as the launcher (`main`, the tokio
/// runtime's workers), never from `spawn_blocking`, whose threads exit
/// after ten idle seconds and would signal the child then.
pub fn die_with_parent(cmd: &mut std::process::Command, signal: OnLauncherDeath) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let signal = match signal {
            OnLauncherDeath::Terminate => libc::SIGTERM,
            OnLauncherDeath::Kill => libc::SIGKILL,
        };
        // SAFETY: prctl in the forked child before exec touches no memory
        // of the parent.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, signal);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (cmd, signal);
}

/// The binary `name` next to this executable (how cargo and releases lay
/// them out), else from PATH.
pub fn binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

impl Service {
    /// Starts `name` with `args` and waits (up to `timeout`) for its
    /// `NAME listening on ADDR` line on stdout. Its stderr (logs) is
    /// inherited.
    pub async fn start(name: &'static str, args: &[String], timeout: Duration) -> Result<Service> {
        Service::start_in(None, name, args, timeout).await
    }

    /// [`Service::start`] in the network namespace `netns` (`ip netns exec`,
    /// which execs the service in place: the pid, and the parent-death
    /// signal, stay the service's).
    pub async fn start_in(
        netns: Option<&str>,
        name: &'static str,
        args: &[String],
        timeout: Duration,
    ) -> Result<Service> {
        let bin = binary(name);
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        die_with_parent(cmd.as_std_mut(), OnLauncherDeath::Terminate);
        // The mesh this launches runs on loopback for development and
        // benchmarks: plaintext, unless the environment configures the
        // service's TLS (or says plaintext itself).
        let var = |flag: &str| {
            format!(
                "SPECMESH_{}_{flag}",
                name.trim_start_matches("specmesh-").to_uppercase()
            )
        };
        if std::env::var_os(var("TLS_CERT")).is_none()
            && std::env::var_os(var("PLAINTEXT")).is_none()
        {
            cmd.env(var("PLAINTEXT"), "true");
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (is it built? `cargo build --release --workspace`)",
                    bin.display()
                )
            })?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let prefix = format!("{name} listening on ");
        let metrics_prefix = format!("{name} metrics on ");
        let http_prefix = format!("{name} http on ");
        let (mut metrics, mut http) = (None, None);
        let addr = tokio::time::timeout(timeout, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix(&prefix) {
                    return Ok(addr.trim().to_string());
                }
                if let Some(url) = line.strip_prefix(&metrics_prefix) {
                    metrics = Some(url.trim().to_string());
                    continue;
                }
                if let Some(url) = line.strip_prefix(&http_prefix) {
                    http = Some(url.trim().to_string());
                    continue;
                }
                // What a service says before it serves (its model and
                // memory) is for the user too.
                println!("{line}");
            }
            bail!("{name} exited before it was serving")
        })
        .await
        .with_context(|| format!("{name} did not start within {timeout:?}"))??;
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Service {
            name,
            addr,
            metrics,
            http,
            child,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) -> Result<()> {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid has no memory effects.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!("{} exited with {status}", self.name);
                }
            }
            Err(_) => {
                eprintln!("{} did not stop within {grace:?}: killing it", self.name);
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

/// Waits until the gRPC health service of `url` reports SERVING.
pub async fn wait_healthy(url: &str, timeout: Duration) -> Result<()> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let status = async {
            let channel = tonic::transport::Endpoint::from_shared(url.to_string())
                .ok()?
                .connect()
                .await
                .ok()?;
            let mut client = HealthClient::new(channel);
            let r = client
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .ok()?;
            Some(r.into_inner().status)
        }
        .await;
        if status == Some(ServingStatus::Serving as i32) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{url} is not healthy after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The median of `n` health-check round trips to `url` over one
/// connection: what a unary call to a drafter behind a delay proxy costs.
pub async fn measure_rtt(url: &str, n: usize) -> Result<Duration> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())?
        .connect()
        .await
        .with_context(|| format!("dialing {url}"))?;
    let mut client = HealthClient::new(channel);
    let mut times = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let t0 = std::time::Instant::now();
        client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await?;
        times.push(t0.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// The started system: verifiers, drafters and the gateway in front of them.
#[derive(Debug)]
pub struct Mesh {
    pub verifiers: Vec<Service>,
    pub drafters: Vec<Service>,
    pub gateway: Service,
    /// The delay proxies in front of the drafters (one each, in order),
    /// when the layout adds a round trip or another namespace.
    pub proxies: Vec<DelayProxy>,
    /// The URL the rest of the mesh dials each drafter at (in order): its
    /// proxy's when it has one.
    pub dialed: Vec<String>,
}

impl Mesh {
    /// Starts the drafters, then the verifiers (told the drafters), on free
    /// loopback ports, then the gateway on `layout.front.listen` in front of
    /// them, and waits until every one is healthy.
    pub async fn start(layout: Layout) -> Result<Mesh> {
        let timeout = layout.timeout();
        let Layout {
            model,
            threads,
            isa,
            kv_dtype,
            mesh,
            front,
        } = layout;
        let link = &mesh.link;
        let proxy_rtt = link.proxy_rtt()?;
        let metrics_args = || -> Vec<String> {
            if front.metrics {
                vec!["--metrics-listen".into(), "127.0.0.1:0".into()]
            } else {
                Vec::new()
            }
        };
        let model_arg = model.display().to_string();
        let mut ds = Vec::new();
        let mut proxies = Vec::new();
        let listen_at = std::net::SocketAddr::new(link.host(), 0).to_string();
        let mut drafter_args: Vec<String> = vec!["--listen".into(), listen_at];
        if let Some(d) = &mesh.draft_model {
            drafter_args.extend([
                "--draft-model".into(),
                d.display().to_string(),
                "--target-tokenizer".into(),
                model_arg.clone(),
            ]);
            if let Some(t) = mesh.drafter_threads {
                drafter_args.extend(["--draft-model-threads".into(), t.to_string()]);
            }
            if let Some(isa) = isa {
                drafter_args.extend(["--draft-model-isa".into(), isa.to_string()]);
            }
            drafter_args.extend(["--draft-model-kv-dtype".into(), kv_dtype.to_string()]);
            if mesh.draft_ahead {
                drafter_args.push("--draft-ahead".into());
            }
            if let Some(n) = mesh.draft_head_tokens {
                drafter_args.extend(["--draft-head-tokens".into(), n.to_string()]);
            }
            if let Some(mib) = mesh.draft_kv_budget_mib {
                drafter_args.extend(["--draft-kv-budget-mib".into(), mib.to_string()]);
            }
        }
        if let Some(c) = &mesh.drafter_cpus {
            drafter_args.extend(["--cpus".into(), c.clone()]);
        }
        if front.metrics {
            // In another namespace, its loopback is not this side's.
            let at = std::net::SocketAddr::new(link.host(), 0);
            drafter_args.extend(["--metrics-listen".into(), at.to_string()]);
        }
        let netns = link.drafter_netns.as_deref();
        for _ in 0..mesh.drafters {
            let d = Service::start_in(netns, "specmesh-drafter", &drafter_args, timeout).await?;
            if let Some(rtt) = proxy_rtt {
                let upstream = crate::link::resolve(&d.addr)
                    .with_context(|| format!("the drafter's address {}", d.addr))?;
                let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
                let p = DelayProxy::start(loopback, upstream, rtt)
                    .context("starting the drafter's delay proxy")?;
                println!(
                    "specmesh-drafter {} reached through {} (+{:.1} ms round trip)",
                    d.addr,
                    p.addr(),
                    rtt.as_secs_f64() * 1e3
                );
                proxies.push(p);
            }
            ds.push(d);
        }
        // What the rest of the mesh dials each drafter at: its proxy's
        // address when it has one.
        let dialed: Vec<String> = if proxies.is_empty() {
            ds.iter().map(Service::url).collect()
        } else {
            proxies
                .iter()
                .map(|p| format!("http://{}", p.addr()))
                .collect()
        };
        let drafter_urls = dialed.join(",");
        let mut vs = Vec::new();
        for _ in 0..mesh.verifiers {
            let mut args = vec![
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--model".into(),
                model_arg.clone(),
            ];
            if let Some(t) = threads {
                args.extend(["--threads".into(), t.to_string()]);
            }
            if let Some(isa) = isa {
                args.extend(["--isa".into(), isa.to_string()]);
            }
            args.extend(["--kv-dtype".into(), kv_dtype.to_string()]);
            if let Some(c) = &mesh.verifier_cpus {
                args.extend(["--cpus".into(), c.clone()]);
            }
            if !mesh.prefix_cache {
                args.push("--prefix-cache=false".into());
            }
            if let Some(mib) = mesh.kv_budget_mib {
                args.extend(["--kv-budget-mib".into(), mib.to_string()]);
            }
            args.extend(metrics_args());
            // A verifier dials only the drafters it is told of.
            if !drafter_urls.is_empty() {
                args.extend(["--drafters".into(), drafter_urls.clone()]);
            }
            vs.push(Service::start("specmesh-verifier", &args, timeout).await?);
        }
        let mut args = vec![
            "--listen".into(),
            front.listen.to_string(),
            "--model".into(),
            model_arg,
            "--verifiers".into(),
            vs.iter().map(Service::url).collect::<Vec<_>>().join(","),
        ];
        if !ds.is_empty() {
            args.extend(["--drafters".into(), drafter_urls.clone()]);
        }
        args.extend(metrics_args());
        if let Some(addr) = front.http {
            args.extend(["--http-listen".into(), addr.to_string()]);
        }
        let gateway = Service::start("specmesh-gateway", &args, timeout).await?;
        // A drafter in another namespace is reachable only through its
        // proxy, which its health check then crosses too.
        let urls = vs.iter().map(Service::url).chain(dialed.iter().cloned());
        for url in urls.chain([gateway.url()]) {
            wait_healthy(&url, timeout).await?;
        }
        Ok(Mesh {
            verifiers: vs,
            drafters: ds,
            gateway,
            proxies,
            dialed,
        })
    }

    /// Gateway first (no new requests), then the rest.
    pub async fn stop(self) -> Result<()> {
        let grace = Duration::from_secs(10);
        self.gateway.stop(grace).await?;
        for s in self.drafters.into_iter().chain(self.verifiers) {
            s.stop(grace).await?;
        }
        Ok(())
    }
}
