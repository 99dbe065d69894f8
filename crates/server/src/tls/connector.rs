//! The client side: a connector for tonic channels that dials TCP and
//! shakes hands with the client configuration current at that moment, so a
//! reconnection after a rotation presents the new certificate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::Uri;

use super::MeshTls;

/// Connects to a peer whose certificate must name `server_name` (for a
/// member found through DNS, the name it was found under: every pod
/// behind it carries that name, whatever its address).
#[derive(Debug, Clone)]
pub struct Connector {
    tls: Arc<MeshTls>,
    server_name: ServerName<'static>,
}

impl Connector {
    /// `server_name`: a DNS name or an IP address.
    pub fn new(tls: Arc<MeshTls>, server_name: &str) -> Result<Connector, String> {
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| format!("`{server_name}` is not a TLS server name: {e}"))?;
        Ok(Connector { tls, server_name })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.tls.client_config();
        let name = self.server_name.clone();
        Box::pin(async move {
            let host = uri.host().ok_or("the endpoint has no host")?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().ok_or("the endpoint has no port")?;
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            let tls = TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}
