//! `specmesh-verifier`: parse flags (and their `SPECMESH_VERIFIER_*`
//! variables), start telemetry, serve until SIGTERM or SIGINT. Exits 0
//! after a graceful shutdown, 1 when it cannot start.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use specmesh_server::{cli, shutdown, telemetry};
use specmesh_verifier::{Args, Config, SERVICE};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Args = cli::parse(&SERVICE);
    let telemetry = telemetry::init("specmesh-verifier");
    let config = args
        .server
        .pin()
        .and_then(|()| Config::try_from(args).map_err(anyhow::Error::from));
    let served = match config {
        Ok(config) => specmesh_verifier::run(config, shutdown::signal()).await,
        Err(e) => Err(e),
    };
    let code = specmesh_server::exit_code(&SERVICE, served);
    // Flushes the spans before exit.
    drop(telemetry);
    code
}
