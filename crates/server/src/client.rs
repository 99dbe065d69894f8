//! The one way a service connects to another: lazily (a peer that is down
//! at start only fails the calls sent to it), without Nagle, with HTTP/2
//! pings so a vanished peer is noticed within interval + timeout.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Pings on an idle connection to a peer service.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// `endpoint` is not a URI a channel can connect to.
#[derive(Debug, thiserror::Error)]
#[error("`{endpoint}` is not a gRPC endpoint: {reason}")]
pub struct BadEndpoint {
    pub endpoint: String,
    pub reason: String,
}

/// A lazily connecting channel to `endpoint` (`http://host:port`).
pub fn channel(endpoint: &str, connect_timeout: Duration) -> Result<Channel, BadEndpoint> {
    let e = Endpoint::from_shared(endpoint.to_string()).map_err(|e| BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: e.to_string(),
    })?;
    Ok(e.connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .connect_lazy())
}
