//! The listeners' limits over raw sockets against the real server: idle and half-sent
//! heads are closed within `header_read_timeout`, stalled and trickled bodies get a 408
//! within `request_body_timeout`, a body past `max_request_body_bytes` a JSON 413, and a
//! connection past `max_connections` a JSON 503; descriptors come back to their baseline
//! and the server keeps serving. With `api_key`, only health and metrics answer without it.

mod common;

use std::time::{Duration, Instant};

use common::server::{start_limited, tiny_model_dir, TestServer};
use inflight::http::ServeLimits;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn server(tag: &str, limits: ServeLimits) -> TestServer {
    let dir = tiny_model_dir(tag);
    start_limited(&dir, limits, |_| {}).await
}

fn limits() -> ServeLimits {
    ServeLimits {
        header_read_timeout: Duration::from_millis(800),
        request_body_timeout: Duration::from_millis(800),
        max_request_body_bytes: 4096,
        ..ServeLimits::default()
    }
}

async fn connect(s: &TestServer) -> TcpStream {
    TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection (or `within` passes: a failure); returns
/// what it sent and when it closed.
async fn read_to_close(tcp: &mut TcpStream, within: Duration) -> (String, Duration) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.saturating_sub(t0.elapsed());
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "still open after {within:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), t0.elapsed())
}

/// The JSON body of a raw HTTP/1.1 response.
fn json_body(response: &str) -> Value {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response:?}"))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

async fn still_serves(s: &TestServer) {
    let r = reqwest::Client::new()
        .post(s.url("/v2/models/ensemble/generate"))
        .body(r#"{"text_input": "hi", "max_tokens": 2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_heads_are_closed_in_time() {
    let s = server("limits-head", limits()).await;
    still_serves(&s).await;
    let baseline = open_fds();
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(connect(&s).await);
    }
    let mut half = connect(&s).await;
    half.write_all(b"POST /v2/models/ensemble/generate HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut slowloris = connect(&s).await;
    let t0 = Instant::now();
    // A byte of header every 100 ms: the deadline counts from the head's start.
    let mut closed = false;
    for b in b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaa" {
        if slowloris.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        closed || t0.elapsed() > Duration::from_millis(800),
        "the slow head outlived the timeout"
    );
    let (_, waited) = read_to_close(&mut half, Duration::from_secs(3)).await;
    assert!(waited < Duration::from_secs(3));
    for tcp in &mut idle {
        read_to_close(tcp, Duration::from_secs(3)).await;
    }
    read_to_close(&mut slowloris, Duration::from_secs(3)).await;
    drop((idle, half, slowloris));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let now = open_fds();
    assert!(
        now <= baseline + 2,
        "descriptors {baseline} before, {now} after"
    );
    still_serves(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_trickled_and_long_bodies_are_refused_as_json() {
    let s = server("limits-body", limits()).await;
    let head = |len: usize| {
        format!(
            "POST /v2/models/ensemble/generate HTTP/1.1\r\nHost: x\r\n\
             content-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };
    // Stalled: half the body, then nothing.
    let mut tcp = connect(&s).await;
    tcp.write_all(format!("{}{{\"text_in", head(40)).as_bytes())
        .await
        .unwrap();
    let (response, waited) = read_to_close(&mut tcp, Duration::from_secs(3)).await;
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(json_body(&response)["error"]
        .as_str()
        .unwrap()
        .contains("request_body_timeout_s"));
    assert!(waited >= Duration::from_millis(700), "{waited:?}");
    // Trickled: a byte every 100 ms keeps it alive past the limit no longer.
    let mut tcp = connect(&s).await;
    tcp.write_all(head(40).as_bytes()).await.unwrap();
    let t0 = Instant::now();
    for _ in 0..40 {
        if tcp.write_all(b" ").await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if t0.elapsed() > Duration::from_millis(1500) {
            break;
        }
    }
    let (response, _) = read_to_close(&mut tcp, Duration::from_secs(3)).await;
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    // Past max_request_body_bytes: 413 as JSON, OpenAI's error object on its routes.
    let big = format!(
        r#"{{"model": "ensemble", "prompt": "{}"}}"#,
        "x".repeat(5000)
    );
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_request_body_bytes"),
        "{e}"
    );
    still_serves(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_cap_gets_a_json_503() {
    let s = server(
        "limits-conns",
        ServeLimits {
            header_read_timeout: Duration::from_secs(5),
            max_connections: 2,
            ..ServeLimits::default()
        },
    )
    .await;
    let held = [connect(&s).await, connect(&s).await];
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = connect(&s).await;
    let (response, _) = read_to_close(&mut third, Duration::from_secs(3)).await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.to_ascii_lowercase().contains("retry-after: 1"));
    assert!(json_body(&response)["error"]
        .as_str()
        .unwrap()
        .contains("max_connections 2"));
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    still_serves(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_guards_everything_but_health_and_metrics() {
    let s = server(
        "limits-key",
        ServeLimits {
            api_key: Some("s3cret".into()),
            ..ServeLimits::default()
        },
    )
    .await;
    let c = reqwest::Client::new();
    let generate = |key: Option<&str>| {
        let mut r = c
            .post(s.url("/v2/models/ensemble/generate"))
            .body(r#"{"text_input": "hi", "max_tokens": 2}"#);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let r = generate(None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let e: Value = r.json().await.unwrap();
    assert!(e["error"].as_str().unwrap().contains("API key"), "{e}");
    assert_eq!(generate(Some("s3cre")).await.unwrap().status(), 401);
    assert_eq!(generate(Some("s3cret")).await.unwrap().status(), 200);
    // OpenAI's routes: its error object, which the SDKs raise as an authentication error.
    let r = c.get(s.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "authentication_error", "{e}");
    let r = c
        .get(s.url("/v1/models"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Health and metrics stay open for probes and scrapers.
    let r = c.get(s.url("/v2/health/ready")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(format!("{}/metrics", s.metrics))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
