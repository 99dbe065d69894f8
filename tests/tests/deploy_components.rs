//! The components a platform team's cluster plugs into, as the `platform`
//! overlay renders them (deploy/k8s/overlays/platform), checked without a
//! cluster: the prometheus-operator objects are generated from the rule
//! file and the dashboard (and fail when they drift), the PrometheusRule
//! passes promtool's check and the rule unit tests, the PodMonitors scrape
//! what the scrape configuration does with the same labels, KEDA replaces
//! production's autoscalers and queries the overlay's namespace, the custom
//! resources use only fields their CRDs define, every query names a metric
//! the services define, and the services export their spans to the
//! OpenTelemetry Collector the NetworkPolicies let them reach.

use std::process::Command;

use serde_json::Value;
use specmesh_e2e::deploy::*;

const PLATFORM: &str = "platform";

fn platform() -> Vec<Value> {
    documents(&render(PLATFORM))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// Fails unless every key of `object` is in `fields` (comma-separated, as
/// the CRD spells them).
fn known(what: &str, object: &Value, fields: &str) {
    let object = object
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object"));
    for key in object.keys() {
        assert!(
            fields.split(',').any(|f| f.trim() == key),
            "{what}: unknown field {key}"
        );
    }
}

fn assert_defined(what: &str, text: &str, sources: &str) {
    let names = metric_names(text);
    assert!(!names.is_empty(), "{what} names no specmesh metric");
    for name in names {
        assert!(
            sources.contains(&format!("\"{name}\"")),
            "{what}: {name} is not defined by any service"
        );
    }
}

#[test]
fn operator_objects_are_generated_from_their_sources() {
    let out = run(
        Command::new(python())
            .arg(repo().join("tools/deploy/operator_objects.py"))
            .arg("--check"),
        None,
    );
    succeed(
        "tools/deploy/operator_objects.py --check (run it without --check to regenerate)",
        out,
    );
    // And the check fails on drift: a changed copy is reported.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("repo");
    for sub in ["tools/deploy", "deploy/prometheus", "deploy/grafana"] {
        std::fs::create_dir_all(copy.join(sub)).unwrap();
    }
    std::fs::create_dir_all(copy.join("deploy/k8s/components/prometheus-operator")).unwrap();
    for file in [
        "tools/deploy/operator_objects.py",
        "deploy/prometheus/alerts.yml",
        "deploy/grafana/specmesh-dashboard.json",
        "deploy/k8s/components/prometheus-operator/prometheusrule.yaml",
        "deploy/k8s/components/prometheus-operator/grafana-dashboard.yaml",
    ] {
        std::fs::copy(repo().join(file), copy.join(file)).unwrap();
    }
    let alerts = copy.join("deploy/prometheus/alerts.yml");
    let text = std::fs::read_to_string(&alerts).unwrap();
    std::fs::write(&alerts, text.replace("for: 15m", "for: 20m")).unwrap();
    let out = run(
        Command::new(python())
            .arg(copy.join("tools/deploy/operator_objects.py"))
            .arg("--check"),
        None,
    );
    assert!(!out.status.success(), "a drifted rule passed the check");
    assert!(String::from_utf8_lossy(&out.stdout).contains("for: 20m"));
}

#[test]
fn the_prometheus_rule_passes_promtool_and_the_rule_tests() {
    let docs = platform();
    let rules = of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    let rule = rules[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    known("PrometheusRule", &rule["spec"], "groups");
    // The spec is a rule file: check it and run the unit tests on it, as
    // Prometheus would load it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alerts.yml"), rule["spec"].to_string()).unwrap();
    std::fs::copy(
        repo().join("deploy/prometheus/alerts_test.yml"),
        dir.path().join("alerts_test.yml"),
    )
    .unwrap();
    let check = run(
        Command::new("promtool")
            .args(["check", "rules"])
            .arg(dir.path().join("alerts.yml")),
        None,
    );
    let said = succeed("promtool check rules (the PrometheusRule's spec)", check);
    assert!(said.contains("SUCCESS"), "{said}");
    // The test file names `alerts.yml` beside itself: the copy's.
    let test = run(
        Command::new("promtool")
            .args(["test", "rules"])
            .arg(dir.path().join("alerts_test.yml")),
        None,
    );
    let said = succeed("promtool test rules (the PrometheusRule's spec)", test);
    assert!(said.contains("SUCCESS"), "{said}");
}

#[test]
fn pod_monitors_scrape_each_service_with_the_scrape_configs_labels() {
    let docs = platform();
    let monitors = of_kind(&docs, "PodMonitor");
    for (component, deployment, container) in services(&docs) {
        let labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let monitor = monitors
            .iter()
            .find(|m| {
                let want = m["spec"]["selector"]["matchLabels"].as_object().unwrap();
                want.iter().all(|(k, v)| labels[k] == *v)
            })
            .unwrap_or_else(|| panic!("no PodMonitor selects the {component} pods"));
        assert_eq!(
            monitor["metadata"]["namespace"], deployment["metadata"]["namespace"],
            "{component}"
        );
        let endpoints = monitor["spec"]["podMetricsEndpoints"].as_array().unwrap();
        assert_eq!(endpoints.len(), 1);
        let endpoint = &endpoints[0];
        let port = endpoint["port"].as_str().unwrap();
        assert_eq!(
            port_named(&container["ports"], port, "containerPort"),
            9090,
            "{component}: the metrics port"
        );
        assert_eq!(endpoint["path"], "/metrics");
        // job="specmesh", component and node, as deploy/prometheus/prometheus.yml
        // relabels (the operator adds namespace and pod itself).
        let relabel = endpoint["relabelings"].as_array().unwrap();
        let sets = |target: &str| -> Vec<&Value> {
            relabel
                .iter()
                .filter(|r| r["targetLabel"] == target)
                .collect()
        };
        assert_eq!(sets("job")[0]["replacement"], "specmesh", "{component}");
        assert_eq!(
            sets("component")[0]["sourceLabels"][0],
            "__meta_kubernetes_pod_label_app_kubernetes_io_component"
        );
        assert_eq!(
            sets("node")[0]["sourceLabels"][0],
            "__meta_kubernetes_pod_node_name"
        );
    }
    let scrape = std::fs::read_to_string(repo().join("deploy/prometheus/prometheus.yml")).unwrap();
    for label in ["target_label: component", "target_label: node"] {
        assert!(
            scrape.contains(label),
            "prometheus.yml no longer sets {label}"
        );
    }
}

#[test]
fn the_dashboard_config_map_is_the_dashboard_for_grafanas_sidecar() {
    let docs = platform();
    let map = find(&docs, "ConfigMap", "specmesh-grafana-dashboard");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let inside: Value =
        serde_json::from_str(map["data"]["specmesh-dashboard.json"].as_str().unwrap()).unwrap();
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/specmesh-dashboard.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(inside, file);
}

#[test]
fn keda_scales_the_three_services_in_place_of_the_hpas() {
    let docs = platform();
    assert!(
        of_kind(&docs, "HorizontalPodAutoscaler").is_empty(),
        "KEDA makes the HPAs; production's must be gone"
    );
    let sources = service_sources();
    let objects = of_kind(&docs, "ScaledObject");
    for (component, deployment, _) in services(&docs) {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let namespace = deployment["metadata"]["namespace"].as_str().unwrap();
        let scaled = objects
            .iter()
            .find(|s| s["spec"]["scaleTargetRef"]["name"] == name)
            .unwrap_or_else(|| panic!("no ScaledObject scales {name}"));
        assert_eq!(scaled["metadata"]["namespace"], namespace);
        let spec = &scaled["spec"];
        assert!(
            spec["minReplicaCount"].as_u64().unwrap() >= 2,
            "{component}: at least two, for rolling updates and pod loss"
        );
        assert!(spec["maxReplicaCount"].as_u64() > spec["minReplicaCount"].as_u64());
        let triggers = spec["triggers"].as_array().unwrap();
        let prometheus: Vec<&Value> = triggers
            .iter()
            .filter(|t| t["type"] == "prometheus")
            .collect();
        assert!(!prometheus.is_empty(), "{component}: no Prometheus trigger");
        for t in prometheus {
            let query = t["metadata"]["query"].as_str().unwrap();
            assert!(
                query.contains(&format!("namespace=\"{namespace}\"")),
                "{component}: the query reads another namespace: {query}"
            );
            assert!(
                t["metadata"]["threshold"]
                    .as_str()
                    .unwrap()
                    .parse::<f64>()
                    .unwrap()
                    > 0.0
            );
            assert_defined(&format!("{component}'s ScaledObject"), query, &sources);
        }
    }
    // The verifiers scale on KV use and on requests refused for want of it.
    let verifier = objects
        .iter()
        .find(|s| s["spec"]["scaleTargetRef"]["name"] == "specmesh-verifier")
        .unwrap();
    let queries = verifier["spec"]["triggers"].to_string();
    assert!(
        queries.contains("specmesh_kv_cache_usage_perc"),
        "{queries}"
    );
    assert!(
        queries.contains("reason=\\\"verifiers_full\\\""),
        "{queries}"
    );
}

#[test]
fn operator_and_keda_objects_use_known_fields() {
    const POD_MONITOR_SPEC: &str = "attachMetadata, bodySizeLimit, convertClassicHistogramsToNHCB, \
        fallbackScrapeProtocol, jobLabel, keepDroppedTargets, labelLimit, labelNameLengthLimit, \
        labelValueLengthLimit, namespaceSelector, nativeHistogramBucketLimit, \
        nativeHistogramMinBucketFactor, podMetricsEndpoints, podTargetLabels, sampleLimit, \
        scrapeClass, scrapeClassicHistograms, scrapeProtocols, selector, selectorMechanism, \
        targetLimit";
    const POD_METRICS_ENDPOINT: &str = "authorization, basicAuth, bearerTokenSecret, enableHttp2, \
        filterRunning, followRedirects, honorLabels, honorTimestamps, interval, \
        metricRelabelings, noProxy, oauth2, params, path, port, portNumber, proxyConnectHeader, \
        proxyFromEnvironment, proxyUrl, relabelings, scheme, scrapeTimeout, targetPort, \
        tlsConfig, trackTimestampsStaleness";
    const RELABEL: &str =
        "action, modulus, regex, replacement, separator, sourceLabels, targetLabel";
    const RULE_GROUP: &str = "interval, labels, limit, name, partial_response_strategy, \
        query_offset, rules";
    const RULE: &str = "alert, annotations, expr, for, keep_firing_for, labels, record";
    const SCALED_OBJECT_SPEC: &str = "advanced, cooldownPeriod, fallback, idleReplicaCount, \
        initialCooldownPeriod, maxReplicaCount, minReplicaCount, pollingInterval, \
        scaleTargetRef, triggers";
    const SCALE_TARGET: &str = "apiVersion, envSourceContainerName, kind, name";
    const ADVANCED: &str = "horizontalPodAutoscalerConfig, restoreToOriginalReplicaCount, \
        scalingModifiers";
    const HPA_CONFIG: &str = "behavior, name";
    const TRIGGER: &str = "authenticationRef, metadata, metricType, name, type, useCachedMetrics";
    const PROMETHEUS_TRIGGER: &str = "activationThreshold, authModes, customHeaders, \
        ignoreNullValues, namespace, query, queryParameters, serverAddress, threshold, \
        timeout, unsafeSsl";
    const CPU_TRIGGER: &str = "containerName, value";
    let docs = platform();
    let mut seen = 0;
    for d in &docs {
        let what = format!("{} {}", d["kind"], d["metadata"]["name"]);
        let spec = &d["spec"];
        match d["kind"].as_str().unwrap() {
            "PodMonitor" => {
                assert_eq!(d["apiVersion"], "monitoring.coreos.com/v1", "{what}");
                known(&what, spec, POD_MONITOR_SPEC);
                for e in spec["podMetricsEndpoints"].as_array().unwrap() {
                    known(&format!("{what} endpoint"), e, POD_METRICS_ENDPOINT);
                    for r in e["relabelings"].as_array().unwrap() {
                        known(&format!("{what} relabeling"), r, RELABEL);
                    }
                }
            }
            "PrometheusRule" => {
                assert_eq!(d["apiVersion"], "monitoring.coreos.com/v1", "{what}");
                for g in spec["groups"].as_array().unwrap() {
                    known(&format!("{what} group"), g, RULE_GROUP);
                    for r in g["rules"].as_array().unwrap() {
                        known(&format!("{what} rule"), r, RULE);
                    }
                }
            }
            "ScaledObject" => {
                assert_eq!(d["apiVersion"], "keda.sh/v1alpha1", "{what}");
                known(&what, spec, SCALED_OBJECT_SPEC);
                known(
                    &format!("{what} target"),
                    &spec["scaleTargetRef"],
                    SCALE_TARGET,
                );
                if !spec["advanced"].is_null() {
                    known(&format!("{what} advanced"), &spec["advanced"], ADVANCED);
                    known(
                        &format!("{what} hpa config"),
                        &spec["advanced"]["horizontalPodAutoscalerConfig"],
                        HPA_CONFIG,
                    );
                }
                for t in spec["triggers"].as_array().unwrap() {
                    known(&format!("{what} trigger"), t, TRIGGER);
                    let fields = match t["type"].as_str().unwrap() {
                        "prometheus" => PROMETHEUS_TRIGGER,
                        "cpu" => CPU_TRIGGER,
                        other => panic!("{what}: trigger type {other} not checked here"),
                    };
                    known(
                        &format!("{what} {} trigger", t["type"]),
                        &t["metadata"],
                        fields,
                    );
                    assert!(
                        ["Value", "AverageValue", "Utilization"]
                            .contains(&t["metricType"].as_str().unwrap()),
                        "{what}"
                    );
                }
            }
            _ => continue,
        }
        seen += 1;
    }
    assert_eq!(
        seen,
        3 + 1 + 3,
        "three PodMonitors, a PrometheusRule, three ScaledObjects"
    );
}

#[test]
fn the_adapter_values_name_defined_metrics() {
    let values = std::fs::read_to_string(
        repo().join("deploy/k8s/components/prometheus-operator/prometheus-adapter-values.yaml"),
    )
    .unwrap();
    let parsed = documents(&values);
    let rules = parsed[0]["rules"]["custom"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    assert_defined("the adapter's rules", &values, &service_sources());
    // The metrics the production HPA of the verifiers asks for.
    let hpa =
        std::fs::read_to_string(repo().join("deploy/k8s/overlays/production/hpa.yaml")).unwrap();
    for rule in rules {
        let name = rule["name"]["as"].as_str().unwrap();
        assert!(
            hpa.contains(&format!("name: {name}")),
            "the HPA does not use {name}"
        );
    }
}

#[test]
fn services_export_spans_to_the_collector_they_may_reach() {
    let docs = platform();
    let service = find(&docs, "Service", "specmesh-otel-collector");
    let ports: Vec<u64> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_u64().unwrap())
        .collect();
    assert!(ports.contains(&4317), "{ports:?}");
    let collector = docs
        .iter()
        .find(|d| {
            d["kind"] == "Deployment"
                && d["metadata"]["labels"]["app.kubernetes.io/component"] == "otel-collector"
        })
        .expect("the collector's Deployment");
    let selector = service["spec"]["selector"].as_object().unwrap();
    let labels = &collector["spec"]["template"]["metadata"]["labels"];
    assert!(selector.iter().all(|(k, v)| labels[k] == *v));
    let policies = of_kind(&docs, "NetworkPolicy");
    for (component, deployment, container) in services(&docs) {
        let config = config_of(&docs, container);
        assert_eq!(
            setting(config, "OTEL_EXPORTER_OTLP_ENDPOINT"),
            Some("http://specmesh-otel-collector:4317"),
            "{component}"
        );
        assert_eq!(
            setting(config, &format!("{}LOG_FORMAT", prefix(&component))),
            Some("json"),
            "{component}"
        );
        // Some policy that selects this pod lets it reach the collector on
        // 4317.
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let selects = |p: &Value| {
            let sel = &p["spec"]["podSelector"];
            let labels_ok = sel["matchLabels"]
                .as_object()
                .is_none_or(|m| m.iter().all(|(k, v)| pod_labels[k] == *v));
            let exprs_ok = sel["matchExpressions"].as_array().is_none_or(|es| {
                es.iter().all(|e| {
                    e["operator"] == "In"
                        && e["values"]
                            .as_array()
                            .unwrap()
                            .contains(&pod_labels[e["key"].as_str().unwrap()])
                })
            });
            labels_ok && exprs_ok
        };
        let reaches = policies.iter().filter(|p| selects(p)).any(|p| {
            p["spec"]["egress"].as_array().is_some_and(|rules| {
                rules.iter().any(|r| {
                    let to_collector = r["to"].as_array().is_some_and(|to| {
                        to.iter().any(|t| {
                            t["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                                == "otel-collector"
                        })
                    });
                    let on_4317 = r["ports"]
                        .as_array()
                        .is_some_and(|ps| ps.iter().any(|p| p["port"] == 4317));
                    to_collector && on_4317
                })
            })
        });
        assert!(
            reaches,
            "{component}: no NetworkPolicy lets it reach the collector"
        );
    }
    // The collector admits them.
    let policy = find(&docs, "NetworkPolicy", "specmesh-otel-collector");
    let ingress = policy["spec"]["ingress"].to_string();
    assert!(ingress.contains("4317"), "{ingress}");
}
