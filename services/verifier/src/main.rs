//! `specmesh-verifier`: the service kit runs the whole process (flags and
//! their `SPECMESH_VERIFIER_*` variables, telemetry, serving, drain).

fn main() -> std::process::ExitCode {
    specmesh_server::main::<specmesh_verifier::Verifier>()
}
