//! The server side: TCP connections become TLS streams before tonic sees
//! them. Each handshake runs in its own task, so a slow or silent client
//! never holds up the accept loop, and a failed one is logged and dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, warn};

use super::MeshTls;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for tonic to take them.
const BACKLOG: usize = 128;

/// `tcp`'s connections through TLS with the configuration current when
/// each one arrives. The accept loop ends when the stream is dropped.
pub fn incoming<S>(
    mut tcp: S,
    tls: Arc<MeshTls>,
) -> impl Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send + 'static
where
    S: Stream<Item = std::io::Result<TcpStream>> + Send + Unpin + 'static,
{
    let (tx, rx) = mpsc::channel(BACKLOG);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = tcp.next() => next,
                () = tx.closed() => return,
            };
            let stream = match next {
                Some(Ok(stream)) => stream,
                Some(Err(e)) => {
                    // Out of descriptors and the like: the listener lives on.
                    warn!(error = %e, "accepting a connection failed");
                    continue;
                }
                None => return,
            };
            let peer = stream.peer_addr().ok();
            let acceptor = TlsAcceptor::from(tls.server_config());
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => warn!(?peer, error = %e, "TLS handshake refused"),
                    Err(_) => debug!(?peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
