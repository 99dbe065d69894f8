//! `specmesh-gateway`: the service kit runs the whole process (flags and
//! their `SPECMESH_GATEWAY_*` variables, telemetry, serving, drain).

fn main() -> std::process::ExitCode {
    specmesh_server::main::<specmesh_gateway::Gateway>()
}
