//! Compiles `proto/specmesh/v1/*.proto` with protox (a protobuf compiler in
//! Rust), so building needs no `protoc` on the machine, and keeps the
//! descriptor set for gRPC server reflection.

use std::path::PathBuf;

use protox::prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "gateway.proto",
        "verifier.proto",
        "drafter.proto",
        "common.proto",
        "peers.proto",
        "kv.proto",
    ]
    .map(|f| root.join("specmesh/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("specmesh_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
