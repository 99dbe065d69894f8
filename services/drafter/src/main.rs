//! `specmesh-drafter`: parse flags, start telemetry, serve until SIGTERM or
//! SIGINT. Exits 0 after a graceful shutdown, 1 when it cannot start.

use std::process::ExitCode;

use clap::Parser;
use specmesh_drafter::{Args, Config};
use specmesh_server::{shutdown, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let telemetry = telemetry::init("specmesh-drafter");
    let served = match Config::try_from(args) {
        Ok(config) => specmesh_drafter::run(config, shutdown::signal()).await,
        Err(e) => Err(e.into()),
    };
    let code = match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // The whole cause chain on one line, for logs and for humans.
            tracing::error!(error = format!("{error:#}"), "drafter failed");
            eprintln!("specmesh-drafter: {error:#}");
            ExitCode::FAILURE
        }
    };
    // Flushes the spans before exit.
    drop(telemetry);
    code
}
