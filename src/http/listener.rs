//! Accepting connections on one listener: TCP_NODELAY, the cap on open connections (one
//! past it gets a JSON 503 and is closed), HTTP/1 with a header read timeout (which also
//! closes connections idle between requests), and a graceful stop that lets open
//! connections finish for a bounded time.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// What one listener allows its connections.
#[derive(Clone)]
pub(crate) struct ConnLimits {
    /// A connection must send a request's whole head within this, counted from when the
    /// connection is ready for one (opened, or done with the previous request).
    pub header_read_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// TLS first when set: the handshake must end within `header_read_timeout`.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Serves `app` on `listener` until `stop` resolves; then stops accepting and waits up to
/// `grace` for open connections to finish.
pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    stop: impl Future<Output = ()>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(stop);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted:
                    // the listener itself is fine.
                    tracing::debug!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // A streamed event is a small write: without TCP_NODELAY it waits for the ACK of
        // the one before, which the client may delay by up to 40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY on an accepted connection: {e}");
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(tcp, limits.max_connections));
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let Some(acceptor) = limits.tls.clone() else {
            let connection = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!("connection: {e}");
                }
                drop(slot);
            });
            continue;
        };
        let (watcher, http, handshake) =
            (graceful.watcher(), http.clone(), limits.header_read_timeout);
        tokio::spawn(async move {
            match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let connection = http.serve_connection(TokioIo::new(tls), service);
                    if let Err(e) = watcher.watch(connection).await {
                        tracing::debug!("connection: {e}");
                    }
                }
                Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                Err(_) => tracing::debug!("TLS handshake not done within {handshake:?}"),
            }
            drop(slot);
        });
    }
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {grace:?}; closing them");
    }
}

/// Answers a connection past the cap with a JSON 503 and closes it.
async fn refuse(mut tcp: TcpStream, max: usize) {
    let body = format!(
        "{{\"error\":\"too many open connections (max_connections {max}); try again shortly\"}}"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = tcp.write_all(response.as_bytes()).await;
        let _ = tcp.shutdown().await;
    })
    .await;
}
