//! What the deployment checks share (`tests/tests/deploy_*.rs`): rendering
//! the kustomize overlays, strict schema validation, and reading the
//! rendered documents.
//!
//! Tools: `promtool` (scripts/tools.sh), and `kubectl` (with kustomize;
//! `SPECMESH_KUBECTL` overrides it), `kubernetes-validate`, `hadolint` and
//! PyYAML from the Python environment of tests/python/requirements.txt
//! (`SPECMESH_TEST_PYTHON`; its tools are looked up next to the interpreter
//! or in `SPECMESH_TOOLS_BIN`). `scripts/check-deploy.sh` runs the same
//! checks from the shell. No specmesh binary is needed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub const K8S_VERSIONS: [&str; 2] = ["1.30.0", "1.35.0"];

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `SPECMESH_TEST_PYTHON`: an interpreter with PyYAML (scripts/python-env.sh).
pub fn python() -> String {
    std::env::var("SPECMESH_TEST_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/specmesh/venv-grpc/bin/python")
    })
}

/// A tool of the Python environment: in `SPECMESH_TOOLS_BIN`, else next to
/// the interpreter.
pub fn venv_tool(name: &str) -> PathBuf {
    let bin = std::env::var_os("SPECMESH_TOOLS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(python())
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        });
    bin.join(name)
}

/// Runs `cmd` in the repository root, feeding it `stdin`.
pub fn run(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .current_dir(repo())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e} (the tools are listed atop this file)"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    child.wait_with_output().unwrap()
}

/// The stdout of a command that must have succeeded.
pub fn succeed(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every overlay under deploy/k8s/overlays.
pub fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("deploy/k8s/overlays"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(
        names.len() >= 2,
        "expected the dev and production overlays, found {names:?}"
    );
    names
}

/// The Kubernetes versions an overlay is validated against: those of
/// [`K8S_VERSIONS`] at or above the minimum its kustomization states in a
/// `# minimum Kubernetes: 1.33` line (image volumes, say), else all.
pub fn k8s_versions(overlay: &str) -> Vec<&'static str> {
    let path = repo().join(format!("deploy/k8s/overlays/{overlay}/kustomization.yaml"));
    let text = std::fs::read_to_string(&path).unwrap();
    let minimum = text.lines().find_map(|l| {
        let v = l.trim().strip_prefix("# minimum Kubernetes:")?;
        let v = v.split_whitespace().next()?;
        let (major, minor) = v.split_once('.')?;
        Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?))
    });
    let version = |v: &str| -> (u32, u32) {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    };
    K8S_VERSIONS
        .iter()
        .copied()
        .filter(|v| minimum.is_none_or(|m| version(v) >= m))
        .collect()
}

/// `kubectl kustomize` of an overlay: its manifests as one YAML stream.
pub fn render(overlay: &str) -> String {
    kustomize(&format!("deploy/k8s/overlays/{overlay}"))
}

/// `kubectl kustomize` of a directory of the repository.
pub fn kustomize(dir: &str) -> String {
    let kubectl = std::env::var_os("SPECMESH_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| venv_tool("kubectl"));
    let out = run(Command::new(kubectl).args(["kustomize", dir]), None);
    succeed(&format!("kubectl kustomize {dir}"), out)
}

/// The self-signed bootstrap CA (applied apart from the overlays).
pub const MESH_CA: &str = "deploy/k8s/mesh-ca";

/// The documents of a YAML stream, through PyYAML.
pub fn documents(yaml: &str) -> Vec<Value> {
    const TO_JSON: &str = "import json, sys, yaml\njson.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)";
    let out = run(
        Command::new(python()).args(["-c", TO_JSON]),
        Some(yaml.as_bytes()),
    );
    let json = succeed("PyYAML (set SPECMESH_TEST_PYTHON)", out);
    match serde_json::from_str::<Value>(&json).unwrap() {
        Value::Array(docs) => docs,
        other => panic!("expected a list of documents, got {other}"),
    }
}

/// `kubernetes-validate --strict` of `manifests` against Kubernetes `version`.
pub fn validate(manifests: &str, version: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("manifests.yaml");
    std::fs::write(&file, manifests).unwrap();
    run(
        Command::new(venv_tool("kubernetes-validate"))
            .args(["--strict", "--quiet", "-k", version])
            .arg(&file),
        None,
    )
}

/// The `data` of the ConfigMap a container reads through `envFrom`.
pub fn config_of<'a>(docs: &'a [Value], container: &Value) -> &'a Value {
    let name = &container["envFrom"][0]["configMapRef"]["name"];
    let map = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == *name)
        .unwrap_or_else(|| panic!("no ConfigMap {name} for container {}", container["name"]));
    &map["data"]
}

pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The port named `grpc` of a container or Service.
pub fn grpc_port(ports: &Value, field: &str) -> u64 {
    port_named(ports, "grpc", field)
}

/// The port named `name` of a container or Service.
pub fn port_named(ports: &Value, name: &str, field: &str) -> u64 {
    let ports = ports.as_array().expect("ports");
    let port = ports
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("a port named {name}"));
    port[field].as_u64().unwrap()
}

/// The Deployments of the three services, by component (`gateway`,
/// `verifier`, `drafter`), each with its main container (an overlay may
/// run others beside them, an OpenTelemetry Collector say).
pub fn services(docs: &[Value]) -> Vec<(String, &Value, &Value)> {
    const SERVICES: [&str; 3] = ["gateway", "verifier", "drafter"];
    let found: Vec<(String, &Value, &Value)> = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .filter(|d| {
            d["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .is_some_and(|c| SERVICES.contains(&c))
        })
        .map(|d| {
            let component = d["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .expect("a component label")
                .to_string();
            (
                component,
                d,
                &d["spec"]["template"]["spec"]["containers"][0],
            )
        })
        .collect();
    let mut names: Vec<&str> = found.iter().map(|(c, _, _)| c.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["drafter", "gateway", "verifier"]);
    found
}

/// The prefix of a service's variables: `SPECMESH_VERIFIER_`.
pub fn prefix(component: &str) -> String {
    format!("SPECMESH_{}_", component.to_uppercase())
}

/// The setting `var` of a ConfigMap's data, if there.
pub fn setting<'a>(config: &'a Value, var: &str) -> Option<&'a str> {
    config[var].as_str()
}

/// The volume (of `deployment`) mounted in `container` at the directory
/// holding `path`, with its mount, if any.
pub fn mount_of<'a>(
    deployment: &'a Value,
    container: &'a Value,
    path: &str,
) -> Option<(&'a Value, &'a Value)> {
    let dir = Path::new(path).parent()?;
    let mount = container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(dir))?;
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])?;
    Some((volume, mount))
}

/// Documents as a YAML stream: JSON is YAML, one document per line.
pub fn stream(docs: &[Value]) -> String {
    docs.iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// `specmesh_*` metric names in `text`, histogram series as their base
/// (without `_bucket`, `_sum`, `_count`).
pub fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("specmesh_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.push(base.to_string());
        rest = &tail[end..];
    }
    names
}

/// The Rust sources of the service kit and the three services,
/// concatenated: where every metric is defined, as a quoted name.
pub fn service_sources() -> String {
    fn walk(dir: &Path, out: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = String::new();
    walk(&repo().join("crates/server/src"), &mut out);
    for service in std::fs::read_dir(repo().join("services"))
        .unwrap()
        .flatten()
    {
        walk(&service.path().join("src"), &mut out);
    }
    out
}
