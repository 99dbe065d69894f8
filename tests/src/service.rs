//! One service binary started on its own (not through `specmesh up`), for
//! layouts `up` does not build: killed when dropped.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use crate::binary;

#[derive(Debug)]
pub struct Service {
    child: Child,
    /// `http://ADDR` as the service printed it.
    pub url: String,
    /// Its Prometheus `/metrics` URL, when started with `--metrics-listen`.
    pub metrics: Option<String>,
    /// Every line it wrote on stdout so far, as written.
    stdout: Arc<Mutex<Vec<String>>>,
}

impl Service {
    /// Starts `name` (`specmesh-drafter`, …) with `args` on a free loopback
    /// port and waits for its `NAME listening on ADDR` line.
    pub fn start<S: AsRef<OsStr>>(name: &str, args: &[S], env: &[(&str, &str)]) -> Service {
        Service::start_at(name, "127.0.0.1:0", args, env)
    }

    /// [`Service::start`] on the address `listen`.
    pub fn start_at<S: AsRef<OsStr>>(
        name: &str,
        listen: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Service {
        Service::start_wrapped(&[], name, listen, args, env)
    }

    /// [`Service::start_at`] through `wrapper` (a command that ends by
    /// exec'ing its arguments, e.g. `unshare`), run as
    /// `WRAPPER... BINARY --listen LISTEN ARGS...`. Without `--tls-cert` in
    /// `args` the service runs `--plaintext`.
    pub fn start_wrapped<S: AsRef<OsStr>>(
        wrapper: &[&str],
        name: &str,
        listen: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Service {
        Service::spawn(wrapper, name, listen, args, env, Stdio::inherit())
    }

    /// [`Service::start`] with its stderr (its log) written to `log`.
    pub fn start_logged<S: AsRef<OsStr>>(
        name: &str,
        args: &[S],
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> Service {
        let file = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        Service::spawn(&[], name, "127.0.0.1:0", args, env, Stdio::from(file))
    }

    fn spawn<S: AsRef<OsStr>>(
        wrapper: &[&str],
        name: &str,
        listen: &str,
        args: &[S],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Service {
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(binary(name));
                cmd
            }
            None => Command::new(binary(name)),
        };
        let tls = args.iter().any(|a| a.as_ref() == "--tls-cert");
        if !tls {
            cmd.arg("--plaintext");
        }
        cmd.args(["--listen", listen])
            .args(args)
            .env("SPECMESH_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let prefix = format!("{name} listening on ");
        let metrics_prefix = format!("{name} metrics on ");
        let mut metrics = None;
        let written = Arc::new(Mutex::new(Vec::new()));
        let addr = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("{name} exited before listening"))
                .expect("reading stdout");
            written.lock().unwrap().push(line.clone());
            let line = launcher_text(line);
            if let Some(a) = line.strip_prefix(&prefix) {
                break a.trim().to_string();
            }
            if let Some(url) = line.strip_prefix(&metrics_prefix) {
                metrics = Some(url.trim().to_string());
            }
        };
        // Keep draining stdout so the service never blocks on a full pipe.
        let stdout = Arc::clone(&written);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                written.lock().unwrap().push(line);
            }
        });
        Service {
            child,
            url: format!("http://{addr}"),
            metrics,
            stdout,
        }
    }
}

impl Service {
    /// The lines it wrote on stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// The process id, for logs and for `kill -9` from outside.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as Kubernetes does to a pod it stops.
    pub fn terminate(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }

    /// Waits up to `timeout` for the process to exit; its status, or
    /// `None` when it still runs.
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs service binary `name` with `args` (plaintext, any loopback port)
/// under `wrapper` (a command line its path and arguments are appended to;
/// empty: none) until it exits, which it must within a minute: for the
/// flags and files a service refuses at start.
pub fn run_to_exit(wrapper: &[String], name: &str, args: &[&str]) -> Output {
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(binary(name));
            c
        }
        None => Command::new(binary(name)),
    };
    let child = cmd
        .args(["--plaintext", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("SPECMESH_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The watchdog kills the child only while it has not been waited for
    // (so the pid is still ours): told it exited, it returns at once.
    let (exited, watch) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if watch
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_err()
        {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = exited.send(());
    watchdog.join().unwrap();
    out
}

/// What a service's stdout line tells its launcher: the line itself, or,
/// with `--log-format json`, the `message` of the JSON object it is.
pub fn launcher_text(line: String) -> String {
    if !line.starts_with('{') {
        return line;
    }
    let value: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("a stdout line that is not JSON in JSON mode: {e}: {line}"));
    match value.get("message").and_then(|m| m.as_str()) {
        Some(message) => message.to_string(),
        None => line,
    }
}
