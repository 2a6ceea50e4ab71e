//! Running the server: both listeners (inference and metrics) on their ports, and the
//! orderly stop on SIGTERM or Ctrl-C: stop admitting requests (new ones get 503 while the
//! listeners still answer), let running requests finish (bounded wait), stop the actors,
//! then close the listeners (bounded wait for open connections) and exit. The limits every
//! listener puts on its clients come from `[server]` ([`ServeLimits`]).

use std::time::Duration;

use tokio::net::TcpListener;

use super::auth::ApiKey;
use super::listener::{self, ConnLimits};
use super::request_body::BodyLimits;
use super::{app_with, metrics_app_with, AppState};
use crate::config::ServerSection;
use crate::error::{Error, Result};

/// How the listeners treat clients, and how long a stop waits (the `[server]` keys).
#[derive(Debug, Clone)]
pub struct ServeLimits {
    /// How long running requests may finish after a stop signal.
    pub drain_timeout: Duration,
    /// A request's head must arrive within this (also closes idle kept-alive connections).
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this of its head.
    pub request_body_timeout: Duration,
    /// Longest request body, in bytes.
    pub max_request_body_bytes: usize,
    /// Open connections per listener at most.
    pub max_connections: usize,
    /// The API key every request must carry, but those to `api_key_exempt_paths`.
    pub api_key: Option<String>,
    /// Paths open without the key.
    pub api_key_exempt_paths: Vec<String>,
    /// TLS on every listener when set ([`super::tls::Tls::load`] of `tls_cert`, `tls_key`).
    pub tls: Option<super::tls::Tls>,
    /// Serves the fault injection route (`[server] fault_injection`).
    pub fault_injection: bool,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits::from(&ServerSection::default())
    }
}

impl From<&ServerSection> for ServeLimits {
    fn from(s: &ServerSection) -> Self {
        ServeLimits {
            drain_timeout: Duration::from_secs(s.shutdown_timeout_s),
            header_read_timeout: Duration::from_secs_f64(s.header_read_timeout_s),
            request_body_timeout: Duration::from_secs_f64(s.request_body_timeout_s),
            max_request_body_bytes: s.max_request_body_bytes,
            max_connections: s.max_connections,
            api_key: s.api_key.clone(),
            api_key_exempt_paths: s.api_key_exempt_paths.clone(),
            tls: None,
            fault_injection: s.fault_injection,
        }
    }
}

/// Serves `state` on the two listeners until `shutdown` resolves, then drains: new
/// requests get 503 while running ones finish (up to `drain_timeout`), the actors stop,
/// then the listeners close (open connections get 5 s more).
pub async fn serve_on(
    state: AppState,
    http: TcpListener,
    metrics: TcpListener,
    grpc: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: ServeLimits,
) -> Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let models = state.clone();
    let conns = ConnLimits {
        header_read_timeout: limits.header_read_timeout,
        max_connections: limits.max_connections,
        tls: limits.tls.as_ref().map(|t| t.acceptor.clone()),
    };
    let body = BodyLimits {
        max_bytes: limits.max_request_body_bytes,
        timeout: limits.request_body_timeout,
    };
    let grace = Duration::from_secs(5);
    let key = limits
        .api_key
        .as_deref()
        .map(|k| ApiKey::new(k, &limits.api_key_exempt_paths));
    let grpc_task = grpc.map(|listener| {
        tokio::spawn(crate::grpc::run(
            listener,
            state.clone(),
            crate::grpc::GrpcLimits {
                api_key: limits.api_key.clone(),
                max_message_bytes: limits.max_request_body_bytes,
                max_connections: limits.max_connections,
                tls: limits.tls.clone(),
            },
            wait(stop_rx.clone()),
            grace,
        ))
    });
    let http_app = app_with(state.clone(), body, key.clone(), limits.fault_injection);
    let metrics_app = metrics_app_with(state, key);
    let http_task = tokio::spawn(listener::run(
        http,
        http_app,
        conns.clone(),
        wait(stop_rx.clone()),
        grace,
    ));
    let metrics_task = tokio::spawn(listener::run(
        metrics,
        metrics_app,
        conns,
        wait(stop_rx),
        grace,
    ));
    // A model whose device could not be recovered ends the server as a signal does, and
    // the serve call answers the error: `inflight serve` exits non-zero, so that an
    // orchestrator restarts the process rather than route to a model that cannot serve.
    let lost = {
        let models = models.clone();
        async move {
            loop {
                if let Some(lost) = models.models().lost() {
                    return lost;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let lost = tokio::select! {
        _ = shutdown => None,
        lost = lost => Some(lost),
    };
    if let Some((model, why)) = &lost {
        tracing::error!(%model, "{why}: shutting the server down");
    }
    tracing::info!(
        "shutting down: no new requests; waiting up to {:?} for running ones",
        limits.drain_timeout
    );
    // Stop admitting and let running requests finish before the connections close.
    models.models().shutdown(limits.drain_timeout).await;
    let _ = stop_tx.send(true);
    let _ = http_task.await;
    let _ = metrics_task.await;
    if let Some(t) = grpc_task {
        let _ = t.await;
    }
    match lost {
        Some((model, why)) => Err(Error::Model(format!("model {model}: {why}"))),
        None => Ok(()),
    }
}

/// The ports [`serve`] binds.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// HTTP: Triton, KServe v2, OpenAI, health.
    pub http: u16,
    /// Prometheus metrics.
    pub metrics: u16,
    /// Triton's gRPC service; 0 serves none.
    pub grpc: u16,
}

/// Binds `host:http_port`, `host:metrics_port` and (unless 0) `host:grpc_port`, and
/// serves until SIGTERM or Ctrl-C.
pub async fn serve(state: AppState, host: &str, ports: Ports, limits: ServeLimits) -> Result<()> {
    // A host name (`localhost`) is resolved; an IP address (IPv6 in brackets) is taken as is.
    let bind = |port: u16| async move {
        let addr = format!("{host}:{port}");
        TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")))
    };
    let http = bind(ports.http).await?;
    let metrics = bind(ports.metrics).await?;
    let grpc = match ports.grpc {
        0 => None,
        port => Some(bind(port).await?),
    };
    tracing::info!(models = ?state.served_names(), "serving HTTP on {host}:{}, gRPC on {}, metrics on {host}:{}",
        ports.http, if ports.grpc == 0 { "no port".to_string() } else { format!("{host}:{}", ports.grpc) }, ports.metrics);
    serve_on(state, http, metrics, grpc, shutdown_signal(), limits).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
