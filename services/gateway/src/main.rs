//! `specmesh-gateway`: parse flags (and their `SPECMESH_GATEWAY_*`
//! variables), start telemetry, serve until SIGTERM or SIGINT. Exits 0
//! after a graceful shutdown, 1 when it cannot start.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use specmesh_gateway::{Args, Config, SERVICE};
use specmesh_server::{cli, shutdown, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Args = cli::parse(&SERVICE);
    let telemetry = telemetry::init("specmesh-gateway");
    let config = args
        .server
        .pin()
        .and_then(|()| Config::try_from(args).map_err(anyhow::Error::from));
    let served = match config {
        Ok(config) => specmesh_gateway::run(config, shutdown::signal()).await,
        Err(e) => Err(e),
    };
    let code = specmesh_server::exit_code(&SERVICE, served);
    // Flushes the spans before exit.
    drop(telemetry);
    code
}
