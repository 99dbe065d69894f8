//! The crate layering written down in `docs/layering.md`, checked against
//! what `cargo metadata` says the workspace's crates depend on: every
//! crate has a row, every normal or build dependency on another workspace
//! crate is one its row allows, and a row allows only crates on lower
//! floors (so there is no cycle and no dependency goes up).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A crate's floor and the crates it may depend on.
type Layering = BTreeMap<String, (u32, BTreeSet<String>)>;

/// Each workspace crate's dependencies on other workspace crates (dev
/// dependencies left out).
type Dependencies = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The table of `docs/layering.md`: rows `| FLOOR | `crate` | `a`, `b` |`.
fn layering() -> Layering {
    let path = workspace().join("docs/layering.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|n| n.trim().trim_matches('`').to_string())
            .filter(|n| !n.is_empty())
            .collect()
    };
    let mut out = Layering::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let [floor, name, allowed] = cells[..] else {
            continue;
        };
        let Ok(floor) = floor.trim().parse::<u32>() else {
            continue;
        };
        let name = name.trim().trim_matches('`').to_string();
        assert!(
            out.insert(name.clone(), (floor, names(allowed))).is_none(),
            "docs/layering.md lists `{name}` twice"
        );
    }
    assert!(
        out.len() > 10,
        "no layering table found in docs/layering.md"
    );
    out
}

/// What `cargo metadata` says each workspace crate depends on.
fn dependencies() -> Dependencies {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace())
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let short = |name: &str| name.strip_prefix("specmesh-").unwrap_or(name).to_string();
    let packages = meta["packages"].as_array().unwrap();
    let members: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap())
                .filter(|d| members.contains(*d))
                .map(short)
                .collect();
            (short(p["name"].as_str().unwrap()), deps)
        })
        .collect()
}

/// Every way `deps` breaks `layering`, one line each.
fn violations(layering: &Layering, deps: &Dependencies) -> Vec<String> {
    let mut out = Vec::new();
    for (name, (floor, allowed)) in layering {
        if !deps.contains_key(name) {
            out.push(format!("`{name}` has a row but is not a workspace crate"));
        }
        for a in allowed {
            match layering.get(a) {
                None => out.push(format!("`{name}` may depend on `{a}`, which has no row")),
                Some((f, _)) if f >= floor => out.push(format!(
                    "`{name}` (floor {floor}) may depend on `{a}` (floor {f}): not a lower floor"
                )),
                Some(_) => {}
            }
        }
    }
    for (name, used) in deps {
        let Some((_, allowed)) = layering.get(name) else {
            out.push(format!("`{name}` has no row in docs/layering.md"));
            continue;
        };
        for d in used.difference(allowed) {
            out.push(format!(
                "`{name}` depends on `{d}`, which docs/layering.md does not allow"
            ));
        }
    }
    out
}

#[test]
fn every_crate_depends_only_on_what_its_floor_allows() {
    let found = violations(&layering(), &dependencies());
    assert!(
        found.is_empty(),
        "the crate layering drifted (fix the dependency, or change docs/layering.md \
         on purpose):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_forbidden_dependency_is_caught() {
    let layering = layering();
    let mut deps = dependencies();
    // The wire contracts importing the speculation core: refused.
    deps.get_mut("proto").unwrap().insert("draft".into());
    // A core reaching up to the service kit: refused.
    deps.get_mut("tree").unwrap().insert("server".into());
    assert_eq!(
        violations(&layering, &deps),
        [
            "`proto` depends on `draft`, which docs/layering.md does not allow",
            "`tree` depends on `server`, which docs/layering.md does not allow",
        ]
    );
    // And a row that would let a floor reach up.
    let mut upward = layering.clone();
    upward.get_mut("tree").unwrap().1.insert("server".into());
    assert_eq!(
        violations(&upward, &dependencies()),
        ["`tree` (floor 0) may depend on `server` (floor 5): not a lower floor"]
    );
}
