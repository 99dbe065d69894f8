//! The deployment's transport and authentication, checked on the rendered
//! manifests: every service is given exactly one transport (TLS files or
//! plaintext), production runs mutual TLS from cert-manager certificates
//! (whose fields kubernetes-validate cannot check, so they are checked here
//! against cert-manager.io/v1) and API keys at the gateway, dev runs
//! plaintext without cert-manager, the bootstrap CA feeds the production
//! issuer, and no NetworkPolicy opens the plaintext health port. The tools
//! are listed in `specmesh_e2e::deploy`.

use std::path::Path;

use serde_json::Value;
use specmesh_e2e::deploy::*;

/// Each service is started either with TLS files or with `--plaintext`:
/// with neither it refuses to start, with both clap rejects the conflict
/// (even with `SPECMESH_<S>_PLAINTEXT=false`: a variable that is set
/// counts as given; and `true`/`false` are the only values it takes).
#[test]
fn every_service_has_exactly_one_transport() {
    for overlay in overlays() {
        let docs = documents(&render(&overlay));
        for (component, _, container) in services(&docs) {
            let config = config_of(&docs, container);
            let p = prefix(&component);
            let plaintext = setting(config, &format!("{p}PLAINTEXT"));
            assert!(
                plaintext.is_none() || plaintext == Some("true"),
                "{overlay}/{component}: {p}PLAINTEXT={plaintext:?}: `true`, or leave it out"
            );
            let files: Vec<Option<&str>> = ["TLS_CERT", "TLS_KEY", "TLS_CA"]
                .iter()
                .map(|f| setting(config, &format!("{p}{f}")))
                .collect();
            let tls = files.iter().all(Option::is_some);
            assert!(
                tls || files.iter().all(Option::is_none),
                "{overlay}/{component}: some TLS files but not all: {files:?}"
            );
            assert!(
                tls != plaintext.is_some(),
                "{overlay}/{component}: TLS files {tls}, plaintext {plaintext:?}: exactly one"
            );
            if plaintext.is_some() {
                let tls_settings: Vec<&String> = config
                    .as_object()
                    .unwrap()
                    .keys()
                    .filter(|k| k.starts_with(&format!("{p}TLS_")))
                    .collect();
                assert!(
                    tls_settings.is_empty(),
                    "{overlay}/{component}: plaintext with {tls_settings:?}"
                );
            }
        }
    }
}

/// Production: mutual TLS on every hop from cert-manager certificates
/// mounted read-only (and refreshable: no subPath), each peer named the way
/// the other's certificate names it, and API keys at the gateway.
#[test]
fn production_runs_mutual_tls_and_api_keys() {
    let docs = documents(&render("production"));
    let issuer = docs
        .iter()
        .find(|d| d["apiVersion"] == "cert-manager.io/v1" && d["kind"] == "Issuer")
        .expect("a cert-manager Issuer");
    assert_eq!(
        issuer["spec"]["ca"]["secretName"], "specmesh-mesh-ca",
        "a CA Issuer signing with the Secret specmesh-mesh-ca"
    );
    let certificate_of = |secret: &str| {
        docs.iter()
            .find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == secret)
            .unwrap_or_else(|| panic!("no Certificate writes the Secret {secret}"))
    };
    let mut dns_names = std::collections::HashMap::new();
    for (component, deployment, container) in services(&docs) {
        let name = format!("production/{component}");
        let config = config_of(&docs, container);
        let p = prefix(&component);
        assert_eq!(setting(config, &format!("{p}PLAINTEXT")), None, "{name}");
        // The three files, named as cert-manager writes them, from one
        // Secret mounted read-only as a directory.
        let secret = format!("specmesh-{component}-tls");
        for (flag, file) in [
            ("TLS_CERT", "tls.crt"),
            ("TLS_KEY", "tls.key"),
            ("TLS_CA", "ca.crt"),
        ] {
            let path = setting(config, &format!("{p}{flag}"))
                .unwrap_or_else(|| panic!("{name}: no {p}{flag}"));
            assert!(
                path.ends_with(&format!("/{file}")),
                "{name}: {p}{flag}={path}"
            );
            let (volume, mount) = mount_of(deployment, container, path)
                .unwrap_or_else(|| panic!("{name}: {path} is on no volume"));
            assert_eq!(
                volume["secret"]["secretName"],
                secret.as_str(),
                "{name}: {path}"
            );
            assert_eq!(mount["readOnly"], true, "{name}: {path}");
            assert!(
                mount["subPath"].is_null(),
                "{name}: a subPath mount is never refreshed"
            );
        }
        let certificate = certificate_of(&secret);
        let spec = &certificate["spec"];
        assert_eq!(
            spec["issuerRef"]["name"], issuer["metadata"]["name"],
            "{name}"
        );
        assert_eq!(spec["issuerRef"]["kind"], "Issuer", "{name}");
        let service = format!("specmesh-{component}");
        let ns = deployment["metadata"]["namespace"]
            .as_str()
            .expect("a namespace");
        assert_eq!(certificate["metadata"]["namespace"], ns, "{name}");
        let names: Vec<&str> = spec["dnsNames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for want in [
            service.clone(),
            format!("{service}.{ns}.svc"),
            format!("{service}.{ns}.svc.cluster.local"),
        ] {
            assert!(
                names.contains(&want.as_str()),
                "{name}: {want} not in {names:?}"
            );
        }
        let usages = spec["usages"].as_array().unwrap();
        for usage in ["server auth", "client auth"] {
            assert!(
                usages.contains(&Value::from(usage)),
                "{name}: usage {usage}"
            );
        }
        let (lifetime, renew) = (
            hours(&spec["duration"], &name),
            hours(&spec["renewBefore"], &name),
        );
        assert!(
            renew < lifetime,
            "{name}: renewBefore {renew}h >= duration {lifetime}h"
        );
        dns_names.insert(
            component.clone(),
            names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        );
    }
    // Who admits whom, and the names the callers expect, are names the
    // other side's certificate carries.
    let carries = |component: &str, value: Option<&str>, what: &str| {
        let value = value.unwrap_or_else(|| panic!("no {what}"));
        for name in value.split(',') {
            assert!(
                dns_names[component].contains(&name.to_string()),
                "{what}={value}: {name} is not a name of the {component}'s certificate"
            );
        }
    };
    let config = |component: &str| {
        let deployment = find(&docs, "Deployment", &format!("specmesh-{component}"));
        config_of(
            &docs,
            &deployment["spec"]["template"]["spec"]["containers"][0],
        )
    };
    let (gateway, verifier, drafter) = (config("gateway"), config("verifier"), config("drafter"));
    for (value, what, owner) in [
        (
            setting(verifier, "SPECMESH_VERIFIER_TLS_ALLOW_SAN"),
            "SPECMESH_VERIFIER_TLS_ALLOW_SAN",
            "gateway",
        ),
        (
            setting(drafter, "SPECMESH_DRAFTER_TLS_ALLOW_SAN"),
            "SPECMESH_DRAFTER_TLS_ALLOW_SAN",
            "verifier",
        ),
        (
            setting(drafter, "SPECMESH_DRAFTER_KV_EVENTS_ALLOW_SAN"),
            "SPECMESH_DRAFTER_KV_EVENTS_ALLOW_SAN",
            "gateway",
        ),
        (
            setting(verifier, "SPECMESH_VERIFIER_DRAFTER_TLS_NAME"),
            "SPECMESH_VERIFIER_DRAFTER_TLS_NAME",
            "drafter",
        ),
        (
            setting(gateway, "SPECMESH_GATEWAY_VERIFIER_TLS_NAME"),
            "SPECMESH_GATEWAY_VERIFIER_TLS_NAME",
            "verifier",
        ),
        (
            setting(gateway, "SPECMESH_GATEWAY_DRAFTER_TLS_NAME"),
            "SPECMESH_GATEWAY_DRAFTER_TLS_NAME",
            "drafter",
        ),
    ] {
        carries(owner, value, what);
    }
    // The gateway admits only callers with a key from the Secret.
    let deployment = find(&docs, "Deployment", "specmesh-gateway");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let path = setting(gateway, "SPECMESH_GATEWAY_API_KEYS").expect("the gateway reads API keys");
    let (volume, mount) =
        mount_of(deployment, container, path).unwrap_or_else(|| panic!("{path} is on no volume"));
    assert_eq!(volume["secret"]["secretName"], "specmesh-api-keys");
    assert_eq!(mount["readOnly"], true);
    assert!(
        mount["subPath"].is_null(),
        "a subPath mount is never refreshed"
    );
    let file = Path::new(path).file_name().unwrap().to_str().unwrap();
    let items = volume["secret"]["items"].as_array();
    assert!(
        items.is_none_or(|items| items
            .iter()
            .any(|i| i["key"] == "api-keys" && i["path"] == file)),
        "{path}: the Secret's key `api-keys`"
    );
    // The gRPC ports speak TLS: no cleartext-HTTP/2 hint for ingresses.
    for service in docs.iter().filter(|d| d["kind"] == "Service") {
        for port in service["spec"]["ports"].as_array().unwrap() {
            assert_ne!(
                port["appProtocol"], "kubernetes.io/h2c",
                "{}: port {} carries TLS",
                service["metadata"]["name"], port["name"]
            );
        }
    }
}

/// A cert-manager duration in whole hours (`720h`: the form used here).
fn hours(value: &Value, what: &str) -> u64 {
    value
        .as_str()
        .and_then(|v| v.strip_suffix('h'))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {value} is not a duration in hours"))
}

/// Dev: plaintext, so that it runs on a bare kind or minikube: no
/// cert-manager objects, no Secret volumes, no API keys.
#[test]
fn dev_runs_plaintext_without_cert_manager() {
    let docs = documents(&render("dev"));
    for d in &docs {
        let api = d["apiVersion"].as_str().unwrap_or_default();
        assert!(
            !api.starts_with("cert-manager.io/"),
            "dev needs no cert-manager: {}",
            d["kind"]
        );
    }
    for (component, deployment, container) in services(&docs) {
        let config = config_of(&docs, container);
        let p = prefix(&component);
        assert_eq!(
            setting(config, &format!("{p}PLAINTEXT")),
            Some("true"),
            "dev/{component}"
        );
        assert_eq!(
            setting(config, &format!("{p}API_KEYS")),
            None,
            "dev/{component}"
        );
        let volumes = deployment["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap();
        for v in volumes {
            assert!(
                v["secret"].is_null(),
                "dev/{component}: Secret volume {}",
                v["name"]
            );
        }
    }
}

/// kubernetes-validate has no schema for cert-manager's kinds (it warns
/// and passes), so a misspelt field would only surface at apply time:
/// every field used must be one of cert-manager.io/v1's (its Certificate
/// and Issuer CRDs as of cert-manager 1.18), and every value of an
/// enumerated field one the CRD allows.
#[test]
fn cert_manager_objects_use_known_fields() {
    // Comma-separated, as the CRDs spell them.
    const CERTIFICATE_SPEC: &str = "additionalOutputFormats, commonName, dnsNames, duration, \
        emailAddresses, encodeUsagesInRequest, ipAddresses, isCA, issuerRef, keystores, \
        literalSubject, nameConstraints, otherNames, privateKey, renewBefore, \
        renewBeforePercentage, revisionHistoryLimit, secretName, secretTemplate, \
        signatureAlgorithm, subject, uris, usages";
    const PRIVATE_KEY: &str = "algorithm, encoding, rotationPolicy, size";
    const ISSUER_REF: &str = "group, kind, name";
    const SECRET_TEMPLATE: &str = "annotations, labels";
    const ISSUER_SPEC: &str = "acme, ca, selfSigned, vault, venafi";
    const CA_ISSUER: &str =
        "crlDistributionPoints, issuingCertificateURLs, ocspServers, secretName";
    const SELF_SIGNED_ISSUER: &str = "crlDistributionPoints";
    const USAGES: &str = "signing, digital signature, content commitment, key encipherment, \
        key agreement, data encipherment, cert sign, crl sign, encipher only, decipher only, \
        any, server auth, client auth, code signing, email protection, s/mime, \
        ipsec end system, ipsec tunnel, ipsec user, timestamping, ocsp signing, \
        microsoft sgc, netscape sgc";
    let listed = |list: &str, name: &str| list.split(',').any(|item| item.trim() == name);
    let known = |what: &str, object: &Value, fields: &str| {
        let object = object
            .as_object()
            .unwrap_or_else(|| panic!("{what}: not an object"));
        for key in object.keys() {
            assert!(listed(fields, key.as_str()), "{what}: unknown field {key}");
        }
    };
    let mut sources: Vec<(String, String)> = overlays()
        .into_iter()
        .map(|o| (format!("overlay {o}"), render(&o)))
        .collect();
    sources.push((MESH_CA.to_string(), kustomize(MESH_CA)));
    let mut seen = 0;
    for (source, manifests) in sources {
        for d in documents(&manifests) {
            if !d["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .starts_with("cert-manager.io/")
            {
                continue;
            }
            seen += 1;
            let what = format!("{source}: {} {}", d["kind"], d["metadata"]["name"]);
            assert_eq!(d["apiVersion"], "cert-manager.io/v1", "{what}");
            assert!(d["metadata"]["namespace"].is_string(), "{what}: namespaced");
            let spec = &d["spec"];
            match d["kind"].as_str() {
                Some("Certificate") => {
                    known(&what, spec, CERTIFICATE_SPEC);
                    known(&format!("{what} issuerRef"), &spec["issuerRef"], ISSUER_REF);
                    assert!(
                        spec["secretName"].is_string() && spec["issuerRef"]["name"].is_string(),
                        "{what}"
                    );
                    if !spec["privateKey"].is_null() {
                        let key = &spec["privateKey"];
                        known(&format!("{what} privateKey"), key, PRIVATE_KEY);
                        assert!(
                            ["RSA", "ECDSA", "Ed25519"]
                                .contains(&key["algorithm"].as_str().unwrap_or("RSA")),
                            "{what}"
                        );
                        assert!(
                            ["PKCS1", "PKCS8"]
                                .contains(&key["encoding"].as_str().unwrap_or("PKCS1")),
                            "{what}"
                        );
                        assert!(
                            ["Always", "Never"]
                                .contains(&key["rotationPolicy"].as_str().unwrap_or("Always")),
                            "{what}"
                        );
                    }
                    if !spec["secretTemplate"].is_null() {
                        known(
                            &format!("{what} secretTemplate"),
                            &spec["secretTemplate"],
                            SECRET_TEMPLATE,
                        );
                    }
                    for usage in spec["usages"].as_array().into_iter().flatten() {
                        assert!(
                            listed(USAGES, usage.as_str().unwrap_or_default()),
                            "{what}: usage {usage}"
                        );
                    }
                    hours(&spec["duration"], &what);
                    hours(&spec["renewBefore"], &what);
                }
                Some("Issuer") => {
                    known(&what, spec, ISSUER_SPEC);
                    assert_eq!(
                        spec.as_object().unwrap().len(),
                        1,
                        "{what}: one kind of issuer"
                    );
                    if !spec["ca"].is_null() {
                        known(&format!("{what} ca"), &spec["ca"], CA_ISSUER);
                    }
                    if !spec["selfSigned"].is_null() {
                        known(
                            &format!("{what} selfSigned"),
                            &spec["selfSigned"],
                            SELF_SIGNED_ISSUER,
                        );
                    }
                }
                other => panic!("{what}: unexpected kind {other:?}"),
            }
        }
    }
    assert!(
        seen >= 6,
        "expected the Issuer and Certificates of production and mesh-ca, saw {seen}"
    );
}

/// The bootstrap CA writes the Secret production's Issuer signs with, in
/// production's namespace, and stays a CA across renewals (same key).
#[test]
fn bootstrap_ca_feeds_the_production_issuer() {
    let ca = documents(&kustomize(MESH_CA));
    let production = documents(&render("production"));
    let issuer = production
        .iter()
        .find(|d| d["kind"] == "Issuer")
        .expect("production's Issuer");
    let certificate = ca
        .iter()
        .find(|d| d["kind"] == "Certificate")
        .expect("the CA Certificate");
    assert_eq!(certificate["spec"]["isCA"], true);
    assert_eq!(
        certificate["spec"]["secretName"],
        issuer["spec"]["ca"]["secretName"]
    );
    assert_eq!(
        certificate["metadata"]["namespace"],
        issuer["metadata"]["namespace"]
    );
    assert_eq!(certificate["spec"]["privateKey"]["rotationPolicy"], "Never");
    let signer = ca
        .iter()
        .find(|d| {
            d["kind"] == "Issuer"
                && d["metadata"]["name"] == certificate["spec"]["issuerRef"]["name"]
        })
        .expect("the CA's own Issuer");
    assert!(signer["spec"]["selfSigned"].is_object());
}

/// The plaintext health port is for kubelet (from the node) alone: no
/// NetworkPolicy admits pods to it, and every ingress rule names its ports.
#[test]
fn no_network_policy_opens_the_health_port() {
    for overlay in overlays() {
        let docs = documents(&render(&overlay));
        let health: Vec<u64> = services(&docs)
            .iter()
            .map(|(_, _, c)| port_named(&c["ports"], "health", "containerPort"))
            .collect();
        for policy in docs.iter().filter(|d| d["kind"] == "NetworkPolicy") {
            for rule in policy["spec"]["ingress"].as_array().into_iter().flatten() {
                let ports = rule["ports"].as_array().unwrap_or_else(|| {
                    panic!(
                        "{overlay}/{}: an ingress rule without ports opens every port",
                        policy["metadata"]["name"]
                    )
                });
                for port in ports {
                    let name = &policy["metadata"]["name"];
                    assert!(
                        !port["port"].as_u64().is_some_and(|p| health.contains(&p)),
                        "{overlay}/{name}: admits pods to the health port"
                    );
                    assert_ne!(port["port"], "health", "{overlay}/{name}");
                }
            }
        }
    }
}
