//! What operators and launchers rely on: health, reflection, graceful
//! shutdown.

use std::time::{Duration, Instant};

use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::{v1 as refl, v1alpha as refl_alpha};

use crate::common::{Drafter, Stream, config, draft_start};

const SERVICE: &str = "specmesh.v1.Drafter";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_the_drafter_serving() {
    let drafter = Drafter::start(config()).await;
    let mut health = HealthClient::new(drafter.channel().await);
    for service in [SERVICE, ""] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_drafter_in_both_versions() {
    let drafter = Drafter::start(config()).await;

    let mut client =
        refl::server_reflection_client::ServerReflectionClient::new(drafter.channel().await);
    let request = refl::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            refl::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(refl::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&SERVICE), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");

    let mut client =
        refl_alpha::server_reflection_client::ServerReflectionClient::new(drafter.channel().await);
    let request = refl_alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            refl_alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(refl_alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    assert!(list.service.iter().any(|s| s.name == SERVICE));
    drafter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_open_streams_finish_then_closes_them() {
    let mut cfg = config();
    cfg.endpoints.shutdown_grace = Duration::from_millis(800);
    let drafter = Drafter::start(cfg).await;
    let mut client = drafter.client().await;

    // A stream that ends within the grace period ends normally.
    let mut finishing = Stream::start(&mut client, draft_start("", vec![1, 2, 3], 4, 4)).await;
    finishing.tree().await;
    // A stream that outlives it is closed with UNAVAILABLE.
    let mut lingering = Stream::start(&mut client, draft_start("", vec![1, 2, 3], 4, 4)).await;
    lingering.tree().await;

    let t0 = Instant::now();
    let stats = drafter.stats.clone();
    let stopped = tokio::spawn(drafter.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    finishing.close().await;
    let status = lingering.error().await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    stopped
        .await
        .unwrap()
        .expect("a graceful shutdown is a clean exit");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "the grace period was honoured: {took:?}"
    );
    assert_eq!(stats.snapshot().sessions_open, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_drafter_stops_at_once_and_refuses_new_connections() {
    let drafter = Drafter::start(config()).await;
    let endpoint = drafter.endpoint();
    let t0 = Instant::now();
    drafter.shutdown().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let connect = tonic::transport::Channel::from_shared(endpoint)
        .unwrap()
        .connect()
        .await;
    assert!(connect.is_err(), "the listener is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_the_configured_address_until_shutdown() {
    // A port that was free a moment ago (`run` itself hides its address).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = config();
    cfg.endpoints.listen = format!("127.0.0.1:{port}").parse().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(specmesh_server::run::<specmesh_drafter::Drafter>(
        cfg,
        async {
            let _ = stopped.await;
        },
    ));
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let channel = loop {
        match tonic::transport::Channel::from_shared(endpoint.clone())
            .unwrap()
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "never served: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: SERVICE.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);
    stop.send(()).unwrap();
    served.await.unwrap().expect("a clean exit");
}
