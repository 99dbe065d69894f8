//! One `llama-server` process of llama.cpp on a free loopback port: the
//! peer every benchmark through the services runs against, started with
//! the same GGUF and threads as ours, and killed when dropped.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use specmesh_harness::launch;

use super::build_info;
use super::spec::PeerSpec;

/// How a server divides its KV cache.
#[derive(Debug, Clone, Copy)]
pub struct Slots {
    /// Requests it decodes at once (`-np`).
    pub parallel: usize,
    /// Context of each slot; the server holds `parallel` times this (`-c`).
    pub context: usize,
}

/// A running `llama-server`.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// Its stderr (its log), for saying why it failed.
    log: tempfile::NamedTempFile,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// What the build says of itself, for reports.
    pub version: String,
    /// Its configuration and binary, for errors.
    name: String,
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Server {
    /// Starts `llama-server` from `bin_dir` serving `model` with `spec`,
    /// and waits until its model is loaded. Its prompt cache is on (its
    /// default): a request reuses the longest prefix its slot still holds.
    pub fn start(
        bin_dir: &Path,
        model: &Path,
        threads: usize,
        spec: &PeerSpec,
        slots: Slots,
    ) -> Result<Server> {
        let mut server = Server::spawn(bin_dir, model, threads, spec, slots)?;
        server.ready()?;
        Ok(server)
    }

    /// Starts the process without waiting for it: [`Server::ready`] waits.
    /// Call it from a thread that lives as long as the run (the server dies
    /// with the thread that spawned it, see
    /// [`specmesh_harness::launch::die_with_parent`]); the wait can go
    /// elsewhere.
    pub fn spawn(
        bin_dir: &Path,
        model: &Path,
        threads: usize,
        spec: &PeerSpec,
        slots: Slots,
    ) -> Result<Server> {
        let bin = bin_dir.join("llama-server");
        if !bin.exists() {
            bail!(
                "no {}: run tools/bench/setup.sh (builds llama.cpp for this CPU) or pass --peer-bin",
                bin.display()
            );
        }
        let port = free_port()?;
        let total_context = slots.parallel.max(1) * slots.context;
        let log = tempfile::Builder::new()
            .prefix("specmesh-llama-server-")
            .suffix(".log")
            .tempfile()
            .context("a file for llama-server's log")?;
        let mut cmd = Command::new(&bin);
        launch::die_with_parent(&mut cmd, launch::OnLauncherDeath::Kill);
        cmd.arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
            .args(["-np", &slots.parallel.max(1).to_string()])
            .args(["-c", &total_context.to_string(), "--no-webui"])
            .args(spec.args(threads))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().context("llama-server's log")?);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Server {
            child,
            log,
            url: format!("http://127.0.0.1:{port}"),
            version: format!(
                "llama.cpp llama-server ({})",
                build_info(bin_dir).unwrap_or_else(|| "unknown build".into())
            ),
            name: format!("{} ({})", spec.name(), bin.display()),
        })
    }

    /// Waits until the server has loaded its model (blocking, up to 5
    /// minutes); on failure says why, with the end of its log.
    pub fn ready(&mut self) -> Result<()> {
        self.wait_ready(Duration::from_secs(300)).map_err(|e| {
            let log = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            e.context(format!("{}; its log ends: {}", self.name, tail.join(" | ")))
        })
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.child.try_wait()? {
                bail!("llama-server exited ({status}) before it was ready");
            }
            let health = agent.get(format!("{}/health", self.url)).call();
            if matches!(health, Ok(r) if r.status() == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("llama-server was not ready within {timeout:?}")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
