//! The GPU engine (feature `cuda`): [`CudaModel`] is a model's 16-bit weights on one device,
//! shared between engine restarts; `CudaBackend` starts a `forward::CudaForward` (a
//! 16-bit paged KV cache, a cuBLAS handle and scratch buffers) behind the same
//! [`Backend`]/[`ForwardPass`] seam as the CPU engine, so the actor pipeline is unchanged.

pub(crate) mod forward;
pub(crate) mod graphs;
mod layers;
mod layout;
pub(crate) mod profile;
pub(crate) mod qweights;
mod sample;
mod scratch;
mod swap;
pub(crate) mod tune;
pub(crate) mod upload;
pub(crate) mod weights;

use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::backend::{Backend, ForwardPass};
use super::config::ModelConfig;
use super::family::{Bias, Family, Mlp, NormKind};
use super::weights::Norm;
use super::Llama;
use crate::error::{Error, Result};
use crate::kernels::cuda::gemm::Tuning;
use crate::kernels::cuda::launch::Heads;
use crate::kernels::cuda::{Gpu, Half};
use weights::GpuWeights;

/// A model's weights on one GPU.
pub struct CudaModel {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) config: ModelConfig,
    /// The attention heads' shape and kernel choice ([`heads`]), formed once at load.
    pub(crate) heads: Heads,
    pub(crate) weights: GpuWeights,
    /// The final norm's fp32 weights on the host: embeddings norm their hidden rows there.
    pub(crate) final_norm: Norm,
    /// The linear layers' kernel choices, timed by the first engine on this model and taken
    /// by every later one (an engine restart, a second forward pass).
    pub(crate) tuning: OnceLock<Tuning>,
}

impl CudaModel {
    /// Uploads `model` to device `ordinal` (compiling the kernels on first use) in its
    /// default 16-bit type.
    pub fn load(model: &Llama, ordinal: usize) -> Result<Arc<Self>> {
        Self::load_as(model, ordinal, None)
    }

    /// As [`CudaModel::load`], in `half` when given. The default is f16 whenever every
    /// weight fits it: GGUF models (the values the CPU engine holds), and HF checkpoints,
    /// whose bf16 values f16 holds exactly (f16 has three more mantissa bits and a
    /// narrower range: below 2^-14 the lowest bits go). f16 activations carry those bits
    /// too: on a random Llama-3.2-1B against HF in fp32 the logits' error is 2.3e-3 in
    /// f16 and 1.8e-2 in bf16, at the same speed. A checkpoint with a weight beyond f16's
    /// range (65504) loads in bf16.
    pub fn load_as(model: &Llama, ordinal: usize, half: Option<Half>) -> Result<Arc<Self>> {
        let config = model.config().clone();
        let hs = heads(&config);
        hs.check()?;
        if config.arch.qk_norm && config.arch.bias != Bias::None {
            // head_rms_norm runs before the bias is added (in RoPE): no family has both.
            return Err(Error::Model(
                "the GPU engine does not run q/k norms together with q/k/v biases".into(),
            ));
        }
        if config.arch.mlp != Mlp::Gelu && config.arch.bias == Bias::All {
            // The gated activations' kernels take no bias: no family has one there.
            return Err(Error::Model(
                "the GPU engine does not run a gated MLP with biases".into(),
            ));
        }
        if config.arch.sandwich_norms && config.arch.norm == NormKind::Layer {
            // residual_add norms the outputs with an RMSNorm: no family has LayerNorms there.
            return Err(Error::Model(
                "the GPU engine does not run LayerNorms on the layers' outputs".into(),
            ));
        }
        // Gemma's activations overflow f16 (its own checkpoints are bf16): bf16 by default.
        let gemma = matches!(config.arch.family, Family::Gemma2 | Family::Gemma3);
        let half = half.or(gemma.then_some(Half::Bf16));
        let gpu = Gpu::open(ordinal)?;
        let weights = match half {
            Some(half) => GpuWeights::upload(&gpu, model, half)?,
            None => match GpuWeights::upload(&gpu, model, Half::F16) {
                Err(Error::Model(e)) if e.contains(weights::OVERFLOW) => {
                    tracing::warn!("{e}; loading the model in bf16");
                    GpuWeights::upload(&gpu, model, Half::Bf16)?
                }
                other => other?,
            },
        };
        Ok(Arc::new(CudaModel {
            gpu,
            config,
            heads: hs,
            weights,
            final_norm: model.weights().final_norm.clone(),
            tuning: OnceLock::new(),
        }))
    }

    /// Bytes one token takes in the 16-bit KV cache, all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        kv_bytes_per_token(&self.config)
    }

    /// KV cache tokens that fit in `fraction` of the free device memory, after keeping
    /// room for the activations of `max_num_tokens` tokens and `max_batch` logit rows.
    pub(crate) fn kv_tokens_for(
        &self,
        fraction: f64,
        max_num_tokens: usize,
        max_batch: usize,
    ) -> Result<usize> {
        let (free, _) = self.gpu.mem_info()?;
        let reserve = scratch::scratch_bytes(&self.config, max_num_tokens, max_batch) + (512 << 20);
        let budget = (free.saturating_sub(reserve) as f64 * fraction) as usize;
        Ok(budget / self.kv_bytes_per_token().max(1))
    }
}

pub(crate) fn kv_bytes_per_token(cfg: &ModelConfig) -> usize {
    cfg.num_layers * 2 * cfg.kv_dim() * 2
}

fn heads(cfg: &ModelConfig) -> Heads {
    let a = &cfg.arch;
    // A window the context can outgrow, or soft-capped scores: the warp-per-key kernel. A
    // window no context outgrows (check_chunks caps positions at the context) changes
    // nothing, and the tensor-core kernels, which take none, run.
    let window = a
        .sliding_window
        .is_some_and(|w| w < cfg.max_position_embeddings)
        && (0..cfg.num_layers).any(|l| a.is_local(l));
    Heads {
        heads: cfg.num_heads,
        kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        simple: window || a.attn_softcap.is_some(),
    }
}

/// Loads a model onto its device again (from its files), for [`CudaBackend::restore`].
pub(crate) type Reload = Box<dyn Fn() -> Result<Arc<CudaModel>> + Send + Sync>;

/// Starts GPU engines for one model (weights shared between restarts; each start gets a
/// fresh KV cache). After a device error it lets go of the device and loads the model
/// again ([`Backend::release`], [`Backend::restore`]), unless the error was sticky: CUDA
/// then fails every later call in the process, on any context (measured on an H100 with
/// CUDA 13: after an illegal address, a primary context reset and retained again, or a
/// context of its own destroyed and created again, still answer the error), so only a new
/// process can serve, and the release says so.
pub(crate) struct CudaBackend {
    /// None between a release and the restore.
    model: RwLock<Option<Arc<CudaModel>>>,
    /// Where the weights come from again (None: the caller gave weights, no files).
    reload: Option<Reload>,
    /// What the last release left for the restore.
    released: Mutex<Released>,
}

/// What a release leaves for the restore.
#[derive(Default)]
struct Released {
    /// The released model's linear-layer choices (same device and shapes: no timing again).
    tuning: Option<Tuning>,
    /// Its configuration, which the files loaded again must still have.
    config: Option<ModelConfig>,
}

/// How long a release waits for the failed engines to drop the model.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl CudaBackend {
    pub(crate) fn new(model: Arc<CudaModel>, reload: Option<Reload>) -> Self {
        CudaBackend {
            model: RwLock::new(Some(model)),
            reload,
            released: Mutex::new(Released::default()),
        }
    }

    /// A backend for `model`, loaded from the files at `path` (a GGUF file or a checkpoint
    /// folder), which it loads from there again, in the same 16-bit type, after a device
    /// error.
    pub(crate) fn from_files(model: Arc<CudaModel>, path: &std::path::Path) -> Self {
        let path = path.to_path_buf();
        let (ordinal, half) = (model.gpu.ctx.ordinal(), model.weights.half);
        let reload: Reload = Box::new(move || {
            let host = super::loader::load_weights(&path, super::Device::Cuda(ordinal))?;
            CudaModel::load_as(&host, ordinal, Some(half))
        });
        Self::new(model, Some(reload))
    }

    /// The model on its device.
    pub(crate) fn model(&self) -> Result<Arc<CudaModel>> {
        self.model
            .read()
            .map_err(|_| Error::Cuda("the GPU model's lock is poisoned".into()))?
            .clone()
            .ok_or_else(|| Error::Cuda("the model has let go of its device".into()))
    }
}

impl Backend for CudaBackend {
    fn start(
        &self,
        block_size: usize,
        num_blocks: usize,
        num_host_blocks: usize,
    ) -> Result<Box<dyn ForwardPass>> {
        Ok(Box::new(
            forward::CudaForward::new(self.model()?, block_size, num_blocks)?
                .with_host_cache(num_host_blocks)?,
        ))
    }

    fn samples(&self) -> bool {
        true
    }

    fn healthy(&self) -> bool {
        self.model().is_ok_and(|m| m.gpu.ctx.synchronize().is_ok())
    }

    fn release(&self) -> Result<()> {
        let poisoned = || Error::Cuda("the GPU model's lock is poisoned".into());
        let mut slot = self.model.write().map_err(|_| poisoned())?;
        let Some(model) = slot.as_ref() else {
            return Ok(());
        };
        // The failed engines drop their forward passes (and with them the model) as their
        // actors finish stopping.
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        while Arc::strong_count(model) > 1 {
            if std::time::Instant::now() > deadline {
                return Err(Error::Cuda(format!(
                    "an engine still held the model {RELEASE_WAIT:?} after it failed"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A sticky error fails every call on the context from then on.
        if let Err(e) = model.gpu.ctx.synchronize() {
            return Err(Error::Cuda(format!(
                "a sticky CUDA error ({e:?}): CUDA serves no later call in this process, \
                 so it must restart to use the device again"
            )));
        }
        if self.reload.is_none() {
            // Nothing to load it from again, and nothing wrong with what is loaded.
            return Ok(());
        }
        let mut released = self.released.lock().map_err(|_| poisoned())?;
        released.tuning = model.tuning.get().cloned();
        released.config = Some(model.config.clone());
        // The weights, streams, modules and this hold on the device's context go.
        *slot = None;
        Ok(())
    }

    fn restore(&self) -> Result<()> {
        let poisoned = || Error::Cuda("the GPU model's lock is poisoned".into());
        if self.model.read().map_err(|_| poisoned())?.is_some() {
            return Ok(());
        }
        let released = std::mem::take(&mut *self.released.lock().map_err(|_| poisoned())?);
        let reload = self.reload.as_ref().ok_or_else(|| {
            Error::Cuda(
                "the model was given to the engine as weights, not files: nothing to load it \
                 from again"
                    .into(),
            )
        })?;
        let model = reload()?;
        if let Some(config) = &released.config {
            if *config != model.config {
                return Err(Error::Cuda(
                    "the model's files changed since it was loaded: not serving other weights \
                     under its name"
                        .into(),
                ));
            }
        }
        if let Some(t) = released.tuning {
            let _ = model.tuning.set(t);
        }
        model.gpu.sync()?;
        *self.model.write().map_err(|_| poisoned())? = Some(model);
        Ok(())
    }
}
