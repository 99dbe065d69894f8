//! The one way a service connects to another: lazily (a peer that is down
//! at start only fails the calls sent to it), without Nagle, with HTTP/2
//! pings so a vanished peer is noticed within interval + timeout, and over
//! mutual TLS unless the service runs `--plaintext`.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::tls::{Connector, Security};

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

/// How a service dials its peers.
#[derive(Debug, Clone)]
pub struct Dialer {
    pub security: Security,
    pub connect_timeout: Duration,
}

impl Dialer {
    /// A lazily connecting channel to `endpoint` (`http://host:port`).
    /// Over TLS the peer's certificate must name `server_name` (default:
    /// the endpoint's host); a member found through DNS passes the name
    /// it was found under, since it is dialed by address.
    pub fn channel(
        &self,
        endpoint: &str,
        server_name: Option<&str>,
    ) -> Result<Channel, BadEndpoint> {
        let bad = |reason: String| BadEndpoint {
            endpoint: endpoint.to_string(),
            reason,
        };
        let e = Endpoint::from_shared(endpoint.to_string()).map_err(|e| bad(e.to_string()))?;
        let e = e
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT);
        match &self.security {
            Security::Plaintext => Ok(e.connect_lazy()),
            Security::Tls(tls) => {
                let host = e.uri().host().unwrap_or_default();
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let connector =
                    Connector::new(tls.clone(), server_name.unwrap_or(host)).map_err(bad)?;
                Ok(e.connect_with_connector_lazy(connector))
            }
        }
    }
}
