//! The HTTP front over TLS: the gateway's own certificate (`--tls-cert`,
//! re-read on rotation like the gRPC listener's), offered for HTTP/1.1 by
//! ALPN instead of the gRPC listener's h2. Each handshake runs in its own
//! task, so a silent client never holds up the others.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use specmesh_server::tls::MeshTls;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS connections for `axum::serve`.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    _accept: specmesh_server::AbortOnDrop,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, tls: Arc<MeshTls>) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(128);
        let accept = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an HTTP connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // The current certificate, for HTTP/1.1.
                let mut config = (*tls.server_config()).clone();
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                let acceptor = TlsAcceptor::from(Arc::new(config));
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, error = %e, "HTTP TLS handshake refused")
                        }
                        Err(_) => tracing::debug!(%peer, "HTTP TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            local,
            ready,
            _accept: specmesh_server::AbortOnDrop(accept),
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept task is gone only when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
