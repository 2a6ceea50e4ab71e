//! Starts the real server in-process on ephemeral ports, serving a tiny random model the
//! test builds itself (or the default model when a test asks for it).

use std::path::Path;
use std::time::Duration;

use inflight::http::{serve_on, AppState, ServeLimits};
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::LoadedModel;
use inflight::{ModelHandle, ModelOptions};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::scratch::Scratch;

pub struct TestServer {
    /// `http://127.0.0.1:PORT` of the inference port.
    pub base: String,
    /// `http://127.0.0.1:PORT` of the metrics port.
    pub metrics: String,
    /// `http://127.0.0.1:PORT` of the gRPC port.
    pub grpc: String,
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// A tiny checkpoint folder unique to this test, removed when dropped.
pub fn tiny_model_dir(tag: &str) -> Scratch {
    let dir = Scratch::new(&format!("http-{tag}"));
    write_tiny_checkpoint(
        &dir,
        &TinySpec {
            num_layers: 2,
            ..TinySpec::default()
        },
    )
    .unwrap();
    dir
}

/// Serves the tiny model; `tweak` adjusts the options first. Its folder is gone once the
/// model is loaded.
pub async fn start_tiny(tag: &str, tweak: impl FnOnce(&mut ModelOptions)) -> TestServer {
    let dir = tiny_model_dir(tag);
    start(&dir, tweak).await
}

/// Serves the model at `path`.
pub async fn start(path: &Path, tweak: impl FnOnce(&mut ModelOptions)) -> TestServer {
    start_limited(path, ServeLimits::default(), tweak).await
}

/// Serves the model at `path` with the listeners' `limits` (the drain takes at most 5 s).
pub async fn start_limited(
    path: &Path,
    limits: ServeLimits,
    tweak: impl FnOnce(&mut ModelOptions),
) -> TestServer {
    let model = LoadedModel::load(path).expect("model loads");
    let mut options = ModelOptions::for_model(model.model.config(), 32 * 1024);
    options.scheduler.block_size = 16;
    tweak(&mut options);
    let handle = ModelHandle::spawn(model, options)
        .await
        .expect("model starts");
    start_state(AppState::new(handle), limits).await
}

/// Serves every model of the model repository `dir` (device cpu).
pub async fn start_repository(dir: &Path) -> TestServer {
    let server = inflight::config::ServerSection {
        shutdown_timeout_s: 5,
        ..Default::default()
    };
    let models = inflight::repository::Models::open(dir, &server)
        .await
        .expect("the repository's models load");
    start_state(AppState::with_models(models), ServeLimits::default()).await
}

/// Serves `state` on ephemeral ports with the listeners' `limits` (the drain takes at
/// most 5 s).
pub async fn start_state(state: AppState, limits: ServeLimits) -> TestServer {
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", http.local_addr().unwrap());
    let metrics_base = format!("http://{}", metrics.local_addr().unwrap());
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_base = format!("http://{}", grpc.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let s = state.clone();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        let limits = ServeLimits {
            drain_timeout: Duration::from_secs(5),
            ..limits
        };
        serve_on(s, http, metrics, Some(grpc), shutdown, limits)
            .await
            .unwrap();
    });
    TestServer {
        base,
        metrics: metrics_base,
        grpc: grpc_base,
        state,
        stop: Some(stop),
        task: Some(task),
    }
}

impl TestServer {
    /// The one model the server serves.
    pub fn model(&self) -> inflight::ModelHandle {
        self.state.models().only().expect("one model serving")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// POSTs `body` as JSON to `path`: the status and the JSON answer (null if none).
    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let r = reqwest::Client::new()
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Tokens of `text` as the served model's tokenizer encodes a prompt.
    pub fn prompt_tokens(&self, text: &str) -> usize {
        self.state
            .models()
            .only()
            .unwrap()
            .tokenizer()
            .encode(text, true)
            .unwrap()
            .len()
    }

    /// POSTs a streamed `body` to `path`, takes the answer's first chunk, injects an
    /// engine fault, and reads the rest (which must end within 20 s): the first chunk's
    /// bytes and the rest's text.
    pub async fn fault_mid_stream(&self, path: &str, body: serde_json::Value) -> (Vec<u8>, String) {
        use futures::StreamExt;
        let r = reqwest::Client::new()
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut bytes = r.bytes_stream();
        let first = bytes.next().await.unwrap().unwrap().to_vec();
        self.state.models().only().unwrap().inject_engine_fault();
        let mut rest = String::new();
        let read = async {
            while let Some(b) = bytes.next().await {
                rest.push_str(&String::from_utf8_lossy(&b.unwrap()));
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), read)
            .await
            .expect("the stream ends");
        (first, rest)
    }

    /// POSTs `body` to `path` and reads an SSE answer: its `data:` payloads as JSON, which
    /// must end with `[DONE]` (left out).
    pub async fn sse(&self, path: &str, body: serde_json::Value) -> Vec<serde_json::Value> {
        let r = reqwest::Client::new()
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let text = r.text().await.unwrap();
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).expect("an event is JSON"))
            .collect()
    }

    /// The value of the first metric line of /metrics that starts with `line_start`.
    pub async fn metric(&self, line_start: &str) -> Option<f64> {
        let text = reqwest::get(format!("{}/metrics", self.metrics))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Stops like SIGTERM does and waits for the server to finish.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
