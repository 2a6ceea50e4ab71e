//! Starts one model from its serve configuration: weights and tokenizer, the draft model,
//! the engine on its device, then the actor tree. `inflight serve` starts its model so,
//! and the model repository each of its models, at start or on a load request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::ServeConfig;
use crate::engines::EngineChoice;
use crate::error::{Error, Result};
use crate::handle::{ModelHandle, ModelOptions};
use crate::model::device::Device;
use crate::model::{Backend, LoadedModel, ModelConfig};
use crate::speculative::DraftSource;
use crate::tokenizer::Tokenizer;

/// A model loaded onto its device, its actor tree not started yet.
struct Built {
    name: String,
    config: ModelConfig,
    tokenizer: Tokenizer,
    backend: Arc<dyn Backend>,
    kv_cache_bytes: usize,
    options: ModelOptions,
}

/// The model at `path` (None: the default model, fetched on first use) per `cfg`, its
/// actor tree running, served as `name` (None: its file or folder name). Loading runs on
/// a blocking thread; the caller's runtime keeps serving meanwhile.
pub async fn start(
    cfg: ServeConfig,
    path: Option<PathBuf>,
    name: Option<String>,
) -> Result<ModelHandle> {
    let built = tokio::task::spawn_blocking(move || {
        let path = match path {
            Some(p) => p,
            None => crate::fetch::default_model_path()?,
        };
        build(&cfg, &path, name)
    })
    .await
    .map_err(|e| Error::Model(format!("the model's load stopped: {e}")))??;
    ModelHandle::spawn_with_backend(
        built.name,
        built.config,
        built.tokenizer,
        built.backend,
        built.kv_cache_bytes,
        built.options,
    )
    .await
}

fn build(cfg: &ServeConfig, path: &Path, name: Option<String>) -> Result<Built> {
    let device: Device = cfg.server.device.parse()?;
    let started = std::time::Instant::now();
    tracing::info!(model = %path.display(), "loading");
    let LoadedModel {
        model,
        tokenizer,
        name: file_name,
    } = LoadedModel::load_for(path, device)?;
    let name = name.unwrap_or(file_name);
    tracing::info!(
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        mapped = matches!(device, Device::Cuda(_)),
        "weights and tokenizer read"
    );
    let config = model.config().clone();
    // The draft model goes on the target's device first, so that a KV cache sized from
    // free memory leaves room for its weights and for its own cache of the same blocks.
    let mut draft_kv_bytes = 0;
    let speculative = match &cfg.speculative {
        Some(s) => Some(s.options(|p| {
            tracing::info!(draft = %p.display(), "loading the draft model");
            let draft = crate::model::loader::load_weights(p, device)?;
            draft_kv_bytes = device.kv_bytes_per_token(draft.config());
            Ok(DraftSource::Model {
                vocab_size: draft.config().vocab_size,
                backend: device.backend(draft, Some(p))?,
            })
        })?),
        None => None,
    };
    let engine = EngineChoice::build(device, model, Some(path), cfg, draft_kv_bytes)?;
    tracing::info!(
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "engine built (weights on the device, KV cache sized)"
    );
    let options = ModelOptions {
        scheduler: engine.scheduler,
        preprocess_workers: cfg.model.preprocess_instances,
        postprocess_workers: cfg.model.postprocess_instances,
        speculative,
        device,
        pooling: cfg.model.pooling,
    };
    tracing::info!(
        model = %name,
        kv_blocks = options.scheduler.num_blocks,
        block_size = options.scheduler.block_size,
        kv_mib = engine.kv_cache_bytes >> 20,
        max_batch_size = options.scheduler.max_batch_size,
        host_kv_blocks = options.scheduler.num_host_blocks,
        "KV cache"
    );
    Ok(Built {
        name,
        config,
        tokenizer,
        backend: engine.backend,
        kv_cache_bytes: engine.kv_cache_bytes,
        options,
    })
}
