//! The flags every service shares ([`ServerArgs`]) and the one rule for
//! environment fallbacks: every flag of a service reads the variable named
//! for the service and the flag, `--max-sessions` of the verifier
//! `SPECMESH_VERIFIER_MAX_SESSIONS`.
//!
//! The names carry the service because a drafter and a verifier often share
//! one pod spec or one `.env` file, and a shared `SPECMESH_MAX_SESSIONS`
//! would silently size both. The rule is applied to the parsed command, not
//! written on each field, so no flag can miss it or get it wrong.

use std::ffi::OsString;
use std::net::SocketAddr;

use clap::{CommandFactory, FromArgMatches};

/// A service as its command line knows it.
#[derive(Debug, Clone, Copy)]
pub struct Service {
    /// `verifier`, `drafter`, `gateway`.
    pub name: &'static str,
    /// The address served when `--listen` is not given.
    pub default_listen: &'static str,
    /// The default of `--shutdown-grace-secs`.
    pub default_grace_secs: u64,
}

impl Service {
    /// The binary: `specmesh-verifier`.
    pub fn binary(&self) -> String {
        format!("specmesh-{}", self.name)
    }

    /// The environment variable of flag `id` (the field name):
    /// `SPECMESH_VERIFIER_MAX_SESSIONS` for `max_sessions`.
    pub fn env_var(&self, id: &str) -> String {
        format!(
            "SPECMESH_{}_{}",
            self.name.to_uppercase(),
            id.to_uppercase().replace('-', "_")
        )
    }
}

/// Flags every service has; flatten into the service's `Args`.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct ServerArgs {
    /// Address to serve gRPC on (port 0: any free port, printed at startup).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Seconds running calls get to finish on SIGTERM/SIGINT; health turns
    /// NOT_SERVING at once.
    #[arg(long)]
    pub shutdown_grace_secs: u64,
    /// CPU cores to run on, e.g. `0`, `0-3`, `0,2` (default: every core).
    /// Compute threads then default to their number; see `--threads`.
    #[arg(long)]
    pub cpus: Option<crate::affinity::CpuList>,
    /// Address to serve Prometheus metrics on, over HTTP at `/metrics`
    /// (port 0: any free port, printed at startup); unset: no metrics.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Address to serve gRPC health alone on, in plaintext, for probes
    /// that cannot speak TLS (kubelet's gRPC probes); unset: none.
    #[arg(long)]
    pub health_listen: Option<SocketAddr>,
    /// How log lines are written to stderr: `text`, or `json` (one object
    /// per line with the request id, tenant and trace id of its request).
    #[arg(long, value_enum, default_value_t)]
    pub log_format: crate::telemetry::LogFormat,
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

impl ServerArgs {
    /// Applies `--cpus` to the process, if given: call first thing in
    /// `main`, before loading anything.
    pub fn pin(&self) -> anyhow::Result<()> {
        match &self.cpus {
            Some(cpus) => {
                cpus.apply()
                    .map_err(|e| anyhow::anyhow!("`--cpus {cpus}`: {e}"))?;
                tracing::info!(%cpus, "pinned to CPUs");
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// A flag's value outside its range; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("`--{flag}` must be >= {min}, got {value}")]
    TooSmall {
        flag: &'static str,
        min: usize,
        value: usize,
    },
    #[error("`--{flag}` must be <= {max}, got {value}")]
    TooLarge {
        flag: &'static str,
        max: usize,
        value: usize,
    },
}

/// `value` of `--flag`, if it is in `min..=max`.
pub fn in_range(
    flag: &'static str,
    value: usize,
    min: usize,
    max: usize,
) -> Result<usize, FlagError> {
    if value < min {
        return Err(FlagError::TooSmall { flag, min, value });
    }
    if value > max {
        return Err(FlagError::TooLarge { flag, max, value });
    }
    Ok(value)
}

/// `A`'s command with the service's defaults and an environment variable
/// for every flag.
pub fn command<A: CommandFactory>(service: &Service) -> clap::Command {
    let listen = leak(service.default_listen.to_string());
    let grace = leak(service.default_grace_secs.to_string());
    let mut cmd = A::command()
        .mut_arg("listen", |a| a.required(false).default_value(listen))
        .mut_arg("shutdown_grace_secs", |a| {
            a.required(false).default_value(grace)
        });
    let ids: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.get_long().is_some() && !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        let var = leak(service.env_var(&id));
        cmd = cmd.mut_arg(id, |a| a.env(var));
    }
    cmd
}

/// Parses the process's arguments (and environment); exits with clap's
/// message on bad input, as `Parser::parse` does.
pub fn parse<A: CommandFactory + FromArgMatches>(service: &Service) -> A {
    let matches = command::<A>(service).get_matches();
    A::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Parses `argv` (and the environment), for tests and embedders.
pub fn try_parse_from<A, I, T>(service: &Service, argv: I) -> Result<A, clap::Error>
where
    A: CommandFactory + FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command::<A>(service).try_get_matches_from(argv)?;
    A::from_arg_matches(&matches)
}

/// The service's flag reference as Markdown, from `A`'s command as the
/// service parses it (so the docs cannot drift from the binary): one row
/// per flag with its environment variable, default and help.
pub fn flags_markdown<A: CommandFactory>(service: &Service) -> String {
    let cmd = command::<A>(service);
    let mut out = format!(
        "# `{}` flags\n\n\
         Generated from the binary's flag definitions (`cargo test -p specmesh-{}` \
         checks it; `SPECMESH_WRITE_FLAGS=1 cargo test -p specmesh-{} flag_reference` \
         rewrites it). Every flag can also be set through its environment variable.\n\n\
         | flag | environment | default | what |\n|---|---|---|---|\n",
        service.binary(),
        service.name,
        service.name,
    );
    for a in cmd.get_arguments() {
        let Some(long) = a.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let takes_value = a.get_action().takes_values();
        let flag = match (takes_value, a.get_value_names()) {
            (true, Some(names)) if !names.is_empty() => format!("`--{long} {}`", names[0]),
            (true, _) => format!("`--{long} {}`", a.get_id().as_str().to_uppercase()),
            (false, _) => format!("`--{long}`"),
        };
        let env = a
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let default: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = match (takes_value, default.is_empty()) {
            (false, _) => "off".to_string(),
            (true, true) => "—".to_string(),
            (true, false) => format!("`{}`", default.join(",")),
        };
        let help = a
            .get_long_help()
            .or_else(|| a.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let help = help
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('|', "\\|");
        out.push_str(&format!("| {flag} | {env} | {default} | {help} |\n"));
    }
    out
}

/// Checks (or, with `SPECMESH_WRITE_FLAGS=1`, writes) a service's flag
/// reference file: for each service's test suite.
pub fn check_flags_file<A: CommandFactory>(service: &Service, path: &std::path::Path) {
    let want = flags_markdown::<A>(service);
    if std::env::var_os("SPECMESH_WRITE_FLAGS").is_some() {
        std::fs::write(path, &want).expect("writing the flag reference");
        return;
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "{} is out of date with the flags: regenerate it with \
         `SPECMESH_WRITE_FLAGS=1 cargo test -p specmesh-{} flag_reference`",
        path.display(),
        service.name
    );
}

/// Flag defaults and variable names live as long as the process; the
/// command is built once at startup (and a few times in tests).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: Service = Service {
        name: "widget",
        default_listen: "127.0.0.1:7",
        default_grace_secs: 9,
    };

    #[derive(clap::Parser, Debug)]
    struct Args {
        #[command(flatten)]
        server: ServerArgs,
        /// Something of the service's own.
        #[arg(long, default_value_t = 3)]
        max_things: usize,
    }

    #[test]
    fn defaults_come_from_the_service_and_every_flag_has_its_variable() {
        let a: Args = try_parse_from(&SVC, ["widget"]).unwrap();
        assert_eq!(a.server.listen, "127.0.0.1:7".parse().unwrap());
        assert_eq!(a.server.shutdown_grace_secs, 9);
        assert_eq!(a.max_things, 3);
        let cmd = command::<Args>(&SVC);
        let mut vars: Vec<_> = cmd
            .get_arguments()
            .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        vars.sort();
        assert_eq!(
            vars,
            [
                "SPECMESH_WIDGET_CPUS",
                "SPECMESH_WIDGET_HEALTH_LISTEN",
                "SPECMESH_WIDGET_LISTEN",
                "SPECMESH_WIDGET_LOG_FORMAT",
                "SPECMESH_WIDGET_MAX_THINGS",
                "SPECMESH_WIDGET_METRICS_LISTEN",
                "SPECMESH_WIDGET_PLAINTEXT",
                "SPECMESH_WIDGET_SHUTDOWN_GRACE_SECS",
                "SPECMESH_WIDGET_TLS_ALLOW_SAN",
                "SPECMESH_WIDGET_TLS_CA",
                "SPECMESH_WIDGET_TLS_CERT",
                "SPECMESH_WIDGET_TLS_KEY",
                "SPECMESH_WIDGET_TLS_RELOAD_MS",
            ]
        );
        let a: Args = try_parse_from(&SVC, ["widget", "--plaintext"]).unwrap();
        assert!(a.server.tls.plaintext);
        let err =
            try_parse_from::<Args, _, _>(&SVC, ["widget", "--tls-cert", "c.pem"]).unwrap_err();
        assert!(err.to_string().contains("--tls-key"), "{err}");
        let err = try_parse_from::<Args, _, _>(
            &SVC,
            [
                "widget",
                "--plaintext",
                "--tls-cert",
                "c",
                "--tls-key",
                "k",
                "--tls-ca",
                "a",
            ],
        )
        .unwrap_err();
        assert!(err.to_string().contains("cannot be used with"), "{err}");
        let err = try_parse_from::<Args, _, _>(&SVC, ["widget", "--max-things", "x"]).unwrap_err();
        assert!(err.to_string().contains("--max-things"), "{err}");
        let a: Args = try_parse_from(&SVC, ["widget", "--cpus", "0-1"]).unwrap();
        assert_eq!(a.server.cpus.unwrap().ids(), [0, 1]);
        let err = try_parse_from::<Args, _, _>(&SVC, ["widget", "--cpus", "1-0"]).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
    }
}
