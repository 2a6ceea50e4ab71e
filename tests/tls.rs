//! TLS on the listeners, with the test certificate under tests/fixtures/tls: an HTTPS
//! request to the inference port and to the metrics port answered, gRPC over TLS served,
//! plain HTTP to a TLS port answered with nothing, and a missing or broken key refused at
//! load.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use inflight::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use inflight::grpc::proto::ServerReadyRequest;
use inflight::http::tls::Tls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

const CERT: &str = "tests/fixtures/tls/cert.pem";
const KEY: &str = "tests/fixtures/tls/key.pem";

/// One HTTP/1.1 request over TLS to `base` (`http://127.0.0.1:PORT`); the whole response.
async fn https(base: &str, request: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(CERT).unwrap())
        .unwrap();
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_port_serves_tls() {
    let dir = common::server::tiny_model_dir("tls");
    let limits = inflight::http::ServeLimits {
        tls: Some(Tls::load(Path::new(CERT), Path::new(KEY)).unwrap()),
        ..Default::default()
    };
    let s = common::server::start_limited(&dir, limits, |_| {}).await;
    let body = r#"{"text_input": "hi", "max_tokens": 3}"#;
    let r = https(
        &s.base,
        &format!(
            "POST /v2/models/ensemble/generate HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("text_output"), "{r}");
    let r = https(
        &s.metrics,
        "GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("nv_inference_request_success"),
        "{r}"
    );

    // Plain HTTP to a TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    plain
        .write_all(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut out)).await;
    assert!(!String::from_utf8_lossy(&out).contains("HTTP/1.1 200"));

    // gRPC over TLS.
    let port = s.grpc.rsplit(':').next().unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(CERT).unwrap(),
        ))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = GrpcInferenceServiceClient::new(channel);
    assert!(
        c.server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    s.stop().await;
}

#[test]
fn bad_tls_files_are_refused_at_load() {
    let e = Tls::load(Path::new(CERT), Path::new("tests/fixtures/tls/none.pem")).unwrap_err();
    assert!(e.to_string().contains("cannot read the TLS key"), "{e}");
    let e = Tls::load(Path::new(KEY), Path::new(KEY)).unwrap_err();
    assert!(e.to_string().contains("no certificate"), "{e}");
    let e = Tls::load(Path::new(CERT), Path::new(CERT)).unwrap_err();
    assert!(e.to_string().contains("not a PEM private key"), "{e}");
}
