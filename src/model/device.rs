//! Which engine serves a model: [`Device`] parses `--device` (`cpu`, `cuda`, `cuda:N`;
//! library users and tests also get it from `$INFLIGHT_DEVICE`);
//! [`EngineChoice::build`] turns a loaded model into that device's [`Backend`] and sizes
//! its KV cache (host memory for the CPU, free GPU memory for CUDA).

use std::str::FromStr;
use std::sync::Arc;

use super::backend::{Backend, CpuBackend};
use super::{KvCache, Llama};
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::scheduler::SchedulerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(Error::Config(format!(
                    "device {s:?} is not one of cpu, cuda, cuda:N"
                ))),
            },
        }
    }
}

impl Device {
    /// An engine for `model` on this device whose KV cache the caller sizes (a draft
    /// model's: its cache has the target's blocks). On a GPU the weights go there now.
    pub fn backend(self, model: Llama) -> Result<Arc<dyn Backend>> {
        match self {
            Device::Cpu => Ok(Arc::new(CpuBackend::new(Arc::new(model)))),
            Device::Cuda(ordinal) => cuda_backend(ordinal, &model),
        }
    }

    /// Bytes of KV cache per token for a model with `cfg` on this device.
    pub fn kv_bytes_per_token(self, cfg: &crate::model::ModelConfig) -> usize {
        match self {
            Device::Cpu => KvCache::bytes_per_token(cfg),
            // 16-bit K and V for every layer.
            Device::Cuda(_) => cfg.num_layers * 2 * cfg.kv_dim() * 2,
        }
    }

    /// `$INFLIGHT_DEVICE`, or the CPU when it is unset or not a device name.
    pub fn from_env() -> Self {
        std::env::var("INFLIGHT_DEVICE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(Device::Cpu)
    }
}

#[cfg(feature = "cuda")]
fn cuda_backend(ordinal: usize, model: &Llama) -> Result<Arc<dyn Backend>> {
    let gpu = super::gpu::CudaModel::load(model, ordinal)?;
    Ok(Arc::new(super::gpu::CudaBackend(gpu)))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(_: usize, _: &Llama) -> Result<Arc<dyn Backend>> {
    Err(Error::Config(
        "this build has no GPU engine: build with `--features cuda`, or use --device cpu".into(),
    ))
}

/// A model's engine and the scheduler limits that fit its KV cache.
pub struct EngineChoice {
    pub backend: Arc<dyn Backend>,
    pub scheduler: SchedulerConfig,
    pub kv_cache_bytes: usize,
}

impl EngineChoice {
    /// Builds the engine for `device` (the CPU weights are dropped once on the GPU).
    /// `shared_kv_bytes` per token are taken by caches that share its blocks (a draft
    /// model's): a cache sized from free GPU memory leaves room for them.
    pub fn build(
        device: Device,
        model: Llama,
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
            Device::Cuda(ordinal) => Self::cuda(ordinal, model, cfg, shared_kv_bytes),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        ordinal: usize,
        model: Llama,
        cfg: &ServeConfig,
        shared_kv_bytes: usize,
    ) -> Result<Self> {
        use super::gpu::{CudaBackend, CudaModel};
        use crate::kernels::cuda::Half;
        let half = match cfg.model.gpu_dtype.as_str() {
            "auto" => None,
            other => Some(Half::parse(other).ok_or_else(|| {
                Error::Config(format!("gpu_dtype {other:?} is not one of auto, bf16, f16"))
            })?),
        };
        let gpu = CudaModel::load_as(&model, ordinal, half)?;
        drop(model);
        let batch = cfg
            .model
            .max_batch_size
            .unwrap_or(crate::config::GPU_MAX_BATCH);
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
            backend: Arc::new(CudaBackend(gpu)),
            scheduler,
            kv_cache_bytes,
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_: usize, _: Llama, _: &ServeConfig, _: usize) -> Result<Self> {
        Err(Error::Config(
            "this build has no GPU engine: build with `--features cuda`, or use --device cpu"
                .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("CUDA".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
    }
}
