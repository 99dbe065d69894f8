//! Plumbing shared by the three services, so none of them re-implements
//! health, reflection, shutdown or trace propagation.

pub mod shutdown;
pub mod telemetry;

use tonic::server::NamedService;

/// The gRPC health service, reporting `S` (and the whole server, "") as
/// serving. Keep the reporter to flip to NOT_SERVING on shutdown.
pub async fn health<S: NamedService>() -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter.set_serving::<S>().await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    (reporter, service)
}

/// Server reflection in both versions: grpcurl 1.8 speaks only `v1alpha`,
/// newer clients `v1`. Describes the specmesh and health protos, so no
/// client needs our proto files.
pub fn reflection() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(specmesh_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}
