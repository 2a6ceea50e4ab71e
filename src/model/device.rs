//! Which engine serves a model: [`Device`] parses `--device` (`cpu`, `cuda`, `cuda:N`;
//! library users and tests also get it from `$INFLIGHT_DEVICE`) and builds a model's
//! [`Backend`] on it; `engines::EngineChoice` sizes its KV cache from the serve config.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use super::backend::{Backend, CpuBackend};
use super::{KvCache, Llama};
use crate::error::{Error, Result};

/// Where a model's engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The host's cores.
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
    /// model's: its cache has the target's blocks). On a GPU the weights go there now; with
    /// `source`, the files they came from, the GPU engine loads them again from there
    /// after a device error.
    pub fn backend(self, model: Llama, source: Option<&Path>) -> Result<Arc<dyn Backend>> {
        match self {
            Device::Cpu => Ok(Arc::new(CpuBackend::new(Arc::new(model)))),
            Device::Cuda(ordinal) => cuda_backend(ordinal, &model, source),
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
fn cuda_backend(ordinal: usize, model: &Llama, source: Option<&Path>) -> Result<Arc<dyn Backend>> {
    use super::gpu::{CudaBackend, CudaModel};
    let gpu = CudaModel::load(model, ordinal)?;
    Ok(Arc::new(match source {
        Some(path) => CudaBackend::from_files(gpu, path),
        None => CudaBackend::new(gpu, None),
    }))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(_: usize, _: &Llama, _: Option<&Path>) -> Result<Arc<dyn Backend>> {
    Err(Error::Config(
        "this build has no GPU engine: build with `--features cuda`, or use --device cpu".into(),
    ))
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
