//! The gRPC contracts, checked by buf (proto/buf.yaml): `buf lint` passes,
//! and `buf breaking` against the baseline recorded in the repository
//! (proto/baseline.json, the contracts of the last release) finds nothing a
//! rolling update could trip on; a change that would break a client of the
//! baseline is caught (docs/operations.md, "Upgrades and version skew").

use std::process::Command;

use specmesh_e2e::deploy::{repo, run, succeed, venv_tool};

fn buf() -> Command {
    Command::new(venv_tool("buf"))
}

#[test]
fn the_contracts_pass_buf_lint() {
    let out = run(buf().args(["lint", "proto"]), None);
    succeed("buf lint proto (scripts/python-env.sh installs buf)", out);
}

#[test]
fn the_contracts_keep_what_the_baseline_promised() {
    let out = run(
        buf().args(["breaking", "proto", "--against", "proto/baseline.json"]),
        None,
    );
    succeed(
        "buf breaking proto --against proto/baseline.json (a change old binaries \
         cannot read: add a field instead of changing one)",
        out,
    );
}

#[test]
fn a_breaking_change_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("proto");
    let status = Command::new("cp")
        .arg("-R")
        .arg(repo().join("proto"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let gateway = copy.join("specmesh/v1/gateway.proto");
    let text = std::fs::read_to_string(&gateway).unwrap();
    assert!(text.contains("uint32 max_new_tokens = "), "the field moved");
    // A renamed field: the same on the wire, not in JSON.
    std::fs::write(
        &gateway,
        text.replacen(
            "uint32 max_new_tokens = ",
            "uint32 max_tokens_renamed = ",
            1,
        ),
    )
    .unwrap();
    let out = run(
        buf()
            .arg("breaking")
            .arg(&copy)
            .arg("--against")
            .arg(repo().join("proto/baseline.json")),
        None,
    );
    assert!(!out.status.success(), "buf breaking passed a renamed field");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("max_new_tokens"), "{said}");
}
