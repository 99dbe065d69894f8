//! `specmesh-verifier`: see the crate docs.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = specmesh_server::telemetry::init("specmesh-verifier");
    let config = specmesh_verifier::Config::try_from(specmesh_verifier::Args::parse())?;
    specmesh_verifier::run(config, specmesh_server::shutdown::signal()).await
}
