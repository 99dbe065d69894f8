//! `specmesh-drafter`: the service kit runs the whole process (flags and
//! their `SPECMESH_DRAFTER_*` variables, telemetry, serving, drain).

fn main() -> std::process::ExitCode {
    specmesh_server::main::<specmesh_drafter::Drafter>()
}
