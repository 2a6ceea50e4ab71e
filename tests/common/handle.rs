//! Waiting on a [`ModelHandle`] driven directly through the library API.

use std::time::{Duration, Instant};

use inflight::actors::messages::SchedulerStats;
use inflight::ModelHandle;

/// Waits (up to 20 s) until nothing is queued, running or open, and returns the counts.
pub async fn wait_idle(handle: &ModelHandle) -> SchedulerStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = handle.stats().await.unwrap();
        if s.active_requests == 0 && s.running == 0 && s.waiting == 0 {
            return s;
        }
        assert!(Instant::now() < deadline, "still busy: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Serves `m` on the CPU engine with `options`; `in_engine`: the engine samples itself
/// (the device's path), otherwise the Sampler actor does.
pub async fn spawn_cpu(
    m: inflight::model::LoadedModel,
    options: inflight::ModelOptions,
    in_engine: bool,
) -> ModelHandle {
    use inflight::model::CpuBackend;
    let config = m.model.config().clone();
    let model = std::sync::Arc::new(m.model);
    let backend: std::sync::Arc<dyn inflight::model::Backend> = if in_engine {
        std::sync::Arc::new(CpuBackend::sampling_in_engine(model))
    } else {
        std::sync::Arc::new(CpuBackend::new(model))
    };
    let bytes = options.kv_cache_bytes(&config);
    ModelHandle::spawn_with_backend(m.name, config, m.tokenizer, backend, bytes, options)
        .await
        .unwrap()
}
