//! Recovery from device errors, on the CPU with an engine that meets them as the GPU's
//! does (`Error::Cuda` from its forward pass): held requests get errors, readiness goes
//! false, every backend is released then restored before the engine restarts, and the
//! model serves again; a device that cannot be restored loses the model, and the server
//! stops with an error (so `inflight serve` exits non-zero). Over HTTP, a server started
//! with fault injection takes `POST /v2/debug/fault`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::scratch::Scratch;
use futures::StreamExt;
use inflight::http::{serve_on, AppState, ServeLimits};
use inflight::model::tiny::{write_tiny_checkpoint, TinySpec};
use inflight::model::{Backend, CpuBackend, Fault, ForwardPass, LoadedModel, SeqChunk};
use inflight::{Chunk, Error, FinishReason, GenerationParams, ModelHandle, ModelOptions, Prompt};
use inflight::{Request, Result};

/// What the faulty device saw.
#[derive(Default)]
struct Device {
    released: AtomicUsize,
    restored: AtomicUsize,
    /// Restores fail (a device that cannot come back).
    broken: AtomicBool,
    /// Releases fail (a sticky error: the process cannot use the device again).
    sticky: AtomicBool,
}

/// The CPU engine, whose forward pass answers a device error once armed.
struct FaultyBackend {
    cpu: CpuBackend,
    device: Arc<Device>,
}

struct FaultyForward {
    inner: Box<dyn ForwardPass>,
    armed: bool,
}

impl ForwardPass for FaultyForward {
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        if std::mem::take(&mut self.armed) {
            return Err(Error::Cuda(
                "an illegal memory access was encountered".into(),
            ));
        }
        self.inner.forward(chunks)
    }

    fn forward_hidden(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>> {
        self.inner.forward_hidden(chunks)
    }

    fn inject_fault(&mut self, _: Fault) -> Result<()> {
        self.armed = true;
        Ok(())
    }

    fn copy_blocks(&mut self, copies: &[inflight::scheduler::BlockCopy]) -> Result<()> {
        self.inner.copy_blocks(copies)
    }
}

impl Backend for FaultyBackend {
    fn start(&self, bs: usize, blocks: usize, host: usize) -> Result<Box<dyn ForwardPass>> {
        Ok(Box::new(FaultyForward {
            inner: self.cpu.start(bs, blocks, host)?,
            armed: false,
        }))
    }

    fn release(&self) -> Result<()> {
        self.device.released.fetch_add(1, Ordering::SeqCst);
        if self.device.sticky.load(Ordering::SeqCst) {
            return Err(Error::Cuda(
                "a sticky CUDA error (CUDA_ERROR_ILLEGAL_ADDRESS)".into(),
            ));
        }
        Ok(())
    }

    fn restore(&self) -> Result<()> {
        if self.device.broken.load(Ordering::SeqCst) {
            return Err(Error::Cuda("no device: CUDA_ERROR_NO_DEVICE".into()));
        }
        self.device.restored.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn spawn(tag: &str, device: Arc<Device>) -> (ModelHandle, Scratch) {
    let dir = Scratch::new(&format!("recovery-{tag}"));
    let spec = TinySpec {
        num_layers: 2,
        ..TinySpec::default()
    };
    write_tiny_checkpoint(&dir, &spec).unwrap();
    let model = LoadedModel::load(&dir).unwrap();
    let mut options = ModelOptions::for_model(model.model.config(), 16 * 1024);
    options.scheduler.block_size = 8;
    let kv = options.kv_cache_bytes(model.model.config());
    let config = model.model.config().clone();
    let backend = Arc::new(FaultyBackend {
        cpu: CpuBackend::new(Arc::new(model.model)),
        device,
    });
    let handle =
        ModelHandle::spawn_with_backend(model.name, config, model.tokenizer, backend, kv, options)
            .await
            .unwrap();
    (handle, dir)
}

fn request(seed: u32, max_tokens: usize) -> Request {
    Request {
        id: None,
        prompts: vec![Prompt::Tokens(
            (0..6).map(|i| (seed * 31 + i * 7) % 500).collect(),
        )],
        params: GenerationParams {
            max_tokens,
            ignore_eos: true,
            ..GenerationParams::default()
        },
    }
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_error_is_recovered_from_and_the_model_serves_again() {
    let device = Arc::new(Device::default());
    let (handle, _dir) = spawn("recovered", device.clone()).await;
    for round in 0..3 {
        wait_for("ready", || handle.is_ready()).await;
        // Armed first: the tiny model runs a whole request in milliseconds.
        handle.inject_fault(Fault::IllegalAddress);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut held = Vec::new();
        for i in 0..3 {
            // Refused once the failure has made the model not ready.
            if let Ok(s) = handle.submit(request(round * 10 + i, 2000)).await {
                held.push(s);
            }
        }
        // Those in the failed step get an error; any still queued then are served after.
        let mut errors = 0;
        for s in held {
            let chunks: Vec<Chunk> = tokio::time::timeout(Duration::from_secs(10), s.collect())
                .await
                .expect("a held request ends");
            let last = chunks.last().unwrap();
            match last.finish_reason {
                Some(FinishReason::Error) => errors += 1,
                Some(FinishReason::Length) => assert_eq!(last.output_tokens, 2000),
                _ => panic!("{last:?}"),
            }
        }
        assert!(errors > 0);
        wait_for("recovered", || {
            device.restored.load(Ordering::SeqCst) == round as usize + 1
        })
        .await;
        assert_eq!(device.released.load(Ordering::SeqCst), round as usize + 1);
        wait_for("ready again", || handle.is_ready()).await;
        let chunks: Vec<Chunk> = handle.submit(request(99, 5)).await.unwrap().collect().await;
        assert_eq!(
            chunks.last().unwrap().finish_reason,
            Some(FinishReason::Length)
        );
        assert!(handle.lost().is_none());
    }
    // Three failures after serving are no crash loop: the model still serves.
    assert!(handle.is_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_cannot_be_restored_stops_the_server_with_an_error() {
    lost_stops_the_server(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_device_error_stops_the_server_without_a_restore() {
    lost_stops_the_server(true).await;
}

/// A device that cannot come back (`sticky`: its release says so; else its restore fails)
/// loses the model, and the server stops with the error.
async fn lost_stops_the_server(sticky: bool) {
    let device = Arc::new(Device::default());
    let (handle, _dir) = spawn("lost", device.clone()).await;
    let state = AppState::new(handle.clone());
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let limits = ServeLimits {
        drain_timeout: Duration::from_secs(2),
        ..ServeLimits::default()
    };
    let server = tokio::spawn(serve_on(
        state,
        http,
        metrics,
        None,
        std::future::pending(),
        limits,
    ));
    wait_for("ready", || handle.is_ready()).await;
    device.broken.store(!sticky, Ordering::SeqCst);
    device.sticky.store(sticky, Ordering::SeqCst);
    handle.inject_fault(Fault::IllegalAddress);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let running = handle.submit(request(1, 2000)).await.unwrap();
    let chunks: Vec<Chunk> = tokio::time::timeout(Duration::from_secs(10), running.collect())
        .await
        .expect("the running request ends");
    assert_eq!(
        chunks.last().unwrap().finish_reason,
        Some(FinishReason::Error)
    );
    let served = tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("the server stops by itself")
        .unwrap();
    let err = served.unwrap_err().to_string();
    let why = if sticky {
        "sticky"
    } else {
        "CUDA_ERROR_NO_DEVICE"
    };
    assert!(
        err.contains("could not be recovered") && err.contains(why),
        "{err}"
    );
    assert_eq!(device.restored.load(Ordering::SeqCst), 0);
    assert!(handle.lost().is_some());
    assert!(!handle.is_ready());
    assert_eq!(device.released.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_route_is_served_only_with_fault_injection() {
    let dir = common::server::tiny_model_dir("fault-route");
    let limits = ServeLimits {
        fault_injection: true,
        ..ServeLimits::default()
    };
    let server = common::server::start_limited(&dir, limits, |_| {}).await;
    let (status, body) = server
        .post("/v2/debug/fault", serde_json::json!({"fault": "panic"}))
        .await;
    assert_eq!(
        (status, body["fault"].as_str()),
        (200, Some("panic")),
        "{body}"
    );
    // The engine panics at its next step and restarts: a request after it is served.
    let model = server.model();
    let failed: Vec<Chunk> = model.submit(request(3, 4)).await.unwrap().collect().await;
    assert_eq!(
        failed.last().unwrap().finish_reason,
        Some(FinishReason::Error)
    );
    wait_for("ready again", || model.is_ready()).await;
    let served: Vec<Chunk> = model.submit(request(4, 4)).await.unwrap().collect().await;
    assert_eq!(
        served.last().unwrap().finish_reason,
        Some(FinishReason::Length)
    );
    for (fault, says) in [
        ("illegal_address", "runs on the CPU"),
        ("oom", "is not one of"),
    ] {
        let (status, body) = server
            .post("/v2/debug/fault", serde_json::json!({"fault": fault}))
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(body["error"].as_str().unwrap().contains(says), "{body}");
    }
    let plain = common::server::start_limited(&dir, ServeLimits::default(), |_| {}).await;
    let (status, _) = plain
        .post("/v2/debug/fault", serde_json::json!({"fault": "panic"}))
        .await;
    assert_eq!(status, 404);
}
