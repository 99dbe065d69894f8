//! `specmesh-gateway`: parse flags, start telemetry, serve until SIGTERM or
//! SIGINT, then drain and exit 0.

use std::process::ExitCode;

use clap::Parser;
use specmesh_gateway::{Args, Config};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let _telemetry = specmesh_server::telemetry::init("specmesh-gateway");
    let result = match Config::try_from(args) {
        Ok(config) => specmesh_gateway::run(config, specmesh_server::shutdown::signal()).await,
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
