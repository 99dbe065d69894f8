//! Mutual TLS between the real services, with certificates made by the
//! test (rcgen) and files written as cert-manager writes a Secret.
//!
//! Every hop (caller → gateway, gateway → verifier, verifier → drafter)
//! runs over TLS; at each listener a plaintext client, a certificate from
//! another CA and an expired certificate are refused; the verifier's API
//! admits only the gateway's identity and the drafter's only the
//! verifiers'. Rotating a verifier's certificate under a running stream
//! keeps the stream, and new connections get the new certificate.

use std::time::{Duration, Instant};

use specmesh_e2e::cluster::COST_CURVE;
use specmesh_e2e::mesh::chat_request;
use specmesh_e2e::model_path;
use specmesh_e2e::pki::{Ca, Leaf, TlsFiles, tls_channel};
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::drafter_client::DrafterClient;
use specmesh_proto::v1::generation_client::GenerationClient;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const GATEWAY: &str = "gateway.specmesh.test";
const VERIFIER: &str = "verifier.specmesh.test";
const DRAFTER: &str = "drafter.specmesh.test";

/// The three services over mutual TLS, each with its own certificate from
/// `ca`, and the files they read.
struct Mesh {
    drafter: Service,
    verifier: Service,
    gateway: Service,
    verifier_files: TlsFiles,
}

fn start_mesh(dir: &std::path::Path, ca: &Ca, verifier_reload_ms: u64) -> Mesh {
    let files =
        |name: &str| TlsFiles::write(&dir.join(name), &ca.issue(&[name, "127.0.0.1"]), &ca.pem());
    let (drafter_files, verifier_files, gateway_files) =
        (files(DRAFTER), files(VERIFIER), files(GATEWAY));
    let mut args = drafter_files.args();
    args.extend(["--tls-allow-san".into(), VERIFIER.into()]);
    let drafter = Service::start("specmesh-drafter", &args, &[]);

    let mut args = verifier_files.args();
    args.extend(
        [
            "--tls-allow-san",
            GATEWAY,
            "--tls-reload-ms",
            &verifier_reload_ms.to_string(),
            "--drafter-tls-name",
            DRAFTER,
            "--threads",
            "1",
            "--cost-curve",
            COST_CURVE,
        ]
        .map(String::from),
    );
    args.extend(["--model".into(), model_path().display().to_string()]);
    args.extend(["--drafters".into(), drafter.url.clone()]);
    let verifier = Service::start("specmesh-verifier", &args, &[]);

    let mut args = gateway_files.args();
    args.extend(
        [
            "--verifiers",
            &verifier.url,
            "--drafters",
            &drafter.url,
            "--verifier-tls-name",
            VERIFIER,
            "--drafter-tls-name",
            DRAFTER,
            "--model",
        ]
        .map(String::from),
    );
    args.push(model_path().display().to_string());
    let gateway = Service::start("specmesh-gateway", &args, &[]);
    Mesh {
        drafter,
        verifier,
        gateway,
        verifier_files,
    }
}

/// The health of `channel`'s server, or why the call failed.
async fn health(channel: Result<Channel, tonic::transport::Error>) -> Result<i32, String> {
    let channel = channel.map_err(|e| format!("connect: {e:?}"))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    Ok(reply.into_inner().status)
}

/// A plaintext channel (connected lazily: the first call fails).
fn plaintext(url: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(Channel::from_shared(url.to_string())
        .unwrap()
        .connect_lazy())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hop_is_mutual_tls_and_refuses_strangers() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("specmesh test mesh CA");
    let mesh = start_mesh(dir.path(), &ca, 10_000);

    // A caller with no certificate of its own (API keys are how callers
    // authenticate) generates through the gateway; the tree came from the
    // drafter over the verifier's mutual-TLS stream.
    let channel = tls_channel(&mesh.gateway.url, &ca.pem(), GATEWAY, None)
        .await
        .unwrap();
    let reply = GenerationClient::new(channel)
        .generate(chat_request("Name three prime numbers.", 24))
        .await
        .expect("a generation over TLS")
        .into_inner();
    assert!(!reply.text.is_empty());
    let spec = reply.speculation.unwrap();
    assert!(
        spec.drafted_tokens > 0,
        "the verifier reached the drafter over TLS: {spec:?}"
    );

    // At every listener: plaintext, another CA's certificate and an
    // expired one are refused; a mesh certificate is admitted to health.
    let other = Ca::new("another CA").issue(&[GATEWAY]);
    let expired = ca.issue_expired(&[GATEWAY]);
    let member = ca.issue(&[GATEWAY]);
    for (service, name) in [
        (&mesh.gateway, GATEWAY),
        (&mesh.verifier, VERIFIER),
        (&mesh.drafter, DRAFTER),
    ] {
        let url = &service.url;
        let refused = health(plaintext(url)).await;
        assert!(refused.is_err(), "{name}: plaintext admitted: {refused:?}");
        let refused = health(tls_channel(url, &ca.pem(), name, Some(&other)).await).await;
        assert!(
            refused.is_err(),
            "{name}: another CA's certificate admitted: {refused:?}"
        );
        let refused = health(tls_channel(url, &ca.pem(), name, Some(&expired)).await).await;
        assert!(
            refused.is_err(),
            "{name}: an expired certificate admitted: {refused:?}"
        );
        let serving = health(tls_channel(url, &ca.pem(), name, Some(&member)).await).await;
        assert_eq!(
            serving,
            Ok(1),
            "{name}: a mesh certificate is refused health"
        );
        // The client must check the server too: a server whose name is
        // not the one expected is refused.
        let wrong =
            health(tls_channel(url, &ca.pem(), "impostor.specmesh.test", Some(&member)).await)
                .await;
        assert!(
            wrong.is_err(),
            "{name}: accepted under another name: {wrong:?}"
        );
    }
    // The verifier and the drafter demand a certificate.
    for (service, name) in [(&mesh.verifier, VERIFIER), (&mesh.drafter, DRAFTER)] {
        let refused = health(tls_channel(&service.url, &ca.pem(), name, None).await).await;
        assert!(
            refused.is_err(),
            "{name}: a client without a certificate admitted: {refused:?}"
        );
    }

    // The verifier's API admits the gateway's identity only.
    let as_drafter = ca.issue(&[DRAFTER]);
    let channel = tls_channel(&mesh.verifier.url, &ca.pem(), VERIFIER, Some(&as_drafter))
        .await
        .unwrap();
    let status = VerifierClient::new(channel)
        .stats(v1::StatsRequest::default())
        .await
        .expect_err("a drafter identity called the verifier");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains(DRAFTER), "{status:?}");
    let channel = tls_channel(&mesh.verifier.url, &ca.pem(), VERIFIER, Some(&member))
        .await
        .unwrap();
    VerifierClient::new(channel)
        .stats(v1::StatsRequest::default())
        .await
        .expect("the gateway's identity calls the verifier");

    // The drafter's API admits the verifiers' identity only.
    let channel = tls_channel(&mesh.drafter.url, &ca.pem(), DRAFTER, Some(&member))
        .await
        .unwrap();
    let status = DrafterClient::new(channel)
        .draft(tokio_stream::iter(Vec::<v1::DraftRequest>::new()))
        .await
        .expect_err("the gateway's identity opened a draft stream");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_running_streams_and_serves_the_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("specmesh test mesh CA");
    let mesh = start_mesh(dir.path(), &ca, 200);
    let mut client = GenerationClient::new(
        tls_channel(&mesh.gateway.url, &ca.pem(), GATEWAY, None)
            .await
            .unwrap(),
    );
    let long = chat_request("Write a short story about a lighthouse keeper.", 256);
    let expected = client.generate(long.clone()).await.unwrap().into_inner();

    // A stream runs through the gateway's connection to the verifier.
    let mut stream = client.generate_stream(long).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().expect("a first chunk");
    let mut streamed = first.text.clone();

    // The verifier's certificate rotates to one from a new CA (its CA
    // file now trusts both, so the gateway's certificate still verifies).
    let next_ca = Ca::new("specmesh test mesh CA, next");
    let rotated: Leaf = next_ca.issue(&[VERIFIER, "127.0.0.1"]);
    mesh.verifier_files
        .replace(&rotated, &format!("{}{}", ca.pem(), next_ca.pem()));
    let member = ca.issue(&[GATEWAY]);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let new =
            health(tls_channel(&mesh.verifier.url, &next_ca.pem(), VERIFIER, Some(&member)).await)
                .await;
        if new == Ok(1) {
            break;
        }
        assert!(
            Instant::now() < until,
            "new connections never got the new certificate: {new:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old =
        health(tls_channel(&mesh.verifier.url, &ca.pem(), VERIFIER, Some(&member)).await).await;
    assert!(
        old.is_err(),
        "a new connection still got the old certificate: {old:?}"
    );
    let channel = tls_channel(&mesh.verifier.url, &next_ca.pem(), VERIFIER, Some(&member))
        .await
        .unwrap();
    let running = VerifierClient::new(channel)
        .stats(v1::StatsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .active_sessions;
    assert_eq!(running, 1, "the stream still runs across the rotation");

    // The stream opened before the rotation finishes, unchanged.
    while let Some(chunk) = stream
        .message()
        .await
        .expect("the stream survives the rotation")
    {
        streamed.push_str(&chunk.text);
    }
    assert_eq!(streamed, expected.text);
}
