//! Triton's gRPC front end (`inference.GRPCInferenceService`, the vendored
//! proto/grpc_service.proto) on its own port (8001 by default): health, metadata, model
//! configuration, statistics, the repository index, `ModelInfer` and the decoupled
//! `ModelStreamInfer` that TensorRT-LLM's clients, `tritonclient.grpc`, perf_analyzer and
//! genai-perf stream tokens through. One request path, two codecs: a message becomes the
//! same decoded infer request HTTP's `infer` builds (src/http/kserve.rs), with the same
//! checks, metrics and cancellation.

pub(crate) mod codec;
mod incoming;
mod service;

use std::time::Duration;

use tokio::net::TcpListener;

use crate::http::AppState;

pub use service::TritonGrpc;

/// The code generated from the vendored protocol (build.rs).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod proto {
    tonic::include_proto!("inference");
}

/// What the gRPC listener allows.
#[derive(Debug, Clone)]
pub struct GrpcLimits {
    /// `authorization: Bearer <key>` required on every call but the server's live and
    /// ready checks.
    pub api_key: Option<String>,
    /// Largest request message.
    pub max_message_bytes: usize,
    /// Open connections at most.
    pub max_connections: usize,
    /// TLS on the port when set.
    pub tls: Option<crate::http::tls::Tls>,
}

/// HTTP/2 pings on a connection idle this long, so a peer that vanished is noticed.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// Serves the gRPC front end on `listener` until `shutdown` resolves; calls still open
/// then (a client holding a stream) get `grace` more before they are closed.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    limits: GrpcLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) {
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let service = proto::grpc_inference_service_server::GrpcInferenceServiceServer::new(
        TritonGrpc::new(state, limits.api_key.as_deref()),
    )
    .max_decoding_message_size(limits.max_message_bytes)
    .max_encoding_message_size(usize::MAX);
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &limits.tls {
        let identity = tonic::transport::Identity::from_pem(&tls.cert_pem, &tls.key_pem);
        builder =
            match builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity)) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!("gRPC TLS: {e}; the gRPC port is not served");
                    return;
                }
            };
    }
    let server = builder
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(service)
        .serve_with_incoming_shutdown(
            incoming::capped(listener, limits.max_connections),
            async move {
                shutdown.await;
                let _ = stopped_tx.send(());
            },
        );
    let grace_after_stop = async move {
        let _ = stopped_rx.await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        r = server => {
            if let Err(e) = r {
                tracing::error!("gRPC server failed: {e}");
            }
        }
        _ = grace_after_stop => tracing::info!("gRPC calls still open after the grace period were closed"),
    }
}
