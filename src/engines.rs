//! A model's engine built on its device from the serve config: the backend (the CPU's, or
//! the weights uploaded to a GPU) and the scheduler limits that fit its KV cache.

use std::path::Path;
use std::sync::Arc;

use crate::config::ServeConfig;
#[cfg(feature = "cuda")]
use crate::config::GPU_MAX_BATCH;
use crate::error::{Error, Result};
use crate::model::{Backend, CpuBackend, Device, KvCache, Llama};
use crate::scheduler::SchedulerConfig;

/// A model's engine and the scheduler limits that fit its KV cache.
pub struct EngineChoice {
    /// Starts the model's engines on the device.
    pub backend: Arc<dyn Backend>,
    /// The scheduler's limits, `num_blocks` sized to the KV cache.
    pub scheduler: SchedulerConfig,
    /// Bytes the KV cache takes on the device.
    pub kv_cache_bytes: usize,
}

impl EngineChoice {
    /// Builds the engine for `device` (the CPU weights are dropped once on the GPU; with
    /// `source`, the files they came from, a GPU engine loads them again after a device
    /// error).
    /// `shared_kv_bytes` per token are taken by caches that share its blocks (a draft
    /// model's): a cache sized from free GPU memory leaves room for them.
    pub fn build(
        device: Device,
        model: Llama,
        source: Option<&Path>,
        cfg: &ServeConfig,
        shared_kv_bytes: usize,
    ) -> Result<Self> {
        match device {
            Device::Cpu => {
                let scheduler = cfg.scheduler(model.config())?;
                let kv_cache_bytes = KvCache::bytes_per_token(model.config())
                    * scheduler.num_blocks
                    * scheduler.block_size;
                Ok(EngineChoice {
                    backend: Arc::new(CpuBackend::new(Arc::new(model))),
                    scheduler,
                    kv_cache_bytes,
                })
            }
            Device::Cuda(ordinal) => Self::cuda(ordinal, model, source, cfg, shared_kv_bytes),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        ordinal: usize,
        model: Llama,
        source: Option<&Path>,
        cfg: &ServeConfig,
        shared_kv_bytes: usize,
    ) -> Result<Self> {
        use crate::kernels::cuda::Half;
        use crate::model::gpu::{CudaBackend, CudaModel};
        let half = match cfg.model.gpu_dtype.as_str() {
            "auto" => None,
            other => Some(Half::parse(other).ok_or_else(|| {
                Error::Config(format!("gpu_dtype {other:?} is not one of auto, bf16, f16"))
            })?),
        };
        let gpu = CudaModel::load_as(&model, ordinal, half)?;
        drop(model);
        let batch = cfg.model.max_batch_size.unwrap_or(GPU_MAX_BATCH);
        let tokens = cfg.model.max_num_tokens;
        let own = gpu.kv_bytes_per_token();
        let scheduler = cfg.scheduler_with(&gpu.config, batch, own, |f| {
            gpu.kv_tokens_for(f, tokens, batch)
                .map(|n| n * own / (own + shared_kv_bytes).max(1))
        })?;
        let kv_cache_bytes = gpu.kv_bytes_per_token() * scheduler.num_blocks * scheduler.block_size;
        let dtype = gpu.weights.half.suffix();
        tracing::info!(device = %gpu.gpu.name, arch = %gpu.gpu.arch, dtype, "GPU engine");
        Ok(EngineChoice {
            backend: Arc::new(match source {
                Some(path) => CudaBackend::from_files(gpu, path),
                None => CudaBackend::new(gpu, None),
            }),
            scheduler,
            kv_cache_bytes,
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_: usize, _: Llama, _: Option<&Path>, _: &ServeConfig, _: usize) -> Result<Self> {
        Err(Error::Config(
            "this build has no GPU engine: build with `--features cuda`, or use --device cpu"
                .into(),
        ))
    }
}
